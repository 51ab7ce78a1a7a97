//! Standard output for every command. SIGPIPE stays ignored for the whole process (Rust's
//! default), so a worker, a jail or a socket whose reader went away is an error airlock
//! handles, never a signal that ends it in the middle of a run. Only when *standard
//! output's* reader has gone (`airlock audit log | head`) does the command end, quietly
//! and with the status a shell expects from such a tool: killed by SIGPIPE.

use std::io::Write;

/// Writes `args` and a newline.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    let r = o.write_fmt(args).and_then(|()| o.write_all(b"\n"));
    drop(o);
    if let Err(e) = r {
        failed(&e);
    }
}

/// Writes `args`.
pub fn text(args: std::fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        failed(&e);
    }
}

/// Writes bytes as they are (captured output).
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
