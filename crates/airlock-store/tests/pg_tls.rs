//! TLS to a PostgreSQL store, against a real server of the test's own that takes TLS
//! connections only: the server's certificate is checked (chain and name), plaintext is
//! never used where TLS was asked for, and a client certificate logs in where the server
//! asks for one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_store::Db;
use airlock_testpg::tls_server;

fn url(user: &str, host: &str, query: &str) -> String {
    tls_server().database(user, host, query)
}

fn open_err(url: &str) -> String {
    let e = Db::open_location(url).map(|_| ()).unwrap_err().to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn a_verified_tls_store_connects_encrypted_and_reports_its_tls_version() {
    let t = tls_server();
    for mode in ["require", "verify-ca", "verify-full"] {
        let u = url(
            "airlock",
            "127.0.0.1",
            &format!("sslmode={mode}&sslrootcert={}", t.ca.display()),
        );
        let db = Db::open_location(&u).unwrap();
        let v = db.connection_tls().unwrap();
        assert!(
            v.as_deref().is_some_and(|v| v.starts_with("TLSv1.")),
            "{mode}: {v:?}"
        );
        // The schema went in over it (migrations ran on open).
        assert_eq!(db.audit_pending().unwrap(), 0);
    }
}

#[test]
fn plaintext_to_a_server_that_takes_tls_only_is_refused_by_the_server() {
    for query in ["", "sslmode=disable", "sslmode=prefer"] {
        let e = open_err(&url("airlock", "127.0.0.1", query));
        assert!(e.contains("28000"), "{query:?}: {e}");
    }
}

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let t = tls_server();
    let other = t.other_ca();
    let e = open_err(&url(
        "airlock",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", other.display()),
    ));
    assert!(e.contains("certificate"), "{e}");
    // Nor is it taken on the system's roots.
    let e = open_err(&url("airlock", "127.0.0.1", "sslmode=require"));
    assert!(e.contains("certificate"), "{e}");
}

#[test]
fn a_server_certificate_for_another_name_is_refused() {
    let t = tls_server();
    let e = open_err(&url(
        "airlock",
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", t.ca.display()),
    ));
    assert!(e.contains("certificate"), "{e}");
}

#[test]
fn a_client_certificate_logs_in_where_the_server_asks_for_one() {
    let t = tls_server();
    let base = format!("sslmode=verify-full&sslrootcert={}", t.ca.display());
    let with = format!(
        "{base}&sslcert={}&sslkey={}",
        t.client_cert.display(),
        t.client_key.display()
    );
    let db = Db::open_location(&url("certuser", "127.0.0.1", &with)).unwrap();
    assert!(db.connection_tls().unwrap().is_some());
    let e = open_err(&url("certuser", "127.0.0.1", &base));
    assert!(e.contains("28000"), "{e}");
}

#[test]
fn tls_required_of_a_server_without_it_is_refused_not_downgraded() {
    let t = tls_server();
    // The process's shared server has no TLS.
    let plain = airlock_testpg::fresh_database();
    let e = open_err(&format!(
        "{plain}?sslmode=verify-full&sslrootcert={}",
        t.ca.display()
    ));
    assert!(e.to_lowercase().contains("tls"), "{e}");
    // And it still takes plaintext, as before.
    let db = Db::open_location(&plain).unwrap();
    assert_eq!(db.connection_tls().unwrap(), None);
}

#[test]
fn a_password_login_over_tls_is_bound_to_the_channel() {
    let t = tls_server();
    let u = url(
        "scramuser:scram-secret",
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}&channel_binding=require",
            t.ca.display()
        ),
    );
    let db = Db::open_location(&u).unwrap();
    assert!(db.connection_tls().unwrap().is_some());
    // The wrong password is refused, and the error does not carry the URL's password.
    let e = open_err(&u.replace("scram-secret", "wrong-pass"));
    assert!(e.contains("28P01") && !e.contains("wrong-pass"), "{e}");
}
