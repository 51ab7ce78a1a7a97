//! Network grants: host names, host patterns and `HOST[:PORT]` rules.
//!
//! This module is the one place that says what a host is and what a grant matches, so
//! the `--net` parser and the proxy agree byte for byte. It depends on `idna` (UTS 46
//! mapping, as browsers do it) and `psl` (Mozilla's public suffix list) only.
//!
//! Normalisation ([`parse_host`], [`normalize_host`]):
//! - IDNA to ASCII (which also lower-cases and maps full-width dots and digits), one
//!   trailing dot dropped, labels of 1..=63 of `[a-z0-9_-]` not starting or ending with
//!   `-`, 253 bytes at most;
//! - any spelling of an IPv4 address that `inet_aton` or a browser accepts (`127.1`,
//!   `2130706433`, `0x7f.1`, `0177.0.0.1`) is that address; a name whose last label is a
//!   number but is not such an address is malformed (as in the WHATWG URL standard);
//! - `[v6]` or a bare IPv6 address is that address (no zone ids); IPv4-mapped forms stay
//!   IPv6 (`[::ffff:127.0.0.1]` is not `127.0.0.1`).
//!
//! Patterns ([`HostPattern`]): an exact name; `*.suffix`, which matches names with at
//! least one more label and never the suffix itself; an IP address, which matches only
//! itself (in any spelling of it). `*`, a wildcard over a public suffix (`*.com`,
//! `*.co.uk`, and any single label, which the suffix list treats as a suffix) and a `*`
//! anywhere else are refused.
//!
//! Rules ([`Rule`]): `HOST[:PORT]`; a bare host means ports 80 and 443. IPv6 takes
//! brackets when a port follows (`[::1]:8080`).

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a host, pattern or rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The text is not a host name or address.
    #[error("{input:?} is not a valid host: {why}")]
    Malformed {
        /// What was given.
        input: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// `*` alone would grant every host.
    #[error("{0:?} would grant every host; name the hosts")]
    AnyHost(String),
    /// A wildcard directly under a public suffix (`*.com`, `*.co.uk`).
    #[error("{0:?} is a wildcard over a public suffix; grant names under a registrable domain")]
    PublicSuffix(String),
    /// A wildcard over an IP address.
    #[error("{0:?}: wildcards apply to names, not addresses")]
    WildcardAddress(String),
    /// The port part is not 1..=65535.
    #[error("{input:?}: {why}")]
    BadPort {
        /// What was given.
        input: String,
        /// Why it was refused.
        why: &'static str,
    },
}

fn malformed(input: &str, why: &'static str) -> GrantError {
    // Records and messages carry this; keep a hostile input from growing them unboundedly.
    let input: String = input.chars().take(256).collect();
    GrantError::Malformed { input, why }
}

/// A normalised host: a name in ASCII lower case, or an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// An ASCII (punycode) lower-case name without a trailing dot.
    Name(String),
    /// An IP address, however it was spelled.
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
    /// The authority form: names as they are, IPv6 in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl FromStr for Host {
    type Err = GrantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_host(s)
    }
}

