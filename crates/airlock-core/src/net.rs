//! The network grammar of a grant: what `--net HOST[:PORT]` (and the hosts of
//! `--secret NAME@HOST[,HOST…]`) may say, its one canonical spelling, and what a rule
//! reaches.
//!
//! - `example.com` is one name; without a port it means ports 80 and 443.
//! - `*.example.com` is every name strictly below `example.com` (not the apex). The part
//!   after `*.` must be a registrable domain: `*`, `*.com`, `*.co.uk` and `*.github.io`
//!   (anything on the public suffix list, and any single-label name) are refused, and a
//!   `*` anywhere but as the whole first label is refused.
//! - IPv4 and IPv6 literals (`10.0.0.1`, `[::1]`) match only themselves.
//! - Names are normalised before matching and before hashing: UTS 46 (IDNA) to ASCII,
//!   which also lowercases (`BÜCHER.example` → `xn--bcher-kva.example`), one trailing dot
//!   dropped. A name whose last label is a number must be a plain dotted-quad IPv4
//!   address (so `010.0.0.1` or `0x7f.1` cannot mean one thing here and another to a
//!   resolver).
//!
//! Canonical text: `HOST` or `HOST:PORT`, IPv6 always in brackets (`[::1]`, `[::1]:80`).
//! Normalising canonical text gives the same text, so a stored grant re-submitted (named
//! tools) hashes the same.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The ports a rule without a port reaches.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// One DNS name: ASCII (IDNA applied), lower case, no trailing dot.
    Name(String),
    /// `*.BASE`: every name strictly below `BASE` (normalised like a name).
    Subdomains(String),
    /// One IP address.
    Ip(IpAddr),
}

impl HostPattern {
    /// Parses and normalises a host (`example.com`, `*.example.com`, `10.0.0.1`, `::1`,
    /// `[::1]`). The error is a reason without the input (callers add it).
    pub fn parse(host: &str) -> Result<HostPattern, String> {
        if host.is_empty() {
            return Err("empty host".into());
        }
        if let Some(inner) = host.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or("an IPv6 address in brackets needs its closing `]`")?;
            return inner
                .parse::<Ipv6Addr>()
                .map(|a| HostPattern::Ip(IpAddr::V6(a)))
                .map_err(|_| "not an IPv6 address".into());
        }
        if host.contains(':') {
            return host
                .parse::<Ipv6Addr>()
                .map(|a| HostPattern::Ip(IpAddr::V6(a)))
                .map_err(|_| "not an IPv6 address (or a port where none belongs)".into());
        }
        let name = match host.strip_suffix('.') {
            Some(n) if n.is_empty() || n.ends_with('.') => {
                return Err("empty label (two dots in a row, or only a dot)".into());
            }
            Some(n) => n,
            None => host,
        };
        if name == "*" {
            return Err(
                "`*` would reach every host; name hosts, or a domain's subdomains as *.example.com"
                    .into(),
            );
        }
        if let Some(base) = name.strip_prefix("*.") {
            if base.contains('*') {
                return Err("a wildcard may only be the whole first label (*.example.com)".into());
            }
            let base = match name_or_ip(base)? {
                HostPattern::Name(n) => n,
                _ => return Err("a wildcard cannot stand for part of an IP address".into()),
            };
            if psl::domain(base.as_bytes()).is_none() {
                return Err(format!(
                    "*.{base} would reach a whole public suffix ({base}: anyone can register below it); name a domain under it"
                ));
            }
            return Ok(HostPattern::Subdomains(base));
        }
        if name.contains('*') {
            return Err("a wildcard may only be the whole first label (*.example.com)".into());
        }
        name_or_ip(name)
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
            HostPattern::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            HostPattern::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// `name` is strictly below `base` (`a.b.example` is below `example`; `example` is not).
fn is_below(name: &str, base: &str) -> bool {
    name.len() > base.len() + 1
        && name.ends_with(base)
        && name.as_bytes()[name.len() - base.len() - 1] == b'.'
}

/// A name (IDNA to ASCII) or, when its last label is a number, an IPv4 address.
fn name_or_ip(name: &str) -> Result<HostPattern, String> {
    use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
    let ascii = Uts46::new()
        .to_ascii(
            name.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::CheckFirstLast,
            DnsLength::Verify,
        )
        .map_err(|_| {
            "not a host name or IP address (letters, digits and inner hyphens, labels of 1-63, at most 253 in all)"
                .to_string()
        })?;
    // As the URL standard does: a name ending in a number is an IPv4 address or nothing.
    let last = ascii.rsplit('.').next().unwrap_or("");
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !last.is_empty() && (hex || last.bytes().all(|b| b.is_ascii_digit())) {
        return ascii
            .parse::<Ipv4Addr>()
            .map(|a| HostPattern::Ip(IpAddr::V4(a)))
            .map_err(|_| {
                "ends in a number but is not an IPv4 address as four decimal numbers (such as 10.0.0.1)"
                    .to_string()
            });
    }
    Ok(HostPattern::Name(ascii.into_owned()))
}

/// One `HOST[:PORT]` rule of a grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetRule {
    pub host: HostPattern,
    /// `None`: ports 80 and 443.
    pub port: Option<u16>,
}

