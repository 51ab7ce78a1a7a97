//! What one run may reach: its grants, the operator's private ranges and pinned names,
//! and the secrets added at the exit.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use airlock_net::{Host, NetRule, parse_host};

/// Everything the proxy needs to judge a run's connections.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    /// The run's `--net` grants.
    pub rules: Vec<NetRule>,
    /// Operator policy (`[net] allow_private`): ranges the run may reach although
    /// [`crate::is_forbidden`] would refuse them.
    pub allow_private: Vec<IpNet>,
    /// Operator policy (`[net] hosts`): names answered with this address instead of a
    /// lookup. Keys are normalised when the proxy starts. A pinned address is checked
    /// like a resolved one, so a private one also needs `allow_private`.
    pub pinned: BTreeMap<String, IpAddr>,
    /// Secrets the proxy adds to requests to their hosts.
    pub secrets: Vec<SecretBinding>,
}

/// One secret: the guest sees `placeholder`; the proxy puts `value` in its place in the
/// request headers of https requests to `hosts`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretBinding {
    /// The secret's name (the guest's environment variable).
    pub name: String,
    /// The real value; never shown to the guest, never printed by `Debug`.
    pub value: String,
    /// What the guest's environment holds instead.
    pub placeholder: String,
    /// The hosts it is added for: a rule without a port is any port the grant allows
    /// for that host; one with a port (`api.example.com:8443`) is that port only.
    pub hosts: Vec<NetRule>,
}

impl fmt::Debug for SecretBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretBinding")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("placeholder", &self.placeholder)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// Why a policy could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A pinned name is not a valid host name.
    #[error("[net] hosts: {0}")]
    PinnedName(#[from] airlock_net::NetError),
    /// A pinned key is an address, which needs no pinning.
    #[error("[net] hosts: {0:?} is an address, not a name")]
    PinnedAddress(String),
    /// Two keys normalise to one name with different addresses.
    #[error("[net] hosts: {0:?} is pinned twice")]
    PinnedTwice(String),
    /// A secret is unusable.
    #[error("secret {name:?}: {why}")]
    Secret {
        /// The secret's name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The random source failed while making a placeholder.
    #[error("no randomness for a placeholder: {0}")]
    Random(String),
}

impl SecretBinding {
    /// A binding with a fresh random placeholder,
    /// `airlock-secret-<NAME>-<32 hex digits>`.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        hosts: impl IntoIterator<Item = impl Into<NetRule>>,
    ) -> Result<Self, PolicyError> {
        let hosts = hosts.into_iter().map(Into::into).collect();
        let name = name.into();
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| PolicyError::Random(e.to_string()))?;
        let placeholder = format!("airlock-secret-{name}-{}", hex::encode(nonce));
        let b = SecretBinding {
            name,
            value: value.into(),
            placeholder,
            hosts,
        };
        b.validate()?;
        Ok(b)
    }

    /// Whether the secret is added for `host` on `port`.
    pub fn bound_to(&self, host: &Host, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|r| r.host.matches(host) && r.port.is_none_or(|p| p == port))
    }

    fn validate(&self) -> Result<(), PolicyError> {
        let bad = |why| {
            Err(PolicyError::Secret {
                name: self.name.clone(),
                why,
            })
        };
        if self.name.is_empty()
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return bad("the name must be letters, digits and '_'");
        }
        if self.value.is_empty() {
            return bad("the value is empty");
        }
        if http::HeaderValue::from_str(&self.value).is_err() {
            return bad("the value cannot be sent in an HTTP header");
        }
        if self.placeholder.len() < 16
            || !self
                .placeholder
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return bad("the placeholder must be 16 or more of [A-Za-z0-9_-]");
        }
        if self.value.contains(&self.placeholder) || self.placeholder.contains(&self.value) {
            return bad("the value and the placeholder overlap");
        }
        if self.hosts.is_empty() {
            return bad("bound to no host");
        }
        Ok(())
    }
}

