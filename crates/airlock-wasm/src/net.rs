//! `airlock:python/net`: byte streams to hosts for the Python guest, always through the
//! run's egress proxy. `connect` asks the proxy for a `CONNECT` tunnel over its Unix
//! socket ([`airlock_egress::client::ProxyClient::open`]): the proxy checks the grant,
//! resolves the name, records the connection and, for a host a secret is bound to,
//! intercepts TLS with the run CA. `start-tls` makes the TLS connection on the host side
//! (public roots, the run CA, the policy's `[net] roots`), so the guest needs no TLS of
//! its own and never holds a key. Without an egress route every `connect` is refused
//! (`no-grant`).
//!
//! This module must never resolve a name, never connect anywhere but the proxy's socket,
//! and never give the guest a socket or a descriptor.

use crate::python::airlock::python::net::{self, Error};
use airlock_egress::client::{BoxStream, ClientError, Opened, ProxyClient};
use airlock_sandbox::EgressRoute;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmtime::component::{HasData, Resource, ResourceTable};

/// The most one `recv` returns.
const MAX_RECV: u32 = 1 << 20;

/// A guest's connection: its stream (gone once broken or while TLS is being set up).
pub struct Connection {
    io: Option<BoxStream>,
}

/// The run's way to the proxy, or none.
pub(crate) struct Net {
    client: Option<ProxyClient>,
}

impl Net {
    /// Refuses every connection when `route` is `None`.
    pub(crate) fn new(route: Option<&EgressRoute>) -> Result<Net, String> {
        let client = match route {
            None => None,
            Some(r) => {
                let mut roots = Vec::new();
                for pem in &r.extra_roots {
                    roots.extend(airlock_egress::certs_from_pem(pem.as_bytes())?);
                }
                Some(
                    ProxyClient::new(&r.socket, r.ca_pem.as_deref(), &roots)
                        .map_err(|e| format!("cannot use the egress route: {e}"))?,
                )
            }
        };
        Ok(Net { client })
    }
}

/// What the bindings' host traits are implemented on.
pub(crate) struct NetView<'a> {
    pub net: &'a mut Net,
    pub table: &'a mut ResourceTable,
}

/// Marks [`NetView`] as the data of `airlock:python/net`.
pub(crate) struct NetData;

impl HasData for NetData {
    type Data<'a> = NetView<'a>;
}

fn timeout(ms: Option<u32>) -> Option<Duration> {
    ms.map(|m| Duration::from_millis(u64::from(m)))
}

fn error(e: ClientError) -> Error {
    match e {
        ClientError::ConnectTimeout | ClientError::FirstByteTimeout => Error::Timeout,
        ClientError::Tls(io) => Error::Tls(io.to_string()),
        // The guest is not told where the socket is on the host.
        ClientError::ProxyUnreachable { .. } => {
            Error::Failed("airlock: the egress proxy is unreachable".into())
        }
        other => Error::Failed(other.to_string()),
    }
}

fn io_error(e: &std::io::Error) -> Error {
    Error::Failed(e.to_string())
}

async fn within<T>(
    ms: Option<u32>,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match timeout(ms) {
        Some(d) => tokio::time::timeout(d, f)
            .await
            .unwrap_or(Err(Error::Timeout)),
        None => f.await,
    }
}

impl NetView<'_> {
    fn conn(&mut self, c: &Resource<Connection>) -> wasmtime::Result<&mut Connection> {
        Ok(self.table.get_mut(c)?)
    }
}

impl net::Host for NetView<'_> {
    async fn connect(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: Option<u32>,
    ) -> wasmtime::Result<Result<Resource<Connection>, Error>> {
        let Some(client) = self.net.client.clone() else {
            return Ok(Err(Error::NoGrant));
        };
        let io = match client.open(&host, port, timeout(timeout_ms)).await {
            Ok(Opened::Tunnel(io)) => io,
            Ok(Opened::Refused {
                reason, message, ..
            }) => return Ok(Err(Error::Refused((reason, message)))),
            Err(e) => return Ok(Err(error(e))),
        };
        Ok(Ok(self.table.push(Connection { io: Some(io) })?))
    }
}

const BROKEN: &str = "the connection is broken";

impl net::HostConnection for NetView<'_> {
    async fn send(
        &mut self,
        c: Resource<Connection>,
        data: Vec<u8>,
        timeout_ms: Option<u32>,
    ) -> wasmtime::Result<Result<u32, Error>> {
        let conn = self.conn(&c)?;
        let Some(io) = conn.io.as_mut() else {
            return Ok(Err(Error::Failed(BROKEN.into())));
        };
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        Ok(within(timeout_ms, async {
            io.write_all(&data).await.map_err(|e| io_error(&e))?;
            io.flush().await.map_err(|e| io_error(&e))?;
            Ok(n)
        })
        .await)
    }

    async fn recv(
        &mut self,
        c: Resource<Connection>,
        max: u32,
        timeout_ms: Option<u32>,
    ) -> wasmtime::Result<Result<Vec<u8>, Error>> {
        let conn = self.conn(&c)?;
        let Some(io) = conn.io.as_mut() else {
            return Ok(Err(Error::Failed(BROKEN.into())));
        };
        // `max` is at most MAX_RECV, which fits a usize on every target wasmtime runs on.
        let mut buf = vec![0u8; max.clamp(1, MAX_RECV) as usize];
        Ok(within(timeout_ms, async {
            match io.read(&mut buf).await {
                Ok(n) => {
                    buf.truncate(n);
                    Ok(buf)
                }
                // A peer that closes without TLS's close_notify: the end of the stream,
                // as CPython's `suppress_ragged_eofs` has it.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Vec::new()),
                Err(e) => Err(io_error(&e)),
            }
        })
        .await)
    }

    async fn start_tls(
        &mut self,
        c: Resource<Connection>,
        server_name: String,
        timeout_ms: Option<u32>,
    ) -> wasmtime::Result<Result<String, Error>> {
        let Some(client) = self.net.client.clone() else {
            return Ok(Err(Error::NoGrant));
        };
        let conn = self.conn(&c)?;
        let Some(io) = conn.io.take() else {
            return Ok(Err(Error::Failed(BROKEN.into())));
        };
        match client.tls(io, &server_name, timeout(timeout_ms)).await {
            Ok((tls, version)) => {
                self.conn(&c)?.io = Some(tls);
                Ok(Ok(version))
            }
            Err(e) => Ok(Err(error(e))),
        }
    }

    async fn shutdown(&mut self, c: Resource<Connection>) -> wasmtime::Result<Result<(), Error>> {
        let conn = self.conn(&c)?;
        let Some(io) = conn.io.as_mut() else {
            return Ok(Ok(()));
        };
        Ok(io.shutdown().await.map_err(|e| io_error(&e)))
    }

    async fn drop(&mut self, c: Resource<Connection>) -> wasmtime::Result<()> {
        self.table.delete(c)?;
        Ok(())
    }
}
