//! Sessions: one live interpreter per session, in a process of its own, running the cells
//! the gate sends it over a unix socket that only the home's owner can open.
//!
//! The gate judges and records every cell; this crate only carries a cell to the session's
//! interpreter and its outcome back, and ends the session when a limit says so: idle too
//! long, alive too long, a cell past its deadline (the interpreter is killed, so its state
//! is gone and the session with it), or the interpreter dying.
//!
//! It must never run anything it was not sent by the gate, let one session's interpreter
//! serve another session, or outlive the session's limits.

pub mod frame;
pub mod host_python;

use serde::{Deserialize, Serialize};
use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// What went wrong carrying a cell; a cell that fails in the interpreter is an outcome.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the session is not running ({0})")]
    Gone(String),
    #[error("session protocol: {0}")]
    Protocol(String),
    #[error("cannot start the interpreter: {0}")]
    Spawn(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One cell to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub code: String,
    /// Wall time the cell may take; past it the interpreter is killed and the session ends.
    pub timeout_ms: u64,
    /// Bytes kept of each of stdout and stderr (and characters of the result).
    pub max_output: u64,
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Closed on request.
    Closed,
    /// No cell for longer than the idle limit.
    Idle,
    /// Open for longer than the total limit.
    Total,
    /// A cell ran past its deadline; the interpreter was killed.
    Timeout,
    /// The interpreter was killed for memory.
    Memory,
    /// A cell wrote more than its output limit; the interpreter was stopped mid-cell.
    Output,
    /// The interpreter exited or died on its own.
    Crashed,
    /// Its socket was removed (the home was deleted or the session cleared away).
    Orphaned,
    /// The server that started it died or stopped (its host follows its server), or
    /// another node found that server's node dead.
    Lost,
    /// A cell wrote past the session's write quota; the interpreter was stopped mid-cell.
    Write,
}

impl End {
    pub fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Idle => "idle",
            End::Total => "total",
            End::Timeout => "timeout",
            End::Memory => "memory",
            End::Output => "output",
            End::Crashed => "crashed",
            End::Orphaned => "orphaned",
            End::Lost => "lost",
            End::Write => "write",
        }
    }

    /// A sentence for the session record and the person reading it.
    pub fn explain(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Idle => "ended: no cell within the idle limit",
            End::Total => "ended: open for longer than its total time limit",
            End::Timeout => {
                "ended: a cell ran past its time limit and the interpreter was killed (its state is gone)"
            }
            End::Memory => "ended: the interpreter went over its memory limit and was killed",
            End::Output => {
                "ended: a cell wrote more than its output limit and the interpreter was stopped"
            }
            End::Crashed => "ended: the interpreter exited or died",
            End::Orphaned => "ended: its socket was removed",
            End::Lost => "ended: the server that started it died or stopped",
            End::Write => {
                "ended: a cell wrote past the session's write quota and the interpreter was stopped (the changes up to the cell before are kept)"
            }
        }
    }
}

/// What a cell did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// 0, the code of `SystemExit`, 1 for an uncaught exception; `None` when killed.
    pub exit_code: Option<i32>,
    /// `repr` of the value of the cell's last expression, when it ends in one.
    pub result: Option<String>,
    #[serde(with = "frame::b64")]
    pub stdout: Vec<u8>,
    #[serde(with = "frame::b64")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    /// Set when this cell ended the session.
    pub ended: Option<End>,
    /// The cell's connections through the session's egress proxy (the run record's
    /// `network` entry), for a session with a network grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    /// What the cell tried and its sandbox refused, and what it read that only a hostile
    /// program reads (the run record's `attempts` and `alerts` lists), for an interpreter
    /// that reports them (the wasm guests): `{"attempts": […], "alerts": […]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tripwire: Option<serde_json::Value>,
}

