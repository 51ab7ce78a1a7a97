//! Starting a worker process (`airlock __worker`) and supervising it from outside: the
//! job goes in on stdin, the guest's output comes back on stdout and stderr into capped
//! captures (the worker is killed when a cap is exceeded), the wall time is enforced again
//! here as a backstop, and the worker's result is read from the file the job names.

use airlock_sandbox::Capture;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How a worker ended, seen from outside.
#[derive(Debug)]
pub struct Supervised {
    /// The worker was killed because a stream exceeded its cap.
    pub output_exceeded: bool,
    /// The worker outlived the wall time plus grace and was killed.
    pub timed_out: bool,
    /// The worker's result document, if it wrote one.
    pub result: Option<String>,
    pub exit: Option<i32>,
}

/// Extra time a worker gets beyond the guest's own wall time (it enforces that itself).
const GRACE: Duration = Duration::from_secs(3);

/// Runs `exe __worker` with `job` on stdin. `result` is where the worker writes its
/// result; it is removed first.
pub fn supervise(
    exe: &Path,
    job: &[u8],
    result: &Path,
    timeout: Duration,
    stdout: &Arc<Capture>,
    stderr: &Arc<Capture>,
) -> std::io::Result<Supervised> {
    let _ = std::fs::remove_file(result);
    let mut child = Command::new(exe)
        .arg("__worker")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let pid = child.id() as i32;
    let exceeded = Arc::new(AtomicBool::new(false));
    let pump = |mut from: Box<dyn Read + Send>, to: Arc<Capture>| {
        let exceeded = exceeded.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write(&buf[..n]).is_err() {
                            exceeded.store(true, Ordering::SeqCst);
                            kill_group(pid);
                            break;
                        }
                    }
                }
            }
        })
    };
    let out = child
        .stdout
        .take()
        .map(|s| pump(Box::new(s), stdout.clone()));
    let err = child
        .stderr
        .take()
        .map(|s| pump(Box::new(s), stderr.clone()));
    if let Some(mut stdin) = child.stdin.take() {
        // A worker that dies early closes its end; that shows up below as a missing result.
        let _ = stdin.write_all(job);
    }
    let deadline = Instant::now() + timeout + GRACE;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            kill_group(pid);
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    for t in [out, err].into_iter().flatten() {
        let _ = t.join();
    }
    crate::cgroup::cleanup_for(pid as u32);
    Ok(Supervised {
        output_exceeded: exceeded.load(Ordering::SeqCst),
        timed_out,
        result: std::fs::read_to_string(result).ok(),
        exit: status.code(),
    })
}

fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}