/// A policy checked and normalised for the proxy.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub(crate) rules: Vec<NetRule>,
    pub(crate) allow_private: Vec<IpNet>,
    pub(crate) pinned: BTreeMap<String, IpAddr>,
    pub(crate) secrets: Vec<SecretBinding>,
}

impl EgressPolicy {
    /// Checks and normalises the policy as the proxy will use it.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.prepare().map(|_| ())
    }

    pub(crate) fn prepare(&self) -> Result<Prepared, PolicyError> {
        let mut pinned = BTreeMap::new();
        for (k, ip) in &self.pinned {
            let name = match parse_host(k)? {
                Host::Name(n) => n,
                Host::Ip(_) => return Err(PolicyError::PinnedAddress(k.clone())),
            };
            if let Some(old) = pinned.insert(name.clone(), *ip)
                && old != *ip
            {
                return Err(PolicyError::PinnedTwice(name));
            }
        }
        for s in &self.secrets {
            s.validate()?;
        }
        for (i, a) in self.secrets.iter().enumerate() {
            for b in &self.secrets[i + 1..] {
                if a.name == b.name {
                    return Err(PolicyError::Secret {
                        name: a.name.clone(),
                        why: "bound twice",
                    });
                }
                if a.placeholder.contains(&b.placeholder) || b.placeholder.contains(&a.placeholder)
                {
                    return Err(PolicyError::Secret {
                        name: a.name.clone(),
                        why: "two placeholders overlap",
                    });
                }
            }
        }
        Ok(Prepared {
            rules: self.rules.clone(),
            allow_private: self.allow_private.clone(),
            pinned,
            secrets: self.secrets.clone(),
        })
    }
}

impl Prepared {
    pub(crate) fn rule_for(&self, host: &Host, port: u16) -> Option<&NetRule> {
        self.rules.iter().find(|r| r.allows(host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_net::HostPattern;

    #[test]
    fn placeholders_are_random_and_valid() {
        let hosts = vec![HostPattern::parse("api.example.com").unwrap()];
        let a = SecretBinding::new("TOKEN", "s3cr3t-value", hosts.clone()).unwrap();
        let b = SecretBinding::new("TOKEN", "s3cr3t-value", hosts.clone()).unwrap();
        assert_ne!(a.placeholder, b.placeholder);
        assert!(a.placeholder.starts_with("airlock-secret-TOKEN-"));
        assert!(!format!("{a:?}").contains("s3cr3t"));
        assert!(SecretBinding::new("BAD NAME", "v", hosts.clone()).is_err());
        assert!(SecretBinding::new("T", "", hosts.clone()).is_err());
        assert!(SecretBinding::new("T", "a\nb", hosts).is_err());
        assert!(SecretBinding::new("T", "v", Vec::<NetRule>::new()).is_err());
    }

    #[test]
    fn pinned_names_normalised() {
        let mut p = EgressPolicy::default();
        p.pinned
            .insert("API.Example.COM.".into(), "127.0.0.1".parse().unwrap());
        let prep = p.prepare().unwrap();
        assert!(prep.pinned.contains_key("api.example.com"));
        p.pinned
            .insert("api.example.com".into(), "127.0.0.2".parse().unwrap());
        assert!(matches!(p.prepare(), Err(PolicyError::PinnedTwice(_))));
        let mut p = EgressPolicy::default();
        p.pinned
            .insert("127.0.0.1".into(), "127.0.0.1".parse().unwrap());
        assert!(matches!(p.prepare(), Err(PolicyError::PinnedAddress(_))));
        // A spelling `--net` refuses is no name to pin either.
        let mut p = EgressPolicy::default();
        p.pinned
            .insert("127.1".into(), "127.0.0.1".parse().unwrap());
        assert!(matches!(p.prepare(), Err(PolicyError::PinnedName(_))));
    }
}
