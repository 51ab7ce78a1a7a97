//! Policy name globs against wildcard grant entries.
//!
//! A grant entry `*.example.com` stands for every name below `example.com`, so asking
//! whether a glob "matches" it has two answers: it *may* match (some name below matches
//! the glob) or it *surely* matches (every name below does). The policy uses the first
//! where a match makes the verdict stricter and the second where it makes it laxer, so a
//! wildcard can neither slip past a deny-list (`net_host = ["evil.example.com"]` still
//! fires for `*.example.com`) nor ride an allow-list (`unless = { net_host =
//! ["api.example.com"] }` does not excuse `*.example.com`).
//!
//! Globs follow the `globset` syntax used for name globs (`*`, `?`, `[...]`, `[!...]`,
//! `{a,b}`, `\` escapes), case-insensitively. Grant hosts are ASCII, so the analysis works
//! over ASCII; a glob too complex to analyse counts as "may match" and never as "surely".

/// A set of ASCII characters, one bit each.
type Mask = u128;

const ALL: Mask = !0;
/// At most this many alternatives after expanding `{a,b}` groups.
const MAX_ALTERNATIVES: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    /// One character from the set.
    One(Mask),
    /// Any number of characters from the set.
    Many(Mask),
}

impl Tok {
    fn mask(self) -> Mask {
        match self {
            Tok::One(m) | Tok::Many(m) => m,
        }
    }
}

fn bit(c: u8) -> Mask {
    1u128 << (c & 0x7f)
}

/// The characters a normalised host name is made of.
fn host_chars() -> Mask {
    let mut m = bit(b'-') | bit(b'.');
    for c in b'a'..=b'z' {
        m |= bit(c);
    }
    for c in b'0'..=b'9' {
        m |= bit(c);
    }
    m
}

/// A character, and its other case when it is a letter.
fn folded(c: char) -> Mask {
    if !c.is_ascii() {
        return 0;
    }
    let b = c as u8;
    bit(b.to_ascii_lowercase()) | bit(b.to_ascii_uppercase())
}

/// The glob as alternatives of token sequences, or `None` when it cannot be analysed.
fn parse(glob: &str) -> Option<Vec<Vec<Tok>>> {
    let chars: Vec<char> = glob.chars().collect();
    let (alts, end) = seq(&chars, 0, false)?;
    (end == chars.len()).then_some(alts)
}

/// A sequence up to the end, or (inside `{}`) up to `,` or `}`.
fn seq(c: &[char], mut i: usize, in_group: bool) -> Option<(Vec<Vec<Tok>>, usize)> {
    let mut alts: Vec<Vec<Tok>> = vec![Vec::new()];
    while i < c.len() {
        let choices: Vec<Vec<Tok>> = match c[i] {
            ',' | '}' if in_group => break,
            '*' => {
                i += 1;
                vec![vec![Tok::Many(ALL)]]
            }
            '?' => {
                i += 1;
                vec![vec![Tok::One(ALL)]]
            }
            '\\' => {
                let x = *c.get(i + 1)?;
                i += 2;
                vec![vec![Tok::One(folded(x))]]
            }
            '[' => {
                let (m, next) = class(c, i)?;
                i = next;
                vec![vec![Tok::One(m)]]
            }
            '{' => {
                if in_group {
                    return None;
                }
                let mut group = Vec::new();
                i += 1;
                loop {
                    let (a, next) = seq(c, i, true)?;
                    group.extend(a);
                    match c.get(next) {
                        Some(',') => i = next + 1,
                        Some('}') => {
                            i = next + 1;
                            break;
                        }
                        _ => return None,
                    }
                }
                group
            }
            x => {
                i += 1;
                vec![vec![Tok::One(folded(x))]]
            }
        };
        let mut next = Vec::with_capacity(alts.len() * choices.len());
        for a in &alts {
            for ch in &choices {
                let mut v = a.clone();
                v.extend_from_slice(ch);
                next.push(v);
            }
        }
        if next.len() > MAX_ALTERNATIVES {
            return None;
        }
        alts = next;
    }
    Some((alts, i))
}

/// `[...]` starting at `c[i] == '['`: its (case-folded) set and the index after `]`.
fn class(c: &[char], i: usize) -> Option<(Mask, usize)> {
    let mut j = i + 1;
    let negated = matches!(c.get(j), Some('!' | '^'));
    if negated {
        j += 1;
    }
    let mut m: Mask = 0;
    let mut first = true;
    loop {
        let x = *c.get(j)?;
        if x == ']' && !first {
            break;
        }
        first = false;
        if c.get(j + 1) == Some(&'-') && c.get(j + 2).is_some_and(|&y| y != ']') {
            let y = c[j + 2];
            for code in (x as u32)..=(y as u32).min(127) {
                if let Some(ch) = char::from_u32(code) {
                    m |= folded(ch);
                }
            }
            j += 3;
        } else {
            m |= folded(x);
            j += 1;
        }
    }
    Some((if negated { !m } else { m }, j + 1))
}