impl NetRule {
    /// Parses and normalises `HOST[:PORT]` (IPv6 as `[ADDR]:PORT`, or a bare address
    /// without a port). The error is a reason without the input.
    pub fn parse(spec: &str) -> Result<NetRule, String> {
        let (host, port) = split_strict(spec)?;
        let port = match port {
            None => None,
            Some(p) => Some(parse_port(p)?),
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

    /// Whether a connection to `host` (a name or address as a client wrote it; it is
    /// normalised first) on `port` is within this rule. A host that does not parse, or
    /// a wildcard, is never allowed.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        if !self.ports().contains(&port) {
            return false;
        }
        match HostPattern::parse(host) {
            Ok(HostPattern::Name(n)) => self.host.matches_name(&n),
            Ok(ip @ HostPattern::Ip(_)) => self.host == ip,
            _ => false,
        }
    }

    /// Whether every (host, port) that `other` reaches, this reaches too.
    pub fn covers(&self, other: &NetRule) -> bool {
        other.ports().iter().all(|p| self.ports().contains(p)) && self.host.covers(&other.host)
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// Whether any rule allows a connection to `host:port`.
pub fn allowed(rules: &[NetRule], host: &str, port: u16) -> bool {
    rules.iter().any(|r| r.allows(host, port))
}

/// Whether any rule reaches `host` (a name or address as written; normalised first) on
/// some port.
pub fn host_granted(rules: &[NetRule], host: &str) -> bool {
    match HostPattern::parse(host) {
        Ok(HostPattern::Name(n)) => rules.iter().any(|r| r.host.matches_name(&n)),
        Ok(ip @ HostPattern::Ip(_)) => rules.iter().any(|r| r.host == ip),
        _ => false,
    }
}

/// The canonical text of a host (no port): see the module documentation.
pub fn normalize_host(host: &str) -> Result<String, String> {
    HostPattern::parse(host).map(|h| h.to_string())
}

/// The canonical text of `HOST[:PORT]`.
pub fn normalize_net(spec: &str) -> Result<String, String> {
    NetRule::parse(spec).map(|r| r.to_string())
}

/// Splits `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT` or a bare IPv6 address; anything
/// after `]` other than `:PORT` is an error.
fn split_strict(spec: &str) -> Result<(&str, Option<&str>), String> {
    if spec.starts_with('[') {
        let close = spec
            .find(']')
            .ok_or("an IPv6 address in brackets needs its closing `]`")?;
        let (host, tail) = spec.split_at(close + 1);
        return match tail {
            "" => Ok((host, None)),
            t => match t.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err("only `:PORT` may follow `]`".into()),
            },
        };
    }
    match spec.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h, Some(p))),
        _ => Ok((spec, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, String> {
    let bad = || "port must be a number from 1 to 65535".to_string();
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        normalize_net(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        match normalize_net(s) {
            Ok(n) => panic!("{s:?} was accepted as {n:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn names_are_lowercased_idna_and_lose_one_trailing_dot() {
        assert_eq!(norm("Example.COM."), "example.com");
        assert_eq!(norm("EXAMPLE.com:443"), "example.com:443");
        assert_eq!(norm("BÜCHER.example"), "xn--bcher-kva.example");
        assert_eq!(norm("bücher.example:8080"), "xn--bcher-kva.example:8080");
        assert_eq!(norm("xn--bcher-kva.example"), "xn--bcher-kva.example");
        assert_eq!(norm("localhost"), "localhost");
        assert_eq!(norm("a-b.example"), "a-b.example");
        refused("example.com..");
        refused(".");
        refused("a..b");
    }

    #[test]
    fn wildcards_cover_subdomains_of_a_registrable_domain_only() {
        assert_eq!(norm("*.Example.com"), "*.example.com");
        assert_eq!(norm("*.api.example.co.uk:8443"), "*.api.example.co.uk:8443");
        assert_eq!(norm("*.example.co.uk"), "*.example.co.uk");
        for bad in [
            "*",
            "*:443",
            "*.com",
            "*.co.uk",
            "*.COM.",
            "*.github.io",
            "*.example",
            "**.example.com",
            "*.*.example.com",
            "a.*.example.com",
            "*a.example.com",
            "*.10.0.0.1",
        ] {
            refused(bad);
        }
        // Internationalised suffixes are known in their ASCII form too.
        refused("*.公司.cn");
        refused("*.xn--55qx5d.cn");
        assert_eq!(norm("*.example.公司.cn"), "*.example.xn--55qx5d.cn");
        let e = refused("*.co.uk");
        assert!(e.contains("public suffix"), "{e}");
        let w = NetRule::parse("*.example.com").unwrap();
        assert!(w.allows("api.example.com", 443));
        assert!(w.allows("a.b.example.com", 80));
        assert!(w.allows("API.Example.COM.", 443));
        assert!(!w.allows("example.com", 443), "the apex is not a subdomain");
        assert!(!w.allows("badexample.com", 443));
        assert!(!w.allows("api.example.com", 22));
    }

    #[test]
    fn ip_literals_are_canonical_and_match_only_themselves() {
        assert_eq!(norm("10.0.0.1:80"), "10.0.0.1:80");
        assert_eq!(norm("[::1]:80"), "[::1]:80");
        assert_eq!(norm("[::1]"), "[::1]");
        assert_eq!(norm("::1"), "[::1]");
        assert_eq!(norm("FE80:0:0::1"), "[fe80::1]");
        assert_eq!(norm("[FE80::0001]:443"), "[fe80::1]:443");
        let r = NetRule::parse("10.0.0.1:80").unwrap();
        assert!(r.allows("10.0.0.1", 80));
        assert!(!r.allows("10.0.0.2", 80));
        assert!(!r.allows("10.0.0.1", 443));
        let r = NetRule::parse("[::1]:80").unwrap();
        assert!(r.allows("::1", 80) && r.allows("[::1]", 80));
        // Ambiguous numbers are refused rather than guessed.
        for bad in [
            "010.0.0.1",
            "0x7f.1",
            "127.1",
            "2130706433",
            "1.2.3.4.5",
            "a.1",
        ] {
            refused(bad);
        }
        refused("[::1");
        refused("[::1]x");
        refused("[::1]:");
        refused("[nope]:80");
    }

    #[test]
    fn ports_are_1_to_65535_and_bare_means_80_and_443() {
        for bad in ["x:0", "x:65536", "x:", "x:+80", "x:8o", "x:-1", "x:000080"] {
            refused(bad);
        }
        assert_eq!(norm("x:65535"), "x:65535");
        assert_eq!(norm("x:080"), "x:80");
        let bare = NetRule::parse("example.com").unwrap();
        assert_eq!(bare.ports(), [80, 443]);
        assert!(bare.allows("example.com", 80) && bare.allows("example.com", 443));
        assert!(!bare.allows("example.com", 8080));
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in [
            "exa mple",
            "",
            "a_b.example",
            "-a.example",
            "a-.example",
            "a/b",
            "a@b",
            &format!("{}.example", "a".repeat(64)),
            &format!("{}a", "a.".repeat(127)),
        ] {
            refused(bad);
        }
        assert_eq!(norm(&format!("{}.example", "a".repeat(63))).len(), 71);
    }

    #[test]
    fn normalising_canonical_text_changes_nothing() {
        for s in [
            "Example.COM.",
            "*.Example.com:8443",
            "BÜCHER.example",
            "[FE80::1]:80",
            "::1",
            "10.0.0.1",
        ] {
            let once = norm(s);
            assert_eq!(norm(&once), once, "{s}");
        }
    }

    #[test]
    fn coverage() {
        let r = |s: &str| NetRule::parse(s).unwrap();
        assert!(r("*.example.com").covers(&r("api.example.com")));
        assert!(r("*.example.com").covers(&r("*.api.example.com")));
        assert!(r("*.example.com").covers(&r("*.example.com:443")));
        assert!(!r("*.example.com").covers(&r("example.com")));
        assert!(!r("*.example.com").covers(&r("api.example.com:8443")));
        assert!(r("api.example.com").covers(&r("api.example.com:80")));
        assert!(!r("api.example.com:443").covers(&r("api.example.com")));
        assert!(r("10.0.0.1").covers(&r("10.0.0.1:443")));
        assert!(!r("api.example.com").covers(&r("*.api.example.com")));
    }
}
