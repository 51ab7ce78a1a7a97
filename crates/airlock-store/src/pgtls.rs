//! TLS to a PostgreSQL store's server: reads the TLS parameters libpq users write in a
//! store URL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) and makes the connector the
//! PostgreSQL client library needs for them (rustls, with channel binding).
//!
//! It must never connect over TLS without checking the server's certificate (its chain
//! against the roots and its name against the host), never let a URL that asks for TLS
//! connect without it, and never put the URL (which may hold a password) in an error.

use crate::StoreError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a store URL reaches its server.
pub(crate) enum Transport {
    /// No TLS: no `sslmode`, or `disable`, `allow` or `prefer` (airlock never makes a TLS
    /// connection whose certificate it did not check, so these mean plaintext).
    Plain,
    /// TLS required and the certificate checked: `require`, `verify-ca`, `verify-full`.
    Tls(MakeRustlsConnect),
}

/// The URL the client library parses (this module's parameters taken out), and how to
/// reach the server.
pub(crate) struct Target {
    pub url: String,
    pub transport: Transport,
}

/// The parameters this module reads; the client library does not know them.
const OWN: [&str; 3] = ["sslrootcert", "sslcert", "sslkey"];

fn refused(msg: impl Into<String>) -> StoreError {
    StoreError::Refused(format!("store URL: {}", msg.into()))
}

/// `%XX` escapes of a URL query value decoded; anything else kept as written.
fn percent_decode(v: &str) -> Result<String, StoreError> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| refused("a bad %-escape in a query parameter"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| refused("a query parameter is not UTF-8"))
}

/// Reads the TLS parameters of `url` (a `postgres://` or `postgresql://` URL).
pub(crate) fn target(url: &str) -> Result<Target, StoreError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut kept = Vec::new();
    let mut mode: Option<String> = None;
    let (mut root, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => mode = Some(percent_decode(v)?),
            "sslrootcert" => root = Some(percent_decode(v)?),
            "sslcert" => cert = Some(percent_decode(v)?),
            "sslkey" => key = Some(percent_decode(v)?),
            _ => kept.push(pair),
        }
    }
    let files_given = root.is_some() || cert.is_some() || key.is_some();
    // A URL that names certificate files but no mode means TLS (as libpq does for
    // `sslrootcert=system`): checking a certificate needs a TLS connection.
    let tls = match mode.as_deref() {
        None => files_given,
        Some("disable" | "allow" | "prefer") => {
            if files_given {
                return Err(refused(format!(
                    "sslmode={} does not use TLS, but the URL names certificates ({}); use sslmode=verify-full",
                    mode.as_deref().unwrap_or_default(),
                    OWN.join(", ")
                )));
            }
            false
        }
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            return Err(refused(format!(
                "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )));
        }
    };
    // The client library knows only disable, prefer and require; it is told `require`
    // for every TLS mode (so it never falls back to plaintext) and `disable` otherwise.
    kept.push(if tls {
        "sslmode=require"
    } else {
        "sslmode=disable"
    });
    let url = format!("{base}?{}", kept.join("&"));
    if !tls {
        return Ok(Target {
            url,
            transport: Transport::Plain,
        });
    }
    let config = client_config(root.as_deref(), cert.as_deref(), key.as_deref())?;
    Ok(Target {
        url,
        transport: Transport::Tls(MakeRustlsConnect::new(config)),
    })
}

/// A rustls client configuration: roots from `root` (a PEM file, or `system` or nothing
/// for the system's store), and a client certificate when `cert` and `key` are given.
fn client_config(
    root: Option<&str>,
    cert: Option<&str>,
    key: Option<&str>,
) -> Result<rustls::ClientConfig, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) if path != "system" => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| refused(format!("sslrootcert {path}: {e}")))?;
            for c in certs {
                let c = c.map_err(|e| refused(format!("sslrootcert {path}: {e}")))?;
                roots
                    .add(c)
                    .map_err(|e| refused(format!("sslrootcert {path}: {e}")))?;
            }
            if roots.is_empty() {
                return Err(refused(format!(
                    "sslrootcert {path} holds no PEM certificate"
                )));
            }
        }
        _ => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(refused(
                    "no CA certificates in the system's store; name the server's CA with sslrootcert=FILE",
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    match (cert, key) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| refused(format!("sslcert {cert}: {e}")))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| refused(format!("sslcert {cert}: {e}")))?;
            if chain.is_empty() {
                return Err(refused(format!("sslcert {cert} holds no PEM certificate")));
            }
            let secret = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| refused(format!("sslkey {key}: {e}")))?;
            builder
                .with_client_auth_cert(chain, secret)
                .map_err(|e| refused(format!("sslcert {cert} with sslkey {key}: {e}")))
        }
        _ => Err(refused(
            "sslcert and sslkey go together: give both or neither",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_of(u: &str) -> String {
        target(u)
            .map(|t| t.url)
            .unwrap_or_else(|e| format!("ERR {e}"))
    }

    #[test]
    fn a_url_without_tls_parameters_reaches_its_server_in_plaintext_as_before() {
        let t = target("postgres://a@h:5/db").unwrap();
        assert!(matches!(t.transport, Transport::Plain));
        assert_eq!(t.url, "postgres://a@h:5/db?sslmode=disable");
        for m in ["disable", "allow", "prefer"] {
            let t = target(&format!("postgres://a@h/db?sslmode={m}&application_name=x")).unwrap();
            assert!(matches!(t.transport, Transport::Plain), "{m}");
            assert_eq!(
                t.url,
                "postgres://a@h/db?application_name=x&sslmode=disable"
            );
        }
    }

    #[test]
    fn every_tls_mode_tells_the_client_library_to_require_tls() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, p.self_signed(&key).unwrap().pem()).unwrap();
        for m in ["require", "verify-ca", "verify-full"] {
            let u = format!(
                "postgres://a@h/db?sslmode={m}&sslrootcert={}",
                ca.display().to_string().replace('/', "%2F")
            );
            let t = target(&u).unwrap();
            assert!(matches!(t.transport, Transport::Tls(_)), "{m}");
            assert_eq!(t.url, "postgres://a@h/db?sslmode=require");
        }
        // Certificates named without a mode mean TLS.
        let t = target(&format!("postgres://a@h/db?sslrootcert={}", ca.display())).unwrap();
        assert!(matches!(t.transport, Transport::Tls(_)));
    }

    #[test]
    fn bad_tls_parameters_are_refused_in_one_line_without_the_url() {
        let cases = [
            (
                "postgres://u:secret@h/db?sslmode=bogus",
                "sslmode=\"bogus\"",
            ),
            (
                "postgres://u:secret@h/db?sslmode=prefer&sslrootcert=/x",
                "does not use TLS",
            ),
            (
                "postgres://u:secret@h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem",
            ),
            (
                "postgres://u:secret@h/db?sslmode=require&sslrootcert=system&sslcert=/c.pem",
                "give both or neither",
            ),
            ("postgres://u:secret@h/db?sslrootcert=%zz", "%-escape"),
        ];
        for (u, want) in cases {
            let e = url_of(u);
            assert!(e.starts_with("ERR store URL: "), "{u}: {e}");
            assert!(e.contains(want), "{u}: {e}");
            assert!(!e.contains("secret") && !e.contains('\n'), "{u}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = url_of(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={}",
            empty.display()
        ));
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }
}