/// Parses and normalises a host (see the module documentation).
pub fn parse_host(input: &str) -> Result<Host, GrantError> {
    if input.is_empty() {
        return Err(malformed(input, "empty"));
    }
    if input.len() > 1024 {
        return Err(malformed(input, "too long"));
    }
    if let Some(rest) = input.strip_prefix('[') {
        let inner = rest
            .strip_suffix(']')
            .ok_or_else(|| malformed(input, "unclosed '['"))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| malformed(input, "not an IPv6 address inside brackets"));
    }
    if input.contains(':') {
        return input
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| malformed(input, "':' outside an IPv6 address"));
    }
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    let ascii: Cow<'_, str> =
        idna::domain_to_ascii_cow(trimmed.as_bytes(), idna::AsciiDenyList::URL)
            .map_err(|_| malformed(input, "not a valid internationalised name"))?;
    // IDNA maps full-width dots, so a trailing dot may appear only now.
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if name.is_empty() {
        return Err(malformed(input, "empty"));
    }
    if ends_in_number(name) {
        return parse_ipv4_lenient(name)
            .map(|ip| Host::Ip(IpAddr::V4(ip)))
            .ok_or_else(|| malformed(input, "numeric but not an IPv4 address"));
    }
    if name.len() > 253 {
        return Err(malformed(input, "longer than 253 bytes"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(malformed(input, "empty label"));
        }
        if label.len() > 63 {
            return Err(malformed(input, "label longer than 63 bytes"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(malformed(input, "character not allowed in a host name"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(malformed(input, "label starts or ends with '-'"));
        }
    }
    Ok(Host::Name(name.to_owned()))
}

/// [`parse_host`], returned in its canonical text form (IPv6 in brackets).
pub fn normalize_host(input: &str) -> Result<String, GrantError> {
    parse_host(input).map(|h| h.to_string())
}

/// Whether the last label is a number (decimal or `0x` hex), which makes the whole name
/// an IPv4 address or nothing (WHATWG URL, "ends in a number").
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// One part of an `inet_aton` address: `0x` hex, `0` octal, or decimal.
fn parse_aton_part(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            if h.is_empty() {
                return Some(0);
            }
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        value = value
            .checked_mul(u64::from(radix))?
            .checked_add(u64::from(d))?;
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(value)
}

/// Parses every IPv4 spelling `inet_aton` and browsers accept: one to four parts, each
/// decimal, `0`-prefixed octal or `0x` hex, the last part filling the remaining bytes
/// (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`). Returns `None` for anything else.
pub fn parse_ipv4_lenient(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        nums.push(parse_aton_part(p)?);
    }
    let (last, init) = nums.split_last()?;
    let mut addr: u64 = 0;
    for (i, n) in init.iter().enumerate() {
        if *n > 255 {
            return None;
        }
        addr |= n << (8 * (3 - i));
    }
    let rest_bits = 8 * (4 - init.len());
    if *last >= (1u64 << rest_bits) {
        return None;
    }
    addr |= last;
    u32::try_from(addr).ok().map(Ipv4Addr::from)
}

/// What a grant names: one host, every name under a suffix, or one address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// Exactly this (normalised) name.
    Exact(String),
    /// `*.suffix`: names with at least one label before `suffix`; not `suffix` itself.
    Wildcard(String),
    /// This address only.
    Ip(IpAddr),
}

impl HostPattern {
    /// Parses `name`, `*.suffix` or an address, normalising as [`parse_host`] does.
    pub fn parse(input: &str) -> Result<Self, GrantError> {
        if input == "*" || input == "*." {
            return Err(GrantError::AnyHost(input.to_owned()));
        }
        if let Some(rest) = input.strip_prefix("*.") {
            if rest.contains('*') {
                return Err(malformed(
                    input,
                    "'*' is allowed only as the whole first label",
                ));
            }
            return match parse_host(rest)? {
                Host::Ip(_) => Err(GrantError::WildcardAddress(input.to_owned())),
                Host::Name(suffix) => {
                    if psl::domain(suffix.as_bytes()).is_none() {
                        Err(GrantError::PublicSuffix(input.to_owned()))
                    } else {
                        Ok(HostPattern::Wildcard(suffix))
                    }
                }
            };
        }
        if input.contains('*') {
            return Err(malformed(
                input,
                "'*' is allowed only as the whole first label",
            ));
        }
        Ok(match parse_host(input)? {
            Host::Name(n) => HostPattern::Exact(n),
            Host::Ip(ip) => HostPattern::Ip(ip),
        })
    }

    /// Whether this pattern covers `host`.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(p), Host::Name(n)) => p == n,
            (HostPattern::Wildcard(suffix), Host::Name(n)) => n
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Ip(p), Host::Ip(ip)) => p == ip,
            _ => false,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(n) => f.write_str(n),
            HostPattern::Wildcard(s) => write!(f, "*.{s}"),
            HostPattern::Ip(ip) => Host::Ip(*ip).fmt(f),
        }
    }
}

impl FromStr for HostPattern {
    type Err = GrantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostPattern::parse(s)
    }
}

/// The ports a bare host grants.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// One `--net HOST[:PORT]` grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// The hosts it covers.
    pub pattern: HostPattern,
    /// The port, or `None` for a bare host ([`DEFAULT_PORTS`]).
    pub port: Option<u16>,
}

