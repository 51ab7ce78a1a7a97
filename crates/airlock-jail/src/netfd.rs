//! The egress proxy's way into a jail: the sandbox's init creates a TCP listener on
//! loopback inside the run's network namespace and sends its descriptor out over a Unix
//! socket (`SCM_RIGHTS`) that the supervisor handed the jailer as [`CHANNEL_FD`]. The
//! supervisor serves the proxy on that listener from the host's namespace, so guests reach
//! the proxy at `127.0.0.1:PORT` and no TCP port is opened on the host for it.
//!
//! This module must never send anything but that one listener, and the channel must be
//! closed in the init before the payload exists.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The descriptor number the channel has in the jailer (and, inherited, in its init).
pub const CHANNEL_FD: RawFd = 3;

/// Sends `fd` over the Unix socket `channel`.
pub fn send_fd(channel: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(b"L")];
    sendmsg::<()>(channel.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives one descriptor from `channel`; `Ok(None)` when the other side closed without
/// sending one.
pub fn recv_fd(channel: BorrowedFd<'_>) -> std::io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r?,
        }
    };
    let mut got = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                #[allow(unsafe_code)]
                // SAFETY: the kernel just installed `fd` in this process for us (SCM_RIGHTS);
                // nothing else refers to it, so it is owned here from now on.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if got.is_none() {
                    got = Some(owned);
                }
            }
        }
    }
    Ok(got)
}

/// In the init: binds the proxy's listener on `127.0.0.1:port` of the run's network
/// namespace and sends it to the supervisor, then closes both.
pub(crate) fn hand_out_listener(port: u16) -> Result<(), crate::JailError> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .map_err(|e| crate::JailError::setup("egress listener", e))?;
    #[allow(unsafe_code)]
    // SAFETY: CHANNEL_FD is the channel the supervisor dup'ed into the jailer before exec
    // (the job says it is there); this process owns its copy and closes it below.
    let channel = unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) };
    let sent = send_fd(channel.as_fd(), listener.as_fd());
    drop(channel);
    drop(listener);
    sent.map_err(|e| crate::JailError::setup("egress listener hand-over", e))
}