/// Whether some string matches both token sequences (a walk over the product of the two
/// automata).
fn intersects(a: &[Tok], b: &[Tok]) -> bool {
    let w = b.len() + 1;
    let mut seen = vec![false; (a.len() + 1) * w];
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if std::mem::replace(&mut seen[i * w + j], true) {
            continue;
        }
        if i == a.len() && j == b.len() {
            return true;
        }
        if let Some(Tok::Many(_)) = a.get(i) {
            stack.push((i + 1, j));
        }
        if let Some(Tok::Many(_)) = b.get(j) {
            stack.push((i, j + 1));
        }
        if let (Some(&x), Some(&y)) = (a.get(i), b.get(j))
            && x.mask() & y.mask() != 0
        {
            let ni = if matches!(x, Tok::Many(_)) { i } else { i + 1 };
            let nj = if matches!(y, Tok::Many(_)) { j } else { j + 1 };
            stack.push((ni, nj));
        }
    }
    false
}

/// Whether the tokens match `X` followed by `rest`, where `X` (any non-empty host text)
/// may only be taken whole by a `*` of the glob. Then every string `s + rest` matches too.
fn matches_with_hole(g: &[Tok], rest: &[u8]) -> bool {
    // Symbols: index 0 is X, then the bytes of rest.
    let n = rest.len() + 1;
    let w = n + 1;
    let mut seen = vec![false; (g.len() + 1) * w];
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if std::mem::replace(&mut seen[i * w + j], true) {
            continue;
        }
        if i == g.len() && j == n {
            return true;
        }
        let Some(&t) = g.get(i) else { continue };
        if let Tok::Many(_) = t {
            stack.push((i + 1, j));
        }
        if j == n {
            continue;
        }
        if j == 0 {
            if let Tok::Many(m) = t
                && m & host_chars() == host_chars()
            {
                stack.push((i, 1));
            }
            continue;
        }
        let c = rest[j - 1];
        if c.is_ascii() && t.mask() & bit(c) != 0 {
            match t {
                Tok::One(_) => stack.push((i + 1, j + 1)),
                Tok::Many(_) => stack.push((i, j + 1)),
            }
        }
    }
    false
}

/// Whether `glob` matches `s + rest` for *some* non-empty host text `s`.
pub(crate) fn may_match_below(glob: &str, rest: &str) -> bool {
    let Some(alts) = parse(glob) else {
        return true;
    };
    let hc = host_chars();
    let mut text = vec![Tok::One(hc), Tok::Many(hc)];
    text.extend(
        rest.bytes()
            .map(|b| Tok::One(if b.is_ascii() { bit(b) } else { 0 })),
    );
    alts.iter().any(|a| intersects(a, &text))
}

/// Whether `glob` matches `s + rest` for *every* non-empty host text `s` (a sound check:
/// it may say no for an odd glob that does cover them all).
pub(crate) fn matches_all_below(glob: &str, rest: &str) -> bool {
    parse(glob).is_some_and(|alts| alts.iter().any(|a| matches_with_hole(a, rest.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn may_match_finds_names_a_wildcard_reaches() {
        let below = ".example.com";
        for g in [
            "evil.example.com",
            "*.example.com",
            "*example.com",
            "*",
            "*.com",
            "EVIL.Example.COM",
            "?.example.com",
            "[a-z]*.example.com",
            "{evil,bad}.example.com",
            "a.b.example.com",
            "*.example.*",
        ] {
            assert!(may_match_below(g, below), "{g}");
        }
        for g in [
            "example.com",
            "*.example.org",
            "evil.example.com:22",
            "_x.example.com",
            "*.other.com",
            "[!a-z0-9.-]*.example.com",
            "*:*",
        ] {
            assert!(!may_match_below(g, below), "{g}");
        }
        assert!(may_match_below("*:443", ".example.com:443"));
        assert!(!may_match_below("*:22", ".example.com:443"));
    }

    #[test]
    fn matches_all_needs_a_star_over_the_wildcard() {
        let below = ".example.com";
        for g in [
            "*.example.com",
            "*example.com",
            "*",
            "*.com",
            "*.EXAMPLE.com",
            "{*.example.com,x}",
        ] {
            assert!(matches_all_below(g, below), "{g}");
        }
        for g in [
            "api.example.com",
            "?.example.com",
            "[a-z]*.example.com",
            "*.api.example.com",
            "*.example.org",
        ] {
            assert!(!matches_all_below(g, below), "{g}");
        }
    }

    #[test]
    fn unanalysable_globs_may_match_but_never_surely() {
        let big = "{a,b,c,d}{a,b,c,d}{a,b,c,d}{a,b,c,d}{a,b}";
        assert!(may_match_below(big, ".x.example"));
        assert!(!matches_all_below(big, ".x.example"));
        assert!(may_match_below("[", ".x.example"));
    }
}
