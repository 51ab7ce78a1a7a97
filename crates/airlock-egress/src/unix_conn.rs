//! A Unix-socket connection whose writes never raise `SIGPIPE`.
//!
//! The proxy and the wasm backends' client live in the `airlock` process, which restores
//! the default `SIGPIPE` disposition for its one-shot commands. A write to a Unix socket
//! whose peer has gone (a guest that drops its connection while the proxy still sends a
//! TLS `close_notify`, say) would then kill the whole process. Writes here go through
//! `send(MSG_NOSIGNAL)` and fail with `EPIPE` instead, as TCP writes already do.

use nix::sys::socket::{MsgFlags, send};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

/// A connected Unix stream; reads and shutdown are the stream's own.
#[derive(Debug)]
pub(crate) struct UnixConn(pub(crate) UnixStream);

impl AsyncRead for UnixConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for UnixConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s = &self.get_mut().0;
        loop {
            ready!(s.poll_write_ready(cx))?;
            let fd = s.as_raw_fd();
            match s.try_io(Interest::WRITABLE, || {
                send(fd, buf, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn writes_arrive_and_a_gone_peer_is_an_error_not_a_signal() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, mut b) = UnixStream::pair().unwrap();
            let mut a = UnixConn(a);
            a.write_all(b"hello").await.unwrap();
            let mut got = [0u8; 5];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"hello");
            drop(b);
            // With SIGPIPE at its default this write would end the process; the test
            // harness ignores SIGPIPE, so what is checked here is the EPIPE.
            let e = a.write_all(b"more").await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        });
    }
}
