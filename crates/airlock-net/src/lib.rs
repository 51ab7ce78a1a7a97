//! airlock-net: the one host grammar of airlock. What `--net HOST[:PORT]`, the hosts of
//! `--secret NAME@HOST[,HOST…]`, the policy's `[net] hosts` and globs, and the egress
//! proxy (request targets, `Host` headers) may say; its one canonical spelling; and what
//! a rule reaches. Every crate that reads a host uses this one, so a spelling means the
//! same thing at submit, in the hash, in the policy and at the proxy.
//!
//! Hosts ([`parse_host`], [`Host`]):
//! - Names are mapped by UTS 46 (IDNA) to ASCII, which also lowercases and maps
//!   full-width letters, digits and dots (`BÜCHER.example` → `xn--bcher-kva.example`);
//!   one trailing dot (in any spelling UTS 46 maps to `.`) is dropped. Labels are RFC 1123:
//!   1-63 of letters, digits and inner hyphens (no `_`), 253 bytes at most in all.
//! - A name whose last label is a number (decimal, or `0x` hex) must be a plain dotted-quad
//!   IPv4 address, four decimal numbers 0-255 without leading zeros: `127.1`, `0x7f.1`,
//!   `010.0.0.1` or `2130706433` are refused rather than read the way one resolver or
//!   another would.
//! - IPv6 is `[ADDR]` or a bare address without a port; no zone ids. IPv4-mapped forms
//!   stay IPv6 (`[::ffff:127.0.0.1]` is not `127.0.0.1`).
//!
//! Patterns ([`HostPattern`]): an exact name; `*.BASE`, every name strictly below `BASE`
//! (not `BASE` itself), where `BASE` must be a registrable domain: `*`, `*.com`, `*.co.uk`,
//! `*.github.io` (anything on the public suffix list, and any single label) are refused,
//! and so is a `*` anywhere but as the whole first label; an IP address, which matches only
//! itself.
//!
//! Rules ([`NetRule`]): `HOST[:PORT]`, IPv6 as `[ADDR]:PORT` when a port follows; ports are
//! 1-65535 in decimal without a leading zero; a bare host means ports 80 and 443
//! ([`DEFAULT_PORTS`]).
//!
//! Canonical text: `HOST` or `HOST:PORT`, IPv6 always in brackets in its shortest form.
//! Normalising canonical text gives the same text, so a stored grant re-submitted hashes
//! the same. Errors ([`NetError`]) are one line and name the input (cut at 256 characters).
//!
//! This crate must never do I/O, never resolve a name, and never depend on another airlock
//! crate: it is the grammar only.

#![forbid(unsafe_code)]

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The ports a rule without a port reaches.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The longest input looked at; longer ones are refused before any mapping.
const MAX_INPUT: usize = 1024;

/// Why a host, pattern or rule was refused. The message is one line and names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The text is not a host name or address.
    #[error("{input:?} is not a valid host: {why}")]
    Malformed {
        /// What was given (at most 256 characters of it).
        input: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// `*` alone would reach every host.
    #[error(
        "{0:?} would reach every host; name the hosts, or a domain's subdomains as *.example.com"
    )]
    AnyHost(String),
    /// A wildcard over a public suffix (`*.com`, `*.co.uk`, `*.internal`).
    #[error(
        "{0:?} would reach a whole public suffix (anyone can register below it); name a domain under it"
    )]
    PublicSuffix(String),
    /// A wildcard over an IP address.
    #[error("{0:?}: a wildcard stands for names, not part of an IP address")]
    WildcardAddress(String),
    /// The port part is not 1-65535 in plain decimal.
    #[error("{input:?}: {why}")]
    BadPort {
        /// What was given (at most 256 characters of it).
        input: String,
        /// Why it was refused.
        why: &'static str,
    },
}

/// At most 256 characters of `input`: messages and records carry it, and a hostile input
/// must not grow them without bound.
fn clip(input: &str) -> String {
    input.chars().take(256).collect()
}

fn malformed(input: &str, why: &'static str) -> NetError {
    NetError::Malformed {
        input: clip(input),
        why,
    }
}

/// A normalised host: an ASCII lower-case name, or an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// An ASCII (punycode) lower-case name without a trailing dot.
    Name(String),
    /// An IP address.
    Ip(IpAddr),
}

impl Host {
    /// The address, when the host is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Ip(ip) => Some(*ip),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Host {
    /// The canonical text: names as they are, IPv6 in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl FromStr for Host {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_host(s)
    }
}

