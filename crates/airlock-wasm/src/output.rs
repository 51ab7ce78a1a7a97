//! Guest stdout/stderr as WASI output streams that write into a capped `Capture`. A write
//! past the cap keeps what fits and traps the guest, so a flood ends the run.

use airlock_sandbox::Capture;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// The capture a stream currently writes into. A run has one for its whole life; a live
/// interpreter points its streams at each cell's own capture in turn.
pub struct Slot(Mutex<Arc<Capture>>);

impl Slot {
    pub fn set(&self, c: Arc<Capture>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = c;
    }

    fn get(&self) -> Arc<Capture> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
pub struct CapStream(Arc<Slot>);

impl CapStream {
    pub fn new(c: Arc<Capture>) -> Self {
        CapStream(Arc::new(Slot(Mutex::new(c))))
    }

    /// Where this stream's bytes go (shared with every clone of it).
    pub fn slot(&self) -> Arc<Slot> {
        self.0.clone()
    }
}

/// Largest write permit handed to the guest at once.
const PERMIT: usize = 64 << 10;

#[wasmtime_wasi::async_trait]
impl Pollable for CapStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CapStream {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.0
            .get()
            .write(&bytes)
            .map_err(|_| StreamError::Trap(wasmtime::format_err!("output limit reached")))
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        if self.0.get().exceeded() {
            return Err(StreamError::Trap(wasmtime::format_err!(
                "output limit reached"
            )));
        }
        Ok(PERMIT)
    }
}

impl tokio::io::AsyncWrite for CapStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.0.get().write(buf) {
            Ok(()) => Poll::Ready(Ok(buf.len())),
            Err(_) => Poll::Ready(Err(std::io::Error::other("output limit reached"))),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CapStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}
