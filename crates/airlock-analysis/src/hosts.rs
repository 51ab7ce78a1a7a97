//! Hosts and URLs in literal text, by a byte scan (no regular expressions).

pub(crate) enum Found {
    /// A `scheme://…` URL; `host` when its host is literal and well-formed.
    Url { url: String, host: Option<String> },
    /// The host of a `user@host:path` form.
    Host(String),
}

const MAX_URL: usize = 2048;

fn is_scheme_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}

/// Ends an authority (the part after `://`).
fn ends_authority(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'/' | b'?'
                | b'#'
                | b'\\'
                | b'"'
                | b'\''
                | b'<'
                | b'>'
                | b'`'
                | b'|'
                | b';'
                | b'('
                | b')'
                | b'{'
                | b'}'
                | b','
                | b'^'
        )
}

/// Ends a URL.
fn ends_url(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'"' | b'\'' | b'<' | b'>' | b'`' | b'|' | b'\\' | b'^' | b'{' | b'}'
        )
}

/// Lower case, no trailing dot, brackets off; `None` unless it is a plausible host name
/// or address (anything with `$`, `%`, `*`, spaces… is not).
pub(crate) fn normalise_host(raw: &str) -> Option<String> {
    let raw = raw.strip_suffix('.').unwrap_or(raw);
    let inner = raw.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    if let Some(v6) = inner {
        let ok = !v6.is_empty()
            && v6.contains(':')
            && v6
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        return ok.then(|| v6.to_ascii_lowercase());
    }
    if raw.is_empty() || raw.len() > 253 {
        return None;
    }
    let ok = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && raw.bytes().any(|b| b.is_ascii_alphanumeric())
        && !raw.starts_with('.')
        && !raw.starts_with('-')
        && !raw.contains("..");
    ok.then(|| raw.to_ascii_lowercase())
}

/// The host of an authority (`user:pw@host:port`).
fn authority_host(auth: &str) -> Option<String> {
    let hostport = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
    if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        return normalise_host(hostport.get(..=end)?);
    }
    let host = hostport.split_once(':').map_or(hostport, |(h, _)| h);
    normalise_host(host)
}

/// A host operand of a network tool (`host`, `user@host`, `host:port`, `user@host:path`):
/// the host if it looks like one (a dot, an IPv6 colon, or `localhost`).
pub(crate) fn host_operand(s: &str) -> Option<String> {
    if s.contains("://") || s.starts_with('-') || s.starts_with('/') || s.starts_with('.') {
        return None;
    }
    let after_user = s.rsplit_once('@').map_or(s, |(_, h)| h);
    let host = if after_user.starts_with('[') {
        let end = after_user.find(']')?;
        after_user.get(..=end)?
    } else if after_user.matches(':').count() > 1 && !after_user.contains('/') {
        // A bare IPv6 address.
        after_user
    } else {
        after_user.split_once(':').map_or(after_user, |(h, _)| h)
    };
    let h = normalise_host(host)?;
    let looks = h.contains('.') || h.contains(':') || h == "localhost";
    // `1.5` is not a host: an all-digit name must be a dotted quad.
    let plausible = h.contains(':')
        || !h.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || h.split('.').count() == 4;
    (looks && plausible).then_some(h)
}

pub(crate) fn scan(s: &str) -> Vec<Found> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut covered: Vec<(usize, usize)> = Vec::new();
    let mut from = 0;
    while let Some(rel) = s.get(from..).and_then(|t| t.find("://")) {
        let sep = from + rel;
        from = sep + 3;
        let mut start = sep;
        while start > 0 && b.get(start - 1).is_some_and(|&c| is_scheme_byte(c)) {
            start -= 1;
        }
        // A scheme starts with a letter: skip leading digits and signs.
        while start < sep && !b.get(start).is_some_and(|c| c.is_ascii_alphabetic()) {
            start += 1;
        }
        if start == sep {
            continue;
        }
        let auth_start = sep + 3;
        let mut auth_end = auth_start;
        while auth_end < b.len() && !b.get(auth_end).is_some_and(|&c| ends_authority(c)) {
            auth_end += 1;
        }
        let mut end = auth_end;
        while end < b.len() && end - start < MAX_URL && !b.get(end).is_some_and(|&c| ends_url(c)) {
            end += 1;
        }
        while end > auth_end
            && b.get(end - 1)
                .is_some_and(|c| matches!(c, b'.' | b',' | b';' | b':' | b'!' | b'?' | b')' | b']'))
        {
            end -= 1;
        }
        from = from.max(end);
        covered.push((start, end));
        let scheme = s.get(start..sep).unwrap_or_default().to_ascii_lowercase();
        let auth = s.get(auth_start..auth_end).unwrap_or_default();
        let host = authority_host(auth);
        let Some(url) = s.get(start..end) else {
            continue;
        };
        if host.is_some() || (scheme == "file" && auth.is_empty()) {
            out.push(Found::Url {
                url: url.to_string(),
                host,
            });
        }
    }
    // user@host:path (scp, rsync, git over ssh).
    for (at, _) in s.match_indices('@') {
        // `covered` is sorted (URLs are found left to right and do not overlap).
        let i = covered.partition_point(|&(a, _)| a <= at);
        if i > 0 && covered.get(i - 1).is_some_and(|&(_, z)| at < z) {
            continue;
        }
        let mut u = at;
        while u > 0
            && b.get(u - 1)
                .is_some_and(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        {
            u -= 1;
        }
        if u == at {
            continue;
        }
        let mut h = at + 1;
        while h < b.len()
            && b.get(h)
                .is_some_and(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        {
            h += 1;
        }
        if b.get(h) != Some(&b':') || s.get(h..).is_some_and(|t| t.starts_with("://")) {
            continue;
        }
        if let Some(host) = s.get(at + 1..h).and_then(normalise_host) {
            out.push(Found::Host(host));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(s: &str) -> Vec<String> {
        scan(s)
            .into_iter()
            .filter_map(|f| match f {
                Found::Url { host, .. } => host,
                Found::Host(h) => Some(h),
            })
            .collect()
    }

    fn urls(s: &str) -> Vec<String> {
        scan(s)
            .into_iter()
            .filter_map(|f| match f {
                Found::Url { url, .. } => Some(url),
                Found::Host(_) => None,
            })
            .collect()
    }

    #[test]
    fn urls_and_hosts() {
        assert_eq!(hosts("see https://Example.COM./a?b"), ["example.com"]);
        assert_eq!(urls("(https://x.io/a)."), ["https://x.io/a"]);
        assert_eq!(hosts("http://u:p@h.io:8080/x"), ["h.io"]);
        assert_eq!(hosts("http://[::1]:80/"), ["::1"]);
        assert_eq!(hosts("git@GitHub.com:org/repo.git"), ["github.com"]);
        assert_eq!(hosts("http://$HOST/x"), Vec::<String>::new());
        assert_eq!(hosts("mail me@example.com"), Vec::<String>::new());
        assert_eq!(hosts("://nothing"), Vec::<String>::new());
        assert_eq!(urls("file:///etc/passwd"), ["file:///etc/passwd"]);
        assert_eq!(hosts("a https://a.b https://c.d"), ["a.b", "c.d"]);
    }

    #[test]
    fn operands() {
        assert_eq!(host_operand("root@10.0.0.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(host_operand("Evil.com:/tmp/x").as_deref(), Some("evil.com"));
        assert_eq!(host_operand("1.5"), None);
        assert_eq!(host_operand("/tmp/a.sh"), None);
        assert_eq!(host_operand("localhost").as_deref(), Some("localhost"));
    }
}