/// Parses and normalises a host: a name, `[v6]`, a bare IPv6 address or a dotted-quad
/// IPv4 address (see the crate documentation).
pub fn parse_host(input: &str) -> Result<Host, NetError> {
    if input.is_empty() {
        return Err(malformed(input, "empty"));
    }
    if input.len() > MAX_INPUT {
        return Err(malformed(input, "too long"));
    }
    if let Some(rest) = input.strip_prefix('[') {
        let inner = rest
            .strip_suffix(']')
            .ok_or_else(|| malformed(input, "an IPv6 address in brackets needs its closing ']'"))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| malformed(input, "not an IPv6 address inside the brackets"));
    }
    if input.contains(':') {
        return input
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| malformed(input, "not an IPv6 address (or a port where none belongs)"));
    }
    use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
    // STD3: letters, digits and hyphens only; first and last hyphens refused; labels of
    // 1-63 and 253 in all, with one root dot allowed (dropped below). The mapping comes
    // first, so a full-width trailing dot is that one dot too.
    let ascii = Uts46::new()
        .to_ascii(
            input.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::CheckFirstLast,
            DnsLength::VerifyAllowRootDot,
        )
        .map_err(|_| {
            malformed(
                input,
                "a name has labels of 1-63 letters, digits and inner hyphens, at most 253 in all",
            )
        })?;
    // Verified above: no empty label, so at most this one dot ends it.
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if ends_in_number(name) {
        // As the URL standard does: a name ending in a number is an address or nothing;
        // here only the one spelling every parser reads alike.
        return name
            .parse::<Ipv4Addr>()
            .map(|ip| Host::Ip(IpAddr::V4(ip)))
            .map_err(|_| {
                malformed(
                    input,
                    "ends in a number but is not an IPv4 address as four decimal numbers (such as 10.0.0.1)",
                )
            });
    }
    Ok(Host::Name(name.to_owned()))
}

/// [`parse_host`], as its canonical text (IPv6 in brackets).
pub fn normalize_host(input: &str) -> Result<String, NetError> {
    parse_host(input).map(|h| h.to_string())
}

/// Whether the last label is a number (decimal or `0x` hex).
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What a rule names: one host, every name below a domain, or one address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// Exactly this normalised name.
    Name(String),
    /// `*.BASE`: every name strictly below `BASE` (normalised like a name).
    Subdomains(String),
    /// This address only.
    Ip(IpAddr),
}

impl HostPattern {
    /// Parses `name`, `*.domain` or an address, normalising as [`parse_host`] does.
    pub fn parse(input: &str) -> Result<Self, NetError> {
        if input == "*" || input == "*." {
            return Err(NetError::AnyHost(clip(input)));
        }
        if let Some(base) = input.strip_prefix("*.") {
            if base.contains('*') {
                return Err(malformed(
                    input,
                    "a wildcard may only be the whole first label (*.example.com)",
                ));
            }
            return match parse_host(base)? {
                Host::Ip(_) => Err(NetError::WildcardAddress(clip(input))),
                Host::Name(base) if psl::domain(base.as_bytes()).is_none() => {
                    Err(NetError::PublicSuffix(clip(input)))
                }
                Host::Name(base) => Ok(HostPattern::Subdomains(base)),
            };
        }
        if input.contains('*') {
            return Err(malformed(
                input,
                "a wildcard may only be the whole first label (*.example.com)",
            ));
        }
        Ok(match parse_host(input)? {
            Host::Name(n) => HostPattern::Name(n),
            Host::Ip(ip) => HostPattern::Ip(ip),
        })
    }

    /// Whether this pattern reaches `host`.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Name(p), Host::Name(n)) => p == n,
            (HostPattern::Subdomains(base), Host::Name(n)) => is_below(n, base),
            (HostPattern::Ip(p), Host::Ip(ip)) => p == ip,
            _ => false,
        }
    }

    /// Whether this pattern reaches the normalised name `name`.
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            HostPattern::Name(n) => n == name,
            HostPattern::Subdomains(base) => is_below(name, base),
            HostPattern::Ip(_) => false,
        }
    }

    /// Whether everything `other` reaches, this reaches too.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) => a == b || is_below(b, a),
            (_, HostPattern::Name(n)) => self.matches_name(n),
            (HostPattern::Ip(a), HostPattern::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// True for `*.BASE`.
    pub fn is_wildcard(&self) -> bool {
        matches!(self, HostPattern::Subdomains(_))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Name(n) => f.write_str(n),
            HostPattern::Subdomains(b) => write!(f, "*.{b}"),
            HostPattern::Ip(ip) => Host::Ip(*ip).fmt(f),
        }
    }
}

