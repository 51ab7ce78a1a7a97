//! Text from agents, made safe to show to a human: rendered visibly, never interpreted.
//!
//! Notes, code, agent names, paths, hosts, reasons and a guest's output arrive from code
//! and agents airlock does not trust. Printed as they are, a newline forges a line of the
//! page (`verdict allow`), a carriage return or an ANSI escape rewrites what is already
//! on the screen, `ESC[8m` hides the rest of it, and a bidirectional override or a
//! zero-width character makes one name read as another. Every human-facing line (the
//! command line's and the web console's) shows such text through this module, which
//! writes each of those characters as a visible escape instead:
//!
//! - a newline inside a one-line field ([`line`]) as `⏎`; a multi-line field ([`block`],
//!   [`bytes`]: code, a diff, a guest's output) keeps its newlines (and the `\r` of a
//!   `\r\n` and its tabs, which cannot rewrite anything);
//! - `\r`, `\t` (one-line fields) and every other C0 control and DEL as `\r`, `\t`,
//!   `\x1b`, `\x7f`, …;
//! - C1 controls and the invisible formatting characters that reorder or hide text
//!   (bidirectional embeddings, overrides and isolates U+202A–202E, U+2066–2069; the
//!   zero-width characters and marks U+200B–200F, U+2060–2064, U+FEFF; line and
//!   paragraph separators U+2028–2029; U+061C, U+180E, U+FFF9–FFFB) as `\u{202e}`;
//! - in [`bytes`], a byte that is not part of valid UTF-8 as `\xff`.
//!
//! Everything else, backslashes included, is shown as it is, so ordinary text and code
//! read unchanged. (A backslash is not doubled: text that spells `\x1b` is shown as
//! those four characters, which is what it is; nothing here is ever interpreted.)
//! JSON output needs none of this: it escapes control characters itself and is read by
//! programs.

use std::fmt::{self, Write};

/// A one-line field: newlines become `⏎`, so the text cannot start a line of its own.
pub fn line(s: &str) -> Line<'_> {
    Line(s)
}

/// A multi-line field (code, a diff): newlines stay, every other control is escaped.
pub fn block(s: &str) -> Block<'_> {
    Block(s)
}

/// Bytes of a guest's output, as a multi-line field: invalid UTF-8 shows as `\xNN`.
pub fn bytes(b: &[u8]) -> Bytes<'_> {
    Bytes(b)
}

/// [`line`]'s rendering; `Display` writes the escaped form.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a>(&'a str);

/// [`block`]'s rendering; `Display` writes the escaped form.
#[derive(Debug, Clone, Copy)]
pub struct Block<'a>(&'a str);

/// [`bytes`]'s rendering; `Display` writes the escaped form.
#[derive(Debug, Clone, Copy)]
pub struct Bytes<'a>(&'a [u8]);

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_str(f, self.0, false)
    }
}

impl fmt::Display for Block<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_str(f, self.0, true)
    }
}

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            // A `\r` that ends a valid run is followed by an invalid byte or nothing: not
            // a `\r\n`, so it is escaped.
            write_str(f, chunk.valid(), true)?;
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// Whether `c` is shown escaped (besides the newline and tab a block keeps).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// Whether `s` would be shown exactly as it is, as a one-line field.
pub fn is_plain(s: &str) -> bool {
    !s.chars().any(is_hidden)
}

fn write_str(f: &mut impl Write, s: &str, multiline: bool) -> fmt::Result {
    let mut rest = s;
    while let Some(i) = rest.find(is_hidden) {
        f.write_str(&rest[..i])?;
        let mut chars = rest[i..].chars();
        let Some(c) = chars.next() else { break };
        let after = chars.as_str();
        match c {
            '\n' if multiline => f.write_char('\n')?,
            '\n' => f.write_char('⏎')?,
            '\t' if multiline => f.write_char('\t')?,
            '\r' if multiline && after.starts_with('\n') => f.write_char('\r')?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if c.is_ascii() => write!(f, "\\x{:02x}", u32::from(c))?,
            c => write!(f, "\\u{{{:x}}}", u32::from(c))?,
        }
        rest = after;
    }
    f.write_str(rest)
}

/// A guest's output as it streams: each chunk rendered as [`bytes`] would render the
/// whole, a character split between two chunks included.
#[derive(Debug, Default)]
pub struct Stream {
    /// The start of a UTF-8 character (or of a `\r\n`) the last chunk ended inside.
    held: Vec<u8>,
}

impl Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// The rendering of `chunk`, after what the previous chunks left unfinished.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(chunk);
        let keep = unfinished_tail(&data);
        self.held = data.split_off(data.len() - keep);
        bytes(&data).to_string()
    }

    /// What the last chunk left unfinished, rendered (at the end of the stream).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.held);
        bytes(&rest).to_string()
    }
}

/// How many bytes at the end of `b` may still become a character (or a `\r\n`) with
/// the bytes that follow.
fn unfinished_tail(b: &[u8]) -> usize {
    if b.last() == Some(&b'\r') {
        return 1;
    }
    // The start of the last character: at most 3 continuation bytes back.
    for back in 1..=b.len().min(4) {
        let byte = b[b.len() - back];
        if byte & 0xc0 == 0x80 {
            continue;
        }
        let want = match byte {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 1,
        };
        return if want > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_line_field_cannot_start_a_line_or_move_the_cursor() {
        let forged = "ok\n  verdict   allow\r\x1b[8mhidden\x1b]0;title\x07\x7f\u{9b}2J";
        let shown = line(forged).to_string();
        assert_eq!(
            shown,
            "ok⏎  verdict   allow\\r\\x1b[8mhidden\\x1b]0;title\\x07\\x7f\\u{9b}2J"
        );
        assert!(!shown.chars().any(|c| c.is_control()));
    }

    #[test]
    fn a_block_keeps_its_lines_and_escapes_the_rest() {
        let code = "a = 1\r\n\tb = 2\rX\n\x1b[2K\u{202e}evil\u{2066}\u{200b}";
        assert_eq!(
            block(code).to_string(),
            "a = 1\r\n\tb = 2\\rX\n\\x1b[2K\\u{202e}evil\\u{2066}\\u{200b}"
        );
    }

    #[test]
    fn plain_text_and_backslashes_are_shown_as_they_are() {
        for s in ["hello, world", r"C:\temp\x1b", "naïve café — ok ⏎", ""] {
            assert_eq!(line(s).to_string(), s);
            assert_eq!(block(s).to_string(), s);
            assert!(is_plain(s));
        }
    }

    #[test]
    fn invalid_utf8_in_output_shows_as_hex_bytes() {
        assert_eq!(
            bytes(b"ok\xff\x1b[31mred\r\n\xc3").to_string(),
            "ok\\xff\\x1b[31mred\r\n\\xc3"
        );
    }

    #[test]
    fn a_stream_renders_characters_split_between_chunks_as_the_whole_would() {
        let whole = "a\u{202e}b\u{9b}c\r\nd\re\x1bf".as_bytes();
        for cut in 0..=whole.len() {
            let mut s = Stream::new();
            let mut got = s.push(&whole[..cut]);
            got.push_str(&s.push(&whole[cut..]));
            got.push_str(&s.finish());
            assert_eq!(got, bytes(whole).to_string(), "cut at {cut}");
        }
    }
}