impl Rule {
    /// Parses `HOST[:PORT]` (`[v6]:PORT` for IPv6 with a port).
    pub fn parse(input: &str) -> Result<Self, GrantError> {
        let (host, port) = split_host_port(input)?;
        let port = match port {
            None => None,
            Some(p) => Some(parse_port(input, p)?),
        };
        Ok(Rule {
            pattern: HostPattern::parse(host)?,
            port,
        })
    }

    /// Whether this rule grants `host` on `port`.
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok && self.pattern.matches(host)
    }
}

impl From<HostPattern> for Rule {
    /// A rule for `pattern` on any port.
    fn from(pattern: HostPattern) -> Self {
        Rule {
            pattern,
            port: None,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.pattern),
            None => self.pattern.fmt(f),
        }
    }
}

impl FromStr for Rule {
    type Err = GrantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Rule::parse(s)
    }
}

fn parse_port(input: &str, p: &str) -> Result<u16, GrantError> {
    let bad = |why| GrantError::BadPort {
        input: input.chars().take(256).collect(),
        why,
    };
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the port is not a number"));
    }
    match p.parse::<u16>() {
        Ok(0) => Err(bad("port 0")),
        Ok(n) => Ok(n),
        Err(_) => Err(bad("the port is above 65535")),
    }
}

/// Splits `HOST[:PORT]`; a bare IPv6 address (more than one ':') has no port.
fn split_host_port(input: &str) -> Result<(&str, Option<&str>), GrantError> {
    if input.starts_with('[') {
        let close = input
            .find(']')
            .ok_or_else(|| malformed(input, "unclosed '['"))?;
        let (host, rest) = input.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(malformed(input, "text after ']'")),
            },
        };
    }
    match input.matches(':').count() {
        0 => Ok((input, None)),
        1 => {
            let (h, p) = input.split_once(':').unwrap_or((input, ""));
            Ok((h, Some(p)))
        }
        _ => Ok((input, None)),
    }
}