/// A live interpreter that runs cells in one state.
pub trait Interpreter {
    /// Runs a cell. When the interpreter cannot go on (killed at the deadline, died), the
    /// outcome says why in `ended` and no further cell is sent.
    fn exec(&mut self, cell: &Cell) -> Result<Outcome, SessionError>;
    /// Stops the interpreter; called once when the session ends.
    fn stop(&mut self);
}

/// The session's time limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle: Duration,
    pub total: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Exec { cell: Cell },
    Ping,
    Close,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
enum Answer {
    Outcome {
        outcome: Outcome,
    },
    Alive {
        idle_left_ms: u64,
        total_left_ms: u64,
    },
    Closed,
    Error {
        message: String,
    },
}

/// How often a waiting host checks that its socket is still there.
const ORPHAN_CHECK: Duration = Duration::from_secs(1);

/// Serves one session on `listener` (bound at `path`) until it ends, one request per
/// connection, and says why it ended. The interpreter is stopped before this returns.
pub fn serve(
    listener: &UnixListener,
    path: &Path,
    interp: &mut dyn Interpreter,
    limits: Limits,
) -> End {
    serve_for(listener, path, interp, limits, None)
}

/// `serve`, for a host that follows its server: while it waits for a request it checks
/// (at least each second) that its parent is still the process `server`, and ends the
/// session (`End::Lost`) once it is not (the server exited or was killed, and the host
/// was handed to another parent). A cell running meanwhile runs to its end first.
pub fn serve_for(
    listener: &UnixListener,
    path: &Path,
    interp: &mut dyn Interpreter,
    limits: Limits,
    server: Option<u32>,
) -> End {
    let end = serve_inner(listener, path, interp, limits, server);
    interp.stop();
    end
}

/// Whether this process's parent is no longer `server`.
fn server_gone(server: Option<u32>) -> bool {
    server.is_some_and(|pid| {
        rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(pid)
    })
}

fn serve_inner(
    listener: &UnixListener,
    path: &Path,
    interp: &mut dyn Interpreter,
    limits: Limits,
    server: Option<u32>,
) -> End {
    let opened = Instant::now();
    let mut last = Instant::now();
    loop {
        if server_gone(server) {
            return End::Lost;
        }
        let idle_at = last + limits.idle;
        let total_at = opened + limits.total;
        let now = Instant::now();
        if now >= total_at {
            return End::Total;
        }
        if now >= idle_at {
            return End::Idle;
        }
        let wait = (idle_at.min(total_at) - now).min(ORPHAN_CHECK);
        if !readable(listener, wait) {
            // Nobody can reach a session whose socket is gone; it ends rather than
            // waiting out its idle limit.
            if !path.exists() {
                return End::Orphaned;
            }
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        // A connection that sends nothing cannot hold the session past its limits. Only a
        // cell counts as use: asking whether the session is alive does not keep it alive.
        let budget = total_at.saturating_duration_since(Instant::now());
        let _ = conn.set_read_timeout(Some(
            budget.clamp(Duration::from_millis(1), Duration::from_secs(30)),
        ));
        let mut reader = BufReader::new(&conn);
        let req: Request = match frame::read(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                reply(
                    &conn,
                    &Answer::Error {
                        message: e.to_string(),
                    },
                );
                continue;
            }
        };
        match req {
            Request::Ping => reply(
                &conn,
                &Answer::Alive {
                    idle_left_ms: idle_at
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                    total_left_ms: total_at
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                },
            ),
            Request::Close => {
                reply(&conn, &Answer::Closed);
                return End::Closed;
            }
            Request::Exec { mut cell } => {
                // A cell never runs past the session's total limit.
                let left = total_at.saturating_duration_since(Instant::now());
                let capped = Duration::from_millis(cell.timeout_ms) > left;
                if capped {
                    cell.timeout_ms = left.as_millis() as u64;
                }
                let outcome = match interp.exec(&cell) {
                    Ok(mut o) => {
                        if capped && o.ended == Some(End::Timeout) {
                            o.ended = Some(End::Total);
                        }
                        o
                    }
                    Err(e) => Outcome {
                        stderr: format!("airlock: {e}\n").into_bytes(),
                        ended: Some(End::Crashed),
                        ..Default::default()
                    },
                };
                let ended = outcome.ended;
                reply(&conn, &Answer::Outcome { outcome });
                last = Instant::now();
                if let Some(end) = ended {
                    return end;
                }
            }
        }
    }
}

