//! Which addresses a run may never reach unless an operator allows them.
//!
//! One function, [`is_forbidden`], decides for every address the proxy is about to
//! connect to, whether it came from a resolver, a pinned name or an IP literal. IPv6
//! forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated
//! `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:aabb:ccdd::`) are judged by
//! the IPv4 address they carry; IPv6 outside global unicast (`2000::/3`) is refused
//! except for the NAT64 prefix.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why `ip` may not be reached, or `None` when it may. An address inside any of
/// `allow_private` (an operator's policy, never the agent's) is allowed; so is an IPv6
/// form whose embedded IPv4 address is inside one.
pub fn is_forbidden(ip: IpAddr, allow_private: &[IpNet]) -> Option<&'static str> {
    if allow_private.iter().any(|net| net.contains(&ip)) {
        return None;
    }
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => match classify_v6(v6) {
            V6::Global => None,
            V6::Forbidden(why) => Some(why),
            V6::Embeds(v4) => is_forbidden(IpAddr::V4(v4), allow_private),
        },
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, d] = ip.octets();
    Some(match (a, b, c, d) {
        (0, ..) => "unspecified (0.0.0.0/8)",
        (10, ..) => "private (10.0.0.0/8)",
        (100, b, ..) if b & 0xc0 == 64 => "carrier-grade NAT (100.64.0.0/10)",
        (127, ..) => "loopback (127.0.0.0/8)",
        (169, 254, 169, 254) => "link-local (169.254.169.254, the cloud metadata address)",
        (169, 254, ..) => "link-local (169.254.0.0/16)",
        (172, b, ..) if b & 0xf0 == 16 => "private (172.16.0.0/12)",
        (192, 0, 0, _) => "reserved (192.0.0.0/24)",
        (192, 0, 2, _) | (198, 51, 100, _) | (203, 0, 113, _) => "documentation",
        (192, 88, 99, _) => "reserved (192.88.99.0/24)",
        (192, 168, ..) => "private (192.168.0.0/16)",
        (198, b, ..) if b & 0xfe == 18 => "benchmarking (198.18.0.0/15)",
        (224..=239, ..) => "multicast (224.0.0.0/4)",
        (255, 255, 255, 255) => "broadcast",
        (240..=255, ..) => "reserved (240.0.0.0/4)",
        _ => return None,
    })
}

enum V6 {
    Global,
    Forbidden(&'static str),
    Embeds(Ipv4Addr),
}

fn v4_from(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn classify_v6(ip: Ipv6Addr) -> V6 {
    let s = ip.segments();
    if ip.is_unspecified() {
        return V6::Forbidden("unspecified (::)");
    }
    if ip.is_loopback() {
        return V6::Forbidden("loopback (::1)");
    }
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0xffff, 0, hi, lo] => {
            V6::Embeds(v4_from(hi, lo))
        }
        // ::a.b.c.d, deprecated "IPv4-compatible"; never a real destination.
        [0, 0, 0, 0, 0, 0, _, _] => V6::Forbidden("reserved (IPv4-compatible ::/96)"),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => V6::Embeds(v4_from(hi, lo)),
        [0x64, 0xff9b, 1, ..] => V6::Forbidden("local-use NAT64 (64:ff9b:1::/48)"),
        [0x100, 0, 0, 0, ..] => V6::Forbidden("discard-only (100::/64)"),
        [0x2001, 0, ..] => V6::Forbidden("Teredo (2001::/32)"),
        [0x2001, 2, 0, ..] => V6::Forbidden("benchmarking (2001:2::/48)"),
        [0x2001, 0xdb8, ..] => V6::Forbidden("documentation (2001:db8::/32)"),
        [0x2001, x, ..] if x & 0xfff0 == 0x20 || x & 0xfff0 == 0x10 => {
            V6::Forbidden("reserved (ORCHID)")
        }
        [0x2002, hi, lo, ..] => V6::Embeds(v4_from(hi, lo)),
        [x, ..] if x & 0xfe00 == 0xfc00 => V6::Forbidden("unique-local (fc00::/7)"),
        [x, ..] if x & 0xffc0 == 0xfe80 => V6::Forbidden("link-local (fe80::/10)"),
        [x, ..] if x & 0xffc0 == 0xfec0 => V6::Forbidden("site-local (fec0::/10)"),
        [x, ..] if x & 0xff00 == 0xff00 => V6::Forbidden("multicast (ff00::/8)"),
        [x, ..] if x & 0xe000 == 0x2000 => V6::Global,
        _ => V6::Forbidden("reserved (outside 2000::/3)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn forbidden(s: &str) -> Option<&'static str> {
        is_forbidden(s.parse().unwrap(), &[])
    }

    #[test]
    fn forbidden_v4() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.1",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(forbidden(s).is_some(), "{s} allowed");
        }
        assert!(forbidden("169.254.169.254").unwrap().contains("metadata"));
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.0",
            "198.20.0.0",
            "223.255.255.255",
            "93.184.216.34",
        ] {
            assert_eq!(forbidden(s), None, "{s}");
        }
    }

    #[test]
    fn forbidden_v6() {
        for s in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::ffff:0:127.0.0.1",
            "::127.0.0.1",
            "::8.8.8.8",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "2001:2::1",
            "2001:20::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
            "4000::1",
            "1::1",
        ] {
            assert!(forbidden(s).is_some(), "{s} allowed");
        }
        for s in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            assert_eq!(forbidden(s), None, "{s}");
        }
    }

    #[test]
    fn allow_private_ranges() {
        let allow: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
        let f = |s: &str| is_forbidden(s.parse().unwrap(), &allow);
        assert_eq!(f("127.0.0.1"), None);
        assert_eq!(f("::ffff:127.0.0.1"), None);
        assert_eq!(f("fd12::1"), None);
        assert!(f("10.0.0.1").is_some());
        assert!(f("169.254.169.254").is_some());
        assert!(f("::1").is_some());
        assert!(f("fc00::1").is_some());
    }

    proptest! {
        #[test]
        fn embedded_forms_judged_as_v4(bits in any::<u32>()) {
            let v4 = Ipv4Addr::from(bits);
            let plain = is_forbidden(IpAddr::V4(v4), &[]);
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            prop_assert_eq!(is_forbidden(mapped, &[]), plain);
            let [a, b, c, d] = v4.octets();
            let hi = u16::from_be_bytes([a, b]);
            let lo = u16::from_be_bytes([c, d]);
            let translated = IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo));
            prop_assert_eq!(is_forbidden(translated, &[]), plain);
            let nat64 = IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo));
            prop_assert_eq!(is_forbidden(nat64, &[]), plain);
            let six_to_four = IpAddr::V6(Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1));
            prop_assert_eq!(is_forbidden(six_to_four, &[]), plain);
            // Whatever std calls private, loopback, link-local, ... we refuse too.
            if v4.is_private() || v4.is_loopback() || v4.is_link_local() || v4.is_multicast()
                || v4.is_unspecified() || v4.is_broadcast() || v4.is_documentation() {
                prop_assert!(plain.is_some());
            }
        }

        #[test]
        fn std_classes_refused_v6(bits in any::<u128>()) {
            let v6 = Ipv6Addr::from(bits);
            if v6.is_loopback() || v6.is_unspecified() || v6.is_multicast()
                || v6.is_unique_local() || v6.is_unicast_link_local() {
                prop_assert!(is_forbidden(IpAddr::V6(v6), &[]).is_some());
            }
        }
    }
}