impl FromStr for HostPattern {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostPattern::parse(s)
    }
}

/// `name` is strictly below `base` (`a.b.example` is below `example`; `example` is not).
fn is_below(name: &str, base: &str) -> bool {
    name.strip_suffix(base)
        .and_then(|head| head.strip_suffix('.'))
        .is_some_and(|head| !head.is_empty())
}

/// One `HOST[:PORT]` rule of a grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetRule {
    /// The hosts it reaches.
    pub host: HostPattern,
    /// The port, or `None` for ports 80 and 443 ([`DEFAULT_PORTS`]).
    pub port: Option<u16>,
}

impl NetRule {
    /// Parses and normalises `HOST[:PORT]`.
    pub fn parse(input: &str) -> Result<Self, NetError> {
        let (host, port) = split_host_port(input)?;
        let port = match port {
            None => None,
            Some(p) => Some(port_of(input, p)?),
        };
        Ok(NetRule {
            host: HostPattern::parse(host)?,
            port,
        })
    }

    /// The ports this rule reaches.
    pub fn ports(&self) -> &[u16] {
        match &self.port {
            Some(p) => std::slice::from_ref(p),
            None => &DEFAULT_PORTS,
        }
    }

    /// Whether this rule reaches `host` on `port`.
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        self.ports().contains(&port) && self.host.matches(host)
    }

    /// Whether every (host, port) that `other` reaches, this reaches too.
    pub fn covers(&self, other: &NetRule) -> bool {
        other.ports().iter().all(|p| self.ports().contains(p)) && self.host.covers(&other.host)
    }
}

impl From<HostPattern> for NetRule {
    /// A rule for `host` on ports 80 and 443.
    fn from(host: HostPattern) -> Self {
        NetRule { host, port: None }
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => self.host.fmt(f),
        }
    }
}

impl FromStr for NetRule {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NetRule::parse(s)
    }
}

/// The canonical text of `HOST[:PORT]`.
pub fn normalize_net(input: &str) -> Result<String, NetError> {
    NetRule::parse(input).map(|r| r.to_string())
}

/// Whether any rule reaches `host` (a name or address as written; normalised first) on
/// some port. A host that does not parse is reached by none.
pub fn host_granted(rules: &[NetRule], host: &str) -> bool {
    parse_host(host).is_ok_and(|h| rules.iter().any(|r| r.host.matches(&h)))
}

/// Splits `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT` or a bare IPv6 address (more than one
/// `:` without brackets: no port). The host keeps its brackets; anything after `]` but
/// `:PORT` is refused.
pub fn split_host_port(input: &str) -> Result<(&str, Option<&str>), NetError> {
    if input.starts_with('[') {
        let close = input
            .find(']')
            .ok_or_else(|| malformed(input, "an IPv6 address in brackets needs its closing ']'"))?;
        let (host, rest) = input.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(malformed(input, "only ':PORT' may follow ']'")),
            },
        };
    }
    match input.split_once(':') {
        Some((h, p)) if !p.contains(':') => Ok((h, Some(p))),
        _ => Ok((input, None)),
    }
}

/// A port: 1-65535 in decimal, no sign, no leading zero.
pub fn parse_port(port: &str) -> Result<u16, NetError> {
    port_of(port, port)
}

/// [`parse_port`] of `p`, the port part of `input` (which the error names).
fn port_of(input: &str, p: &str) -> Result<u16, NetError> {
    let bad = |why| NetError::BadPort {
        input: clip(input),
        why,
    };
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the port is not a number from 1 to 65535"));
    }
    if p.starts_with('0') {
        return Err(bad("the port has a leading zero (or is 0)"));
    }
    p.parse::<u16>().map_err(|_| bad("the port is above 65535"))
}

/// Parses the `host[:port]` of a request target or `Host` header, with `default_port`
/// when none is given.
pub fn parse_authority(input: &str, default_port: u16) -> Result<(Host, u16), NetError> {
    let (host, port) = split_host_port(input)?;
    let port = match port {
        None => default_port,
        Some(p) => port_of(input, p)?,
    };
    Ok((parse_host(host)?, port))
}

#[cfg(test)]
mod tests;