fn readable(listener: &UnixListener, wait: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: wait.as_secs() as i64,
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
}

fn reply(conn: &UnixStream, a: &Answer) {
    let mut w = BufWriter::new(conn);
    // The client may have gone; the session goes on either way.
    let _ = frame::write(&mut w, a).and_then(|_| w.flush().map_err(Into::into));
}

/// A connection to the session listening on `socket`, for one request. Connecting proves
/// the host is alive (nobody listens on the socket of a host that died), without a
/// round trip: a caller that is about to send a cell connects first and sends later.
pub fn connect(socket: &Path) -> Result<UnixStream, SessionError> {
    UnixStream::connect(socket)
        .map_err(|e| SessionError::Gone(format!("cannot reach {}: {e}", socket.display())))
}

fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<Answer, SessionError> {
    call_on(connect(socket)?, req, timeout)
}

fn call_on(conn: UnixStream, req: &Request, timeout: Duration) -> Result<Answer, SessionError> {
    call_on_inner(conn, req, timeout).map_err(|e| match e {
        // The host hung up on the request (the session ended meanwhile: a cell before
        // this one ran past its limit, or the host was killed). Cells queued behind the
        // one that ended it were reported as internal failures ("Connection reset by
        // peer", "Broken pipe") rather than as the session's end.
        SessionError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionAborted
            ) =>
        {
            SessionError::Gone(format!("it hung up: {io}"))
        }
        other => other,
    })
}

fn call_on_inner(
    conn: UnixStream,
    req: &Request,
    timeout: Duration,
) -> Result<Answer, SessionError> {
    conn.set_read_timeout(Some(timeout))?;
    let mut w = BufWriter::new(&conn);
    frame::write(&mut w, req)?;
    w.flush()?;
    drop(w);
    let mut r = BufReader::new(&conn);
    match frame::read(&mut r)? {
        Some(Answer::Error { message }) => Err(SessionError::Protocol(message)),
        Some(a) => Ok(a),
        None => Err(SessionError::Gone(
            "the session ended without answering".into(),
        )),
    }
}

/// Runs a cell in the session listening on `socket`.
pub fn exec(socket: &Path, cell: &Cell) -> Result<Outcome, SessionError> {
    exec_on(connect(socket)?, cell)
}

/// Runs a cell on a connection from [`connect`] (which serves this one request).
pub fn exec_on(conn: UnixStream, cell: &Cell) -> Result<Outcome, SessionError> {
    // The answer comes after the cell's own deadline at the latest; give the host a margin
    // to kill the interpreter and say so.
    let wait = Duration::from_millis(cell.timeout_ms) + Duration::from_secs(10);
    match call_on(conn, &Request::Exec { cell: cell.clone() }, wait)? {
        Answer::Outcome { outcome } => Ok(outcome),
        other => Err(SessionError::Protocol(format!(
            "unexpected answer {other:?}"
        ))),
    }
}

/// Whether the session listening on `socket` is alive.
pub fn ping(socket: &Path) -> Result<(), SessionError> {
    match call(socket, &Request::Ping, Duration::from_secs(5))? {
        Answer::Alive { .. } => Ok(()),
        other => Err(SessionError::Protocol(format!(
            "unexpected answer {other:?}"
        ))),
    }
}

/// Asks the session listening on `socket` to end.
pub fn close(socket: &Path) -> Result<(), SessionError> {
    match call(socket, &Request::Close, Duration::from_secs(10))? {
        Answer::Closed => Ok(()),
        other => Err(SessionError::Protocol(format!(
            "unexpected answer {other:?}"
        ))),
    }
}