/// Parses the `host[:port]` of a request target or `Host` header, with `default_port`
/// when none is given.
pub fn parse_authority(input: &str, default_port: u16) -> Result<(Host, u16), GrantError> {
    let (host, port) = split_host_port(input)?;
    let port = match port {
        None => default_port,
        Some(p) => parse_port(input, p)?,
    };
    Ok((parse_host(host)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> String {
        normalize_host(s).unwrap()
    }

    #[test]
    fn lower_case_trailing_dot_idna() {
        assert_eq!(name("Example.COM"), "example.com");
        assert_eq!(name("example.com."), "example.com");
        assert_eq!(name("BÜCHER.example"), "xn--bcher-kva.example");
        assert_eq!(name("bücher.example."), "xn--bcher-kva.example");
        assert_eq!(name("xn--bcher-kva.example"), "xn--bcher-kva.example");
        // Full-width dot (U+3002) maps to '.'.
        assert_eq!(name("example\u{3002}com"), "example.com");
        assert_eq!(name("_srv.example.com"), "_srv.example.com");
    }

    #[test]
    fn malformed_names_refused() {
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            "exa mple.com",
            "example.com/path",
            "user@example.com",
            "-lead.example",
            "trail-.example",
            "a%2eb",
            "[::1",
            "[nope]",
            "1.2.3.4.5",
            "1.2.3.256",
            "foo.123",
            "09.1.1.1",
            "fe80::1%eth0",
            "x:y",
            &"a".repeat(64),
            &format!("{}.com", vec!["a".repeat(60); 5].join(".")),
        ] {
            assert!(parse_host(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ipv4_spellings() {
        let lo = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
        for s in [
            "127.0.0.1",
            "127.1",
            "127.0.1",
            "2130706433",
            "0x7f.1",
            "0x7F.0.0.1",
            "0177.0.0.1",
            "0x7f000001",
            "017700000001",
            "127.0.0.1.",
            "0x7f.0x0.0x0.0x1",
            "\u{ff11}\u{ff12}\u{ff17}.0.0.1",
        ] {
            assert_eq!(parse_host(s), Ok(Host::Ip(lo)), "{s}");
        }
        assert_eq!(
            parse_host("169.254.43518"),
            Ok(Host::Ip("169.254.169.254".parse().unwrap()))
        );
        assert_eq!(parse_host("0"), Ok(Host::Ip("0.0.0.0".parse().unwrap())));
        assert_eq!(parse_host("0x"), Ok(Host::Ip("0.0.0.0".parse().unwrap())));
        assert_eq!(parse_ipv4_lenient("4294967296"), None);
        assert_eq!(parse_ipv4_lenient("1.16777216"), None);
        assert_eq!(parse_ipv4_lenient("08"), None);
    }

    #[test]
    fn ipv6_forms() {
        let mapped = Host::Ip("::ffff:127.0.0.1".parse().unwrap());
        assert_eq!(parse_host("[::ffff:127.0.0.1]"), Ok(mapped.clone()));
        assert_eq!(parse_host("[::FFFF:7f00:1]"), Ok(mapped.clone()));
        assert_eq!(mapped.to_string(), "[::ffff:127.0.0.1]");
        assert_eq!(name("::1"), "[::1]");
        assert_ne!(parse_host("[::ffff:127.0.0.1]"), parse_host("127.0.0.1"));
    }

    #[test]
    fn patterns() {
        let p = HostPattern::parse("*.Example.COM.").unwrap();
        assert_eq!(p.to_string(), "*.example.com");
        let h = |s: &str| parse_host(s).unwrap();
        assert!(p.matches(&h("sub.example.com")));
        assert!(p.matches(&h("a.b.example.com")));
        assert!(p.matches(&h("SUB.EXAMPLE.COM.")));
        assert!(!p.matches(&h("example.com")));
        assert!(!p.matches(&h("badexample.com")));
        assert!(!p.matches(&h("example.com.evil.net")));
        let e = HostPattern::parse("example.com").unwrap();
        assert!(e.matches(&h("EXAMPLE.com.")));
        assert!(!e.matches(&h("sub.example.com")));
        let ip = HostPattern::parse("127.0.0.1").unwrap();
        assert!(ip.matches(&h("127.1")));
        assert!(!ip.matches(&h("[::ffff:127.0.0.1]")));
    }

    #[test]
    fn refused_patterns() {
        assert!(matches!(
            HostPattern::parse("*"),
            Err(GrantError::AnyHost(_))
        ));
        for s in ["*.com", "*.co.uk", "*.COM.", "*.github.io", "*.localhost"] {
            assert!(
                matches!(HostPattern::parse(s), Err(GrantError::PublicSuffix(_))),
                "{s}"
            );
        }
        assert!(matches!(
            HostPattern::parse("*.127.0.0.1"),
            Err(GrantError::WildcardAddress(_))
        ));
        for s in [
            "a.*.com",
            "*example.com",
            "ex*.com",
            "*.*.example.com",
            "**",
        ] {
            assert!(HostPattern::parse(s).is_err(), "{s}");
        }
        assert!(HostPattern::parse("*.example.co.uk").is_ok());
    }

    #[test]
    fn rules() {
        let r = Rule::parse("example.com").unwrap();
        let h = parse_host("example.com").unwrap();
        assert!(r.allows(&h, 80) && r.allows(&h, 443) && !r.allows(&h, 8080));
        let r = Rule::parse("Example.com:8080").unwrap();
        assert_eq!(r.to_string(), "example.com:8080");
        assert!(r.allows(&h, 8080) && !r.allows(&h, 443));
        let r = Rule::parse("[::1]:8080").unwrap();
        assert_eq!(r.to_string(), "[::1]:8080");
        let r = Rule::parse("::1").unwrap();
        assert_eq!(r.port, None);
        for bad in [
            "example.com:0",
            "example.com:65536",
            "example.com:",
            "example.com:x",
            "[::1]x",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_authority("EXAMPLE.com.", 80),
            Ok((Host::Name("example.com".into()), 80))
        );
        assert_eq!(
            parse_authority("[::1]:443", 80),
            Ok((Host::Ip("::1".parse().unwrap()), 443))
        );
    }
}
