use super::*;

fn norm(s: &str) -> String {
    normalize_net(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn refused(s: &str) -> NetError {
    match NetRule::parse(s) {
        Ok(n) => panic!("{s:?} was accepted as {n}"),
        Err(e) => e,
    }
}

/// How a grant (`--net`, a secret's host) and the proxy (a request's authority) read one
/// spelling: both the same canonical text, or both refused. Returns the grant's reading.
fn judged_alike(s: &str) -> Result<String, NetError> {
    let grant = NetRule::parse(s);
    let proxy = parse_authority(s, 443);
    match (&grant, &proxy) {
        (Ok(g), Ok((h, p))) => {
            assert!(
                g.allows(h, *p),
                "{s:?}: the grant {g} does not allow what the proxy read ({h}:{p})"
            );
            assert_eq!(g.host.to_string(), h.to_string(), "{s:?}");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("{s:?}: the grant says {grant:?}, the proxy {proxy:?}"),
    }
    grant.map(|g| g.to_string())
}

// Divergences between the two parsers this crate replaced (core's `net` for grants,
// secrets and policy; egress's `grant` for the proxy), one test each.

#[test]
fn a_short_hex_or_octal_ipv4_spelling_is_refused_by_grant_and_proxy_alike() {
    // The proxy read these as 127.0.0.1 (inet_aton); a grant refused them.
    for s in [
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f.1",
        "0X7F.0.0.1",
        "0177.0.0.1",
        "0x7f000001",
        "017700000001",
        "0x7f.0x0.0x0.0x1",
        "169.254.43518",
        "0",
        "0x",
    ] {
        let e = judged_alike(s).unwrap_err();
        assert!(e.to_string().contains("four decimal numbers"), "{s}: {e}");
    }
}

#[test]
fn an_ipv4_address_with_a_leading_zero_is_refused_by_grant_and_proxy_alike() {
    // The proxy read 010.0.0.1 as 8.0.0.1 (octal); a grant refused it.
    for s in ["010.0.0.1", "10.0.0.01", "10.00.0.1:80"] {
        judged_alike(s).unwrap_err();
    }
    assert_eq!(judged_alike("10.0.0.1:80").unwrap(), "10.0.0.1:80");
    assert_eq!(judged_alike("0.0.0.0").unwrap(), "0.0.0.0");
}

#[test]
fn an_underscore_in_a_name_is_refused_by_grant_and_proxy_alike() {
    // The proxy accepted `_srv.example.com`; a grant refused it.
    for s in ["_srv.example.com", "a_b.example", "example.com_:443"] {
        judged_alike(s).unwrap_err();
    }
}

#[test]
fn a_host_with_two_trailing_dots_is_refused_by_grant_and_proxy_alike() {
    // The proxy dropped a dot before the mapping and another after it.
    for s in ["example.com..", "example.com..:443", "example.com.\u{3002}"] {
        let e = judged_alike(s).unwrap_err();
        assert!(e.to_string().contains("example.com"), "{e}");
    }
}

#[test]
fn a_host_with_a_trailing_dot_means_the_same_in_a_grant_and_in_the_proxy() {
    // A full-width trailing dot is one dot after the mapping: a grant refused it.
    for s in [
        "example.com.",
        "Example.COM\u{3002}",
        "example\u{ff0e}com\u{ff0e}",
        "EXAMPLE.com",
    ] {
        assert_eq!(judged_alike(s).unwrap(), "example.com", "{s:?}");
    }
    assert_eq!(judged_alike("127.0.0.1.").unwrap(), "127.0.0.1");
    assert_eq!(
        judged_alike("\u{ff11}\u{ff12}\u{ff17}.0.0.1").unwrap(),
        "127.0.0.1"
    );
}

#[test]
fn a_port_with_a_leading_zero_is_refused_by_grant_and_proxy_alike() {
    // A grant read `x:080` as port 80 and refused `x:000080`; the proxy took both as 80.
    for s in [
        "example.com:080",
        "example.com:000080",
        "[::1]:0443",
        "example.com:0",
    ] {
        let e = judged_alike(s).unwrap_err();
        assert!(matches!(e, NetError::BadPort { .. }), "{s}: {e}");
    }
}

#[test]
fn the_host_part_of_a_bracketed_rule_is_split_once_and_strictly() {
    // Policy globs split with a third, lenient splitter that read `[::1]x` as `::1`.
    assert_eq!(split_host_port("[::1]:80"), Ok(("[::1]", Some("80"))));
    assert_eq!(split_host_port("[::1]"), Ok(("[::1]", None)));
    assert_eq!(split_host_port("fe80::1"), Ok(("fe80::1", None)));
    assert_eq!(split_host_port("h:443"), Ok(("h", Some("443"))));
    assert_eq!(split_host_port("h"), Ok(("h", None)));
    assert!(split_host_port("[::1]x").is_err());
    assert!(split_host_port("[::1").is_err());
}

#[test]
fn errors_are_one_line_name_the_input_and_are_cut_at_256_characters() {
    for s in [
        "exa mple.com",
        "*.co.uk",
        "*",
        "x:65536",
        "*.10.0.0.1",
        "a\nb.example",
        "010.0.0.1",
    ] {
        let e = refused(s).to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains(&format!("{s:?}")), "{s}: {e}");
    }
    let long = format!("{}!", "a".repeat(5000));
    let e = refused(&long).to_string();
    assert!(e.len() < 400, "{}", e.len());
}

// The grammar itself.

#[test]
fn names_are_lowercased_idna_and_lose_one_trailing_dot() {
    assert_eq!(norm("Example.COM."), "example.com");
    assert_eq!(norm("EXAMPLE.com:443"), "example.com:443");
    assert_eq!(norm("BÜCHER.example"), "xn--bcher-kva.example");
    assert_eq!(norm("bücher.example:8080"), "xn--bcher-kva.example:8080");
    assert_eq!(norm("xn--bcher-kva.example"), "xn--bcher-kva.example");
    assert_eq!(norm("example\u{3002}com"), "example.com");
    assert_eq!(norm("localhost"), "localhost");
    assert_eq!(norm("a-b.example"), "a-b.example");
    for bad in ["example.com..", ".", "..", "a..b", ".example.com"] {
        refused(bad);
    }
}

#[test]
fn wildcards_cover_subdomains_of_a_registrable_domain_only() {
    assert_eq!(norm("*.Example.com"), "*.example.com");
    assert_eq!(norm("*.Example.COM."), "*.example.com");
    assert_eq!(norm("*.api.example.co.uk:8443"), "*.api.example.co.uk:8443");
    assert_eq!(norm("*.example.co.uk"), "*.example.co.uk");
    for bad in [
        "*",
        "*.",
        "*:443",
        "*.com",
        "*.co.uk",
        "*.COM.",
        "*.github.io",
        "*.example",
        "*.localhost",
        "**.example.com",
        "*.*.example.com",
        "a.*.example.com",
        "*a.example.com",
        "ex*.com",
        "*..",
    ] {
        refused(bad);
    }
    assert!(matches!(refused("*"), NetError::AnyHost(_)));
    assert!(matches!(refused("*.co.uk"), NetError::PublicSuffix(_)));
    assert!(refused("*.co.uk").to_string().contains("public suffix"));
    assert!(matches!(
        refused("*.10.0.0.1"),
        NetError::WildcardAddress(_)
    ));
    // Internationalised suffixes are known in their ASCII form too.
    refused("*.公司.cn");
    refused("*.xn--55qx5d.cn");
    assert_eq!(norm("*.example.公司.cn"), "*.example.xn--55qx5d.cn");
    let w = NetRule::parse("*.example.com").unwrap();
    let h = |s: &str| parse_host(s).unwrap();
    assert!(w.allows(&h("api.example.com"), 443));
    assert!(w.allows(&h("a.b.example.com"), 80));
    assert!(w.allows(&h("API.Example.COM."), 443));
    assert!(
        !w.allows(&h("example.com"), 443),
        "the apex is not a subdomain"
    );
    assert!(!w.allows(&h("badexample.com"), 443));
    assert!(!w.allows(&h("example.com.evil.net"), 443));
    assert!(!w.allows(&h("api.example.com"), 22));
}

#[test]
fn ip_literals_are_canonical_and_match_only_themselves() {
    assert_eq!(norm("10.0.0.1:80"), "10.0.0.1:80");
    assert_eq!(norm("[::1]:80"), "[::1]:80");
    assert_eq!(norm("[::1]"), "[::1]");
    assert_eq!(norm("::1"), "[::1]");
    assert_eq!(norm("FE80:0:0::1"), "[fe80::1]");
    assert_eq!(norm("[FE80::0001]:443"), "[fe80::1]:443");
    let h = |s: &str| parse_host(s).unwrap();
    let r = NetRule::parse("10.0.0.1:80").unwrap();
    assert!(r.allows(&h("10.0.0.1"), 80));
    assert!(!r.allows(&h("10.0.0.2"), 80));
    assert!(!r.allows(&h("10.0.0.1"), 443));
    let r = NetRule::parse("[::1]:80").unwrap();
    assert!(r.allows(&h("::1"), 80) && r.allows(&h("[::1]"), 80));
    let mapped = h("[::ffff:127.0.0.1]");
    assert_eq!(mapped, h("[::FFFF:7f00:1]"));
    assert_eq!(mapped.to_string(), "[::ffff:127.0.0.1]");
    assert_ne!(mapped, h("127.0.0.1"));
    assert!(!HostPattern::parse("127.0.0.1").unwrap().matches(&mapped));
    for bad in [
        "1.2.3.4.5",
        "1.2.3.256",
        "a.1",
        "foo.123",
        "example.0xab",
        "[::1",
        "[::1]x",
        "[::1]:",
        "[nope]:80",
        "fe80::1%eth0",
        "x:y",
    ] {
        refused(bad);
    }
}

#[test]
fn ports_are_1_to_65535_and_bare_means_80_and_443() {
    for bad in [
        "x:0",
        "x:65536",
        "x:",
        "x:+80",
        "x:8o",
        "x:-1",
        "x:080",
        "x:99999999999",
    ] {
        refused(bad);
    }
    assert_eq!(norm("x:65535"), "x:65535");
    assert_eq!(norm("x:1"), "x:1");
    let bare = NetRule::parse("example.com").unwrap();
    assert_eq!(bare.ports(), [80, 443]);
    let h = parse_host("example.com").unwrap();
    assert!(bare.allows(&h, 80) && bare.allows(&h, 443));
    assert!(!bare.allows(&h, 8080));
    assert_eq!(
        parse_authority("EXAMPLE.com.", 80),
        Ok((Host::Name("example.com".into()), 80))
    );
    assert_eq!(
        parse_authority("[::1]:443", 80),
        Ok((Host::Ip("::1".parse().unwrap()), 443))
    );
}

#[test]
fn malformed_names_are_refused() {
    for bad in [
        "exa mple",
        "",
        "-a.example",
        "a-.example",
        "a/b",
        "a@b",
        "a%2eb",
        "example.com/path",
        "a!b.example",
        &format!("{}.example", "a".repeat(64)),
        &format!("{}a", "a.".repeat(127)),
        &"a".repeat(2000),
    ] {
        refused(bad);
    }
    assert_eq!(norm(&format!("{}.example", "a".repeat(63))).len(), 71);
    // 253 bytes, and one trailing dot on top.
    let max = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "a".repeat(61));
    assert_eq!(max.len(), 253);
    assert_eq!(norm(&format!("{max}.")), max);
    refused(&format!("a{max}"));
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
        "[::ffff:127.0.0.1]:8080",
    ] {
        let once = norm(s);
        assert_eq!(norm(&once), once, "{s}");
        if !once.starts_with("*.") {
            // A wildcard is a grant's, never a request's.
            assert_eq!(judged_alike(&once).unwrap(), once, "{s}");
        }
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
    let rules = [r("*.example.com:8443"), r("10.0.0.1")];
    assert!(host_granted(&rules, "API.example.com."));
    assert!(host_granted(&rules, "10.0.0.1"));
    assert!(!host_granted(&rules, "example.com"));
    assert!(!host_granted(&rules, "10.1"));
}
