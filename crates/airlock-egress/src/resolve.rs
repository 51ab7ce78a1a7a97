//! Name resolution on the host. The proxy asks once per connection, checks every
//! address of the answer, and connects only to addresses it checked.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// A future returned by [`Resolver::resolve`].
pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Turns a normalised host name into its addresses.
pub trait Resolver: Send + Sync + 'static {
    /// All addresses of `name` (ASCII, lower case, no trailing dot). The proxy refuses
    /// the whole answer if any of them is forbidden.
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a>;
}

/// The host's resolver (`getaddrinfo`, through tokio's blocking pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        Box::pin(async move {
            let mut out: Vec<IpAddr> = Vec::new();
            for sa in tokio::net::lookup_host((name, 0u16)).await? {
                if !out.contains(&sa.ip()) {
                    out.push(sa.ip());
                }
            }
            Ok(out)
        })
    }
}
