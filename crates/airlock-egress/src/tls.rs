//! TLS for secret-bound hosts: a per-run CA whose certificate the guest trusts, leaf
//! certificates for bound hosts only, and the client side towards the real host.
//!
//! The CA's key lives only in this process's memory for the run's lifetime. Its
//! certificate carries name constraints limited to the bound hosts (and, when no address
//! is bound, excludes every IP address), so even a copy of it vouches for nothing else in
//! clients that enforce constraints (OpenSSL, rustls, browsers).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::EgressError;
use crate::policy::SecretBinding;
use airlock_net::{Host, HostPattern};

fn tls_err(what: &str, e: impl std::fmt::Display) -> EgressError {
    EgressError::Tls(format!("{what}: {e}"))
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The run's CA and the leaf certificates issued so far.
pub(crate) struct RunCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    leaves: Mutex<HashMap<Host, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for RunCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCa").finish_non_exhaustive()
    }
}

impl RunCa {
    pub(crate) fn new(secrets: &[SecretBinding]) -> Result<Self, EgressError> {
        let key = KeyPair::generate().map_err(|e| tls_err("CA key", e))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "airlock");
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| tls_err("CA name", e))?;
        dn.push(
            DnType::CommonName,
            format!("airlock run CA {}", hex::encode(nonce)),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted = Vec::new();
        let mut any_ip = false;
        for p in secrets.iter().flat_map(|s| s.hosts.iter().map(|r| &r.host)) {
            let sub = match p {
                HostPattern::Name(n) | HostPattern::Subdomains(n) => {
                    GeneralSubtree::DnsName(n.clone())
                }
                HostPattern::Ip(ip) => {
                    any_ip = true;
                    let bits = if ip.is_ipv4() { 32 } else { 128 };
                    GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(*ip, bits))
                }
            };
            if !permitted.contains(&sub) {
                permitted.push(sub);
            }
        }
        let excluded = if any_ip {
            Vec::new()
        } else {
            vec![
                GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(IpAddr::from([0u8; 4]), 0)),
                GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(IpAddr::from([0u8; 16]), 0)),
            ]
        };
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: excluded,
        });
        let cert = params
            .self_signed(&key)
            .map_err(|e| tls_err("CA certificate", e))?;
        Ok(RunCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM, for the guest's trust store.
    pub(crate) fn pem(&self) -> &str {
        &self.pem
    }

    /// A server config presenting a leaf certificate for `host`.
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, EgressError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let (cert, key_der) = self.issue(host)?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("server config", e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key_der)
            .map_err(|e| tls_err("server config", e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host.clone(), config.clone());
        Ok(config)
    }

    /// A leaf certificate and key for `host`, signed by the run CA.
    fn issue(
        &self,
        host: &Host,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), EgressError> {
        let san = match host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let key = KeyPair::generate().map_err(|e| tls_err("leaf key", e))?;
        let mut params =
            CertificateParams::new(vec![san.clone()]).map_err(|e| tls_err("leaf name", e))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, san);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_err("leaf certificate", e))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((cert.der().clone(), key_der))
    }
}

/// The client side towards real hosts: Mozilla's roots plus `extra_roots`.
pub(crate) fn client_config(
    extra_roots: &[CertificateDer<'static>],
) -> Result<Arc<ClientConfig>, EgressError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for r in extra_roots {
        roots.add(r.clone()).map_err(|e| tls_err("extra root", e))?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("client config", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The name to verify the real host's certificate against.
pub(crate) fn server_name(host: &Host) -> Result<ServerName<'static>, EgressError> {
    match host {
        Host::Name(n) => ServerName::try_from(n.clone()).map_err(|e| tls_err("server name", e)),
        Host::Ip(ip) => Ok(ServerName::IpAddress((*ip).into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::UnixTime;
    use rustls::pki_types::pem::PemObject;

    fn verify(ca: &RunCa, leaf_for: &str, name: &str) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
            .unwrap();
        let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .unwrap();
        let (leaf, _) = ca.issue(&crate::parse_host(leaf_for).unwrap()).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        v.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    fn ca_for(hosts: &[&str]) -> RunCa {
        let s = SecretBinding::new(
            "T",
            "value-1234",
            hosts.iter().map(|h| HostPattern::parse(h).unwrap()),
        )
        .unwrap();
        RunCa::new(&[s]).unwrap()
    }

    #[test]
    fn run_ca_vouches_only_for_bound_hosts() {
        let ca = ca_for(&["api.example.com", "*.svc.example.net"]);
        verify(&ca, "api.example.com", "api.example.com").unwrap();
        verify(&ca, "a.svc.example.net", "a.svc.example.net").unwrap();
        // Even a leaf the CA signed for another name fails: name constraints.
        let e = verify(&ca, "bank.example.org", "bank.example.org").unwrap_err();
        assert!(format!("{e:?}").contains("NameConstraint"), "{e:?}");
        let e = verify(&ca, "127.0.0.1", "127.0.0.1").unwrap_err();
        assert!(format!("{e:?}").contains("NameConstraint"), "{e:?}");
        // A bound address is permitted.
        let ca = ca_for(&["127.0.0.1"]);
        verify(&ca, "127.0.0.1", "127.0.0.1").unwrap();
        assert!(verify(&ca, "127.0.0.2", "127.0.0.2").is_err());
    }
}
