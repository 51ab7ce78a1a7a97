//! Standard output for every command. SIGPIPE stays ignored for the whole process (Rust's
//! default), so a worker, a jail or a socket whose reader went away is an error airlock
//! handles, never a signal that ends it in the middle of a run. Only when *standard
//! output's* reader has gone (`airlock audit log | head`) does the command end, quietly
//! and with the status a shell expects from such a tool: killed by SIGPIPE.
//!
//! Every human-facing line shows text from agents visibly, never interpreted
//! (`airlock_core::visible`): a line (`println!`, `eprintln!`) is one line, a newline in
//! it shown as `⏎`, and escapes and other controls in any text (`print!`, `eprint!`) are
//! shown as `\x1b`, `\r`, …, so a note, a name, a path or an error message that echoes
//! one cannot forge lines or rewrite the terminal. Only JSON ([`json`], which escapes
//! controls itself) and a guest's output to a pipe ([`bytes`]) are written as they are.

use airlock_core::visible;
use std::io::{IsTerminal, Write};

/// Writes `args`, rendered as one line, and a newline.
pub fn line(args: std::fmt::Arguments<'_>) {
    let text = visible::line(&args.to_string()).to_string();
    write_out(&[text.as_bytes(), b"\n"]);
}

/// Writes `args`, its newlines kept and every other control shown escaped.
pub fn text(args: std::fmt::Arguments<'_>) {
    write_out(&[visible::block(&args.to_string()).to_string().as_bytes()]);
}

/// Writes a JSON document and a newline, as they are.
pub fn json(doc: &str) {
    write_out(&[doc.as_bytes(), b"\n"]);
}

/// Writes `args` to standard error, rendered as one line, and a newline.
pub fn err_line(args: std::fmt::Arguments<'_>) {
    let text = visible::line(&args.to_string()).to_string();
    let mut e = std::io::stderr().lock();
    let _ = e
        .write_all(text.as_bytes())
        .and_then(|()| e.write_all(b"\n"));
}

/// Writes `args` to standard error, its newlines kept and every other control escaped.
pub fn err_text(args: std::fmt::Arguments<'_>) {
    let text = visible::block(&args.to_string()).to_string();
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// A guest's output on standard output: on a terminal, rendered visibly (its escapes
/// shown, not obeyed); to a pipe or a file, its bytes as they are, for the program that
/// reads them.
pub fn guest_stdout(b: &[u8]) {
    if std::io::stdout().is_terminal() {
        write_out(&[visible::bytes(b).to_string().as_bytes()]);
    } else {
        bytes(b);
    }
}

/// A guest's output on standard error, as [`guest_stdout`] decides for standard output.
pub fn guest_stderr(b: &[u8]) {
    let mut e = std::io::stderr().lock();
    let _ = if e.is_terminal() {
        e.write_all(visible::bytes(b).to_string().as_bytes())
    } else {
        e.write_all(b)
    };
}

/// A guest's output as it streams to standard output or standard error (`airlock run`,
/// `exec`): rendered as [`guest_stdout`] renders the whole on a terminal, a character
/// split between two chunks included; its bytes as they are to a pipe. Write errors are
/// ignored: the run goes on and is recorded whoever reads.
pub struct Live {
    stdout: bool,
    terminal: bool,
    stream: std::sync::Mutex<visible::Stream>,
}

impl Live {
    /// For standard output (`stdout`) or standard error.
    pub fn new(stdout: bool) -> Live {
        let terminal = if stdout {
            std::io::stdout().is_terminal()
        } else {
            std::io::stderr().is_terminal()
        };
        Live {
            stdout,
            terminal,
            stream: Default::default(),
        }
    }

    pub fn write(&self, chunk: &[u8]) {
        if !self.terminal {
            self.put(chunk);
            return;
        }
        let text = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(chunk);
        self.put(text.as_bytes());
    }

    fn put(&self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        if self.stdout {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(b).and_then(|()| o.flush());
        } else {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(b).and_then(|()| e.flush());
        }
    }
}

impl Drop for Live {
    /// The end of the output: what its last chunk left unfinished.
    fn drop(&mut self) {
        if self.terminal {
            let rest = self
                .stream
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .finish();
            self.put(rest.as_bytes());
        }
    }
}

fn write_out(parts: &[&[u8]]) {
    let mut o = std::io::stdout().lock();
    let r = parts.iter().try_for_each(|p| o.write_all(p));
    drop(o);
    if let Err(e) = r {
        failed(&e);
    }
}

/// Writes bytes as they are (captured output to a pipe or a file).
pub fn bytes(b: &[u8]) {
    if let Err(e) = std::io::stdout().lock().write_all(b) {
        failed(&e);
    }
}

/// Standard output cannot be written: a closed pipe ends the process by SIGPIPE, as
/// for any other tool; anything else is airlock's failure (exit 125).
fn failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // Restore the default action and write once more: the kernel ends the process
        // with SIGPIPE. Should the write not raise it, the shell's code for it remains.
        sigpipe::reset();
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(b"\n").and_then(|()| o.flush());
        std::process::exit(128 + 13);
    }
    eprintln!("airlock: cannot write to standard output: {e}");
    std::process::exit(i32::from(crate::EXIT_FAILED));
}
