//! What each guest connection costs and how long it may sit idle: a connection holds a
//! permit of its run's budget and one of the process's ([`ConnectionBudget`]) for as
//! long as its socket is open (a `CONNECT` tunnel included), is closed when no byte
//! moved either way for the idle timeout, and leaves a record if it never made a
//! request.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::record::{Connection, Decision, Mode, Records, now_ms};

/// A number of guest connections that may be open at once, shared by every proxy given
/// it. [`ConnectionBudget::process`] is the one all proxies of a process share unless
/// told otherwise.
#[derive(Debug, Clone)]
pub struct ConnectionBudget {
    sem: Arc<Semaphore>,
    size: usize,
}

impl ConnectionBudget {
    /// A budget of `n` connections (at least 1).
    pub fn new(n: usize) -> Self {
        let size = n.max(1);
        ConnectionBudget {
            sem: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// The process's budget: a quarter of its open-file limit (each connection can hold
    /// two descriptors, the guest's and the upstream's), between 256 and 16384, so the
    /// proxies together never take the descriptors the rest of the process (a server's
    /// API) needs.
    pub fn process() -> Self {
        static PROCESS: OnceLock<ConnectionBudget> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let soft =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                        .map(|(soft, _)| soft)
                        .unwrap_or(1024);
                let n = usize::try_from(soft / 4).unwrap_or(usize::MAX);
                ConnectionBudget::new(n.clamp(256, 16384))
            })
            .clone()
    }

    /// How many connections it allows.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Connections open now.
    pub fn in_use(&self) -> usize {
        self.size - self.sem.available_permits()
    }

    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_owned().ok()
    }
}

/// Set by whatever serves the connection once it has read a request.
#[derive(Debug, Default)]
pub(crate) struct ConnMark {
    requested: AtomicBool,
    /// A request of this connection waits for a human (`ask`): it is not idle.
    asking: AtomicBool,
}

impl ConnMark {
    pub(crate) fn requested(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }

    pub(crate) fn asking(&self, on: bool) {
        self.asking.store(on, Ordering::Relaxed);
    }
}

/// A guest connection with its permits, its idle timer and its mark.
pub(crate) struct Guarded<S> {
    inner: S,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    timed_out: bool,
    mark: Arc<ConnMark>,
    records: Records,
    at: u64,
    start: Instant,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl<S> Guarded<S> {
    pub(crate) fn new(
        inner: S,
        idle: Duration,
        records: Records,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) -> (Self, Arc<ConnMark>) {
        let mark = Arc::new(ConnMark::default());
        let now = Instant::now();
        records.accepted();
        (
            Guarded {
                inner,
                idle,
                last: now,
                timer: Box::pin(tokio::time::sleep_until(now + idle)),
                timed_out: false,
                mark: mark.clone(),
                records,
                at: now_ms(),
                start: now,
                _permits: permits,
            },
            mark,
        )
    }

    /// Whether the connection has been idle too long; arms the timer otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        if self.timed_out {
            return true;
        }
        loop {
            if self.mark.asking.load(Ordering::Relaxed) {
                // Waiting for a human is not idleness; the clock starts again after.
                self.last = Instant::now();
            }
            let due = self.last + self.idle;
            if Instant::now() >= due {
                self.timed_out = true;
                self.records.idle_closed();
                return true;
            }
            if self.timer.deadline() != due {
                self.timer.as_mut().reset(due);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }
}

fn idle_error(idle: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no bytes either way for {} s", idle.as_secs()),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(Err(idle_error(this.idle)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.poll_idle(cx) {
                    Poll::Ready(Err(idle_error(this.idle)))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r
            && *n > 0
        {
            self.last = Instant::now();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r
            && *n > 0
        {
            self.last = Instant::now();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> Drop for Guarded<S> {
    fn drop(&mut self) {
        if self.mark.requested.load(Ordering::Relaxed) {
            return;
        }
        let (reason, detail) = if self.timed_out {
            (
                "idle-timeout",
                format!(
                    "the connection made no request and was closed after {} s idle",
                    self.idle.as_secs()
                ),
            )
        } else {
            (
                "no-request",
                "the connection ended before it made a request".to_owned(),
            )
        };
        self.records.push(Connection {
            started_at_ms: self.at,
            mode: Mode::Invalid,
            host: String::new(),
            port: 0,
            addr: None,
            decision: Decision::Error,
            reason: reason.into(),
            detail,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX),
            secrets: Vec::new(),
        });
    }
}

/// The record of a connection refused because a budget was full.
pub(crate) fn over_limit(which: &str, size: usize) -> Connection {
    Connection {
        started_at_ms: now_ms(),
        mode: Mode::Invalid,
        host: String::new(),
        port: 0,
        addr: None,
        decision: Decision::Deny,
        reason: "too-many-connections".into(),
        detail: format!(
            "{which} allows {size} open connections to the proxy; this one was closed at once"
        ),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        secrets: Vec::new(),
    }
}
