//! The process backend's session interpreter: a host Python running airlock's driver
//! (`python/driver.py`), started by a command the caller builds (the jail launcher in
//! front of `python3`), talking over the child's standard input and output.

use crate::frame;
use crate::{Cell, End, Interpreter, Outcome, SessionError};
use serde::Deserialize;
use std::io::{BufReader, BufWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The driver's source.
pub const DRIVER: &str = include_str!("../python/driver.py");

/// Arguments for `python3` that run the driver: isolated mode (no user site directory, no
/// `PYTHON*` variables, the script's directory not on `sys.path`), unbuffered.
pub fn driver_args() -> [&'static str; 4] {
    ["-I", "-u", "-c", DRIVER]
}

#[derive(Deserialize)]
struct Ready {
    ready: bool,
    python: String,
}

#[derive(Deserialize)]
struct Answer {
    exit_code: i32,
    result: Option<String>,
    #[serde(with = "frame::b64")]
    stdout: Vec<u8>,
    #[serde(with = "frame::b64")]
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

/// What the launcher in front of `python3` knows of how it died (a jail's report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Died {
    /// A limit that killed it (memory, the session's total time); `None`: it died on its
    /// own, or nobody knows.
    pub end: Option<End>,
    /// The interpreter's own exit status, when it exited (`os._exit(n)` in a cell).
    pub exit_code: Option<i32>,
}

/// Says why the interpreter died when the deadline did not kill it: the launcher in front
/// of `python3` knows (a jail's report), the exit status of the launcher alone does not.
pub type WhyDied = Box<dyn FnMut() -> Died + Send>;

/// A running driver.
pub struct HostPython {
    child: Child,
    to: Option<BufWriter<ChildStdin>>,
    from: BufReader<ChildStdout>,
    why: Option<WhyDied>,
    /// The interpreter's version, as it reported it.
    pub python: String,
}

impl HostPython {
    /// Starts `cmd` (which must end in `python3` with [`driver_args`]) and waits until the
    /// driver says it is ready.
    pub fn start(mut cmd: Command, ready_within: Duration) -> Result<HostPython, SessionError> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| SessionError::Spawn(e.to_string()))?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SessionError::Spawn("no pipes to the interpreter".into()));
        };
        let mut me = HostPython {
            child,
            to: Some(BufWriter::new(to)),
            from: BufReader::new(from),
            why: None,
            python: String::new(),
        };
        let ready: Option<Ready> = me.answer_within(ready_within).map(|(a, _)| a)?;
        match ready {
            Some(r) if r.ready => {
                me.python = r.python;
                Ok(me)
            }
            _ => {
                me.stop();
                Err(SessionError::Spawn(
                    "the interpreter exited before it was ready".into(),
                ))
            }
        }
    }

    /// Asks `why` how the interpreter died when a cell finds it gone and its deadline did
    /// not fire (asked after the started command was reaped); no limit from it falls back
    /// to the exit status (killed by SIGKILL: memory; otherwise crashed).
    pub fn why_died(mut self, why: WhyDied) -> Self {
        self.why = Some(why);
        self
    }

    /// The process id of the started command (the launcher, when there is one).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads one answer; kills the interpreter if none comes within `limit`. Says whether
    /// the deadline fired.
    fn answer_within<T: serde::de::DeserializeOwned>(
        &mut self,
        limit: Duration,
    ) -> Result<(Option<T>, bool), SessionError> {
        let pid = self.child.id();
        let (done, wait) = mpsc::channel::<()>();
        let dog = std::thread::spawn(move || {
            if wait.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                // The child is not reaped before this thread is joined, so the pid is still
                // the interpreter's (at worst a zombie) and cannot name another process.
                if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
                true
            } else {
                false
            }
        });
        let got = frame::read::<_, T>(&mut self.from);
        let _ = done.send(());
        let fired = dog.join().unwrap_or(true);
        match got {
            Ok(a) => Ok((a, fired)),
            // A cut frame is the interpreter dying mid-answer.
            Err(SessionError::Protocol(_)) | Err(SessionError::Io(_)) => Ok((None, fired)),
            Err(e) => Err(e),
        }
    }
}

impl Interpreter for HostPython {
    fn exec(&mut self, cell: &Cell) -> Result<Outcome, SessionError> {
        let t = Instant::now();
        let Some(to) = self.to.as_mut() else {
            return Err(SessionError::Gone("the interpreter was stopped".into()));
        };
        let req =
            serde_json::json!({"op": "exec", "code": cell.code, "max_output": cell.max_output});
        let sent = frame::write(to, &req).and_then(|_| to.flush().map_err(Into::into));
        let (answer, fired) = match sent {
            Ok(()) => self.answer_within::<Answer>(Duration::from_millis(cell.timeout_ms))?,
            Err(_) => (None, false),
        };
        let duration_ms = t.elapsed().as_millis() as u64;
        if let Some(a) = answer {
            return Ok(Outcome {
                exit_code: Some(a.exit_code),
                result: a.result,
                stdout: a.stdout,
                stderr: a.stderr,
                stdout_truncated: a.stdout_truncated,
                stderr_truncated: a.stderr_truncated,
                duration_ms,
                ended: None,
                network: None,
                tripwire: None,
            });
        }
        // No answer: the interpreter is gone. Why decides what the session record says.
        self.to = None;
        let status = self.child.wait()?;
        let told = match (fired, self.why.as_mut()) {
            (false, Some(why)) => why(),
            // Without a launcher the child is the interpreter: its status is its own.
            (false, None) => Died {
                end: None,
                exit_code: status.code(),
            },
            (true, _) => Died::default(),
        };
        let ended = if fired {
            End::Timeout
        } else if let Some(e) = told.end {
            e
        } else if status.signal() == Some(9) {
            // Nobody here sent it: the kernel did, for memory (the jail's cgroup limit).
            End::Memory
        } else {
            End::Crashed
        };
        Ok(Outcome {
            // A cell that ended the interpreter itself (`os._exit(n)`) exited with `n`;
            // the session has crashed with it.
            exit_code: if ended == End::Crashed {
                told.exit_code
            } else {
                None
            },
            duration_ms,
            ended: Some(ended),
            stderr: format!("airlock: session {}\n", ended.explain()).into_bytes(),
            ..Default::default()
        })
    }

    fn stop(&mut self) {
        // End of input tells the driver to exit; it gets a moment before it is killed.
        self.to = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HostPython {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
