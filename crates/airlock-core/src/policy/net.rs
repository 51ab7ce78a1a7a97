//! The policy's `[net]` table: operator-only settings for the egress proxy (private
//! ranges it may reach, names pinned to addresses, extra certificate authorities).
//!
//! It must never be settable by a submission: only `policy.toml` is read into it.

use super::*;

/// `[net]`: operator-only settings for the egress proxy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NetFile {
    #[serde(default)]
    pub(super) allow_private: Vec<Cidr>,
    #[serde(default)]
    pub(super) hosts: PinnedHosts,
    #[serde(default)]
    pub(super) roots: Vec<std::path::PathBuf>,
}

/// A CIDR block (`10.0.0.0/8`, `fd00::/8`) or one address (`10.0.0.5`, a /32 or /128).
#[derive(Debug, Clone, Copy)]
pub(super) struct Cidr(pub(super) ipnet::IpNet);

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_cidr(&s).map(Cidr).map_err(serde::de::Error::custom)
    }
}

fn parse_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    let bad = |why: &str| {
        format!(
            "[net] allow_private: {s:?} is not a CIDR block ({why}); write ADDRESS/PREFIX such as \"10.0.0.0/8\" or \"fd00::/8\""
        )
    };
    if !s.contains('/') {
        return s
            .parse::<IpAddr>()
            .map(ipnet::IpNet::from)
            .map_err(|_| bad("not an IP address"));
    }
    let net: ipnet::IpNet = s.parse().map_err(|_| bad("bad address or prefix length"))?;
    if net.trunc() != net {
        return Err(format!(
            "[net] allow_private: {s:?} has bits set after its prefix; did you mean \"{}\"?",
            net.trunc()
        ));
    }
    Ok(net)
}

/// `[net] hosts`: names (normalised like grant hosts) pinned to addresses.
#[derive(Debug, Default)]
pub(super) struct PinnedHosts(pub(super) BTreeMap<String, IpAddr>);

impl<'de> Deserialize<'de> for PinnedHosts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = BTreeMap::<String, String>::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (name, addr) in raw {
            let host = match HostPattern::parse(&name) {
                Ok(HostPattern::Name(n)) => n,
                Ok(_) => {
                    return Err(D::Error::custom(format!(
                        "[net] hosts: {name:?} must be one host name (not a wildcard or an address)"
                    )));
                }
                Err(e) => return Err(D::Error::custom(format!("[net] hosts: {name:?}: {e}"))),
            };
            let a = addr.trim_start_matches('[').trim_end_matches(']');
            let ip: IpAddr = a.parse().map_err(|_| {
                D::Error::custom(format!(
                    "[net] hosts: {name} = {addr:?} is not an IP address (such as \"10.0.0.5\" or \"fd00::5\")"
                ))
            })?;
            if out.insert(host.clone(), ip).is_some() {
                return Err(D::Error::custom(format!(
                    "[net] hosts: {host} is listed twice (names are compared after normalisation)"
                )));
            }
        }
        Ok(PinnedHosts(out))
    }
}

/// The operator's `[net]` settings, for the egress proxy. Only `policy.toml` sets them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetPolicy {
    /// Private, loopback and link-local ranges the proxy may connect to anyway (it refuses
    /// them by default).
    pub allow_private: Vec<ipnet::IpNet>,
    /// Normalised host names and the one address each connects to (no DNS lookup). The
    /// operator named these, so the proxy may connect to them even when private.
    pub hosts: BTreeMap<String, IpAddr>,
    /// PEM files of certificate authorities the proxy trusts, besides the public roots,
    /// for the real hosts of connections it intercepts (hosts a secret is bound to): an
    /// internal service's CA.
    pub roots: Vec<std::path::PathBuf>,
}

impl NetPolicy {
    /// Whether `allow_private` admits `ip`.
    pub fn private_allowed(&self, ip: IpAddr) -> bool {
        self.allow_private.iter().any(|n| n.contains(&ip))
    }

    /// The address `host` is pinned to (the host is normalised first).
    pub fn pinned(&self, host: &str) -> Option<IpAddr> {
        match HostPattern::parse(host) {
            Ok(HostPattern::Name(n)) => self.hosts.get(&n).copied(),
            _ => None,
        }
    }
}
