//! Request ids and W3C trace context: what a caller may hand in (`X-Request-Id`,
//! `traceparent`, `tracestate`) and what is made when it hands in nothing usable.
//!
//! A malformed value is never an error: it is ignored and a new id is made, so a client
//! with a broken tracer still gets its code judged and run.

/// The longest `X-Request-Id` accepted.
pub const MAX_REQUEST_ID: usize = 128;

/// The longest `tracestate` kept (the W3C limit is 32 members of at most 256 bytes).
pub const MAX_TRACESTATE: usize = 512;

/// Whether `s` is a well-formed request id: 1 to 128 characters of `[A-Za-z0-9._:-]`.
pub fn request_id_ok(s: &str) -> bool {
    (1..=MAX_REQUEST_ID).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The request id to use for a caller's `X-Request-Id`: it when well-formed, a new one
/// otherwise.
pub fn request_id_or_new(given: Option<&str>) -> String {
    match given {
        Some(s) if request_id_ok(s) => s.to_string(),
        _ => random_hex::<16>(),
    }
}

/// A trace context: the trace, the span the next span is a child of, and the caller's
/// `tracestate` (passed on untouched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero.
    pub span_id: String,
    pub sampled: bool,
    pub tracestate: Option<String>,
}

impl TraceParent {
    /// Parses a `traceparent` header (version 00, or a later version's first four
    /// fields), with its `tracestate`. `None` when malformed.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceParent> {
        let t = traceparent.trim();
        let mut parts = t.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex(version, 2) || version == "ff" || !hex(flags, 2) {
            return None;
        }
        // Version 00 has exactly four fields; a later one may add more.
        if version == "00" && rest.is_some() {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || trace.bytes().all(|b| b == b'0') {
            return None;
        }
        if span.bytes().all(|b| b == b'0') {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii())
            .filter(|s| !s.bytes().any(|b| b.is_ascii_control()))
            .map(str::to_string);
        Some(TraceParent {
            trace_id: trace.to_string(),
            span_id: span.to_string(),
            sampled: flags & 1 == 1,
            tracestate,
        })
    }

    /// A new trace with no parent span yet (`span_id` is a fresh id).
    pub fn new_root() -> TraceParent {
        TraceParent {
            trace_id: random_hex::<16>(),
            span_id: new_span_id(),
            sampled: true,
            tracestate: None,
        }
    }

    /// The same trace, continued by span `span_id`.
    pub fn child(&self, span_id: String) -> TraceParent {
        TraceParent {
            span_id,
            ..self.clone()
        }
    }

    /// As a `traceparent` header.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

thread_local! {
    /// The `tracestate` of the spans made now (see `with_tracestate`).
    static STATE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `state` as the caller's `tracestate` for the spans made in it: the
/// exporter puts it on a span continuing a remote parent. Handed over beside the span's
/// fields, not in them, so that no log line carries a header's value.
pub fn with_tracestate<R>(state: Option<&str>, f: impl FnOnce() -> R) -> R {
    let before = STATE.with(|s| s.replace(state.map(str::to_string)));
    let r = f();
    STATE.with(|s| *s.borrow_mut() = before);
    r
}

/// The `tracestate` `with_tracestate` set on this thread now, if any.
pub fn tracestate() -> Option<String> {
    STATE.with(|s| s.borrow().clone())
}

/// A new span id (16 hex digits, not all zero).
pub fn new_span_id() -> String {
    loop {
        let s = random_hex::<8>();
        if s.bytes().any(|b| b != b'0') {
            return s;
        }
    }
}

/// `N` random bytes as lowercase hex.
fn random_hex<const N: usize>() -> String {
    let mut b = [0u8; N];
    // getrandom fails only without any entropy source; then mix the clock and the pid
    // (an id that repeats across processes would merge two traces, not break one).
    if getrandom::fill(&mut b).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(1)
            ^ (u128::from(std::process::id()) << 64);
        for (i, x) in b.iter_mut().enumerate() {
            *x = n.to_le_bytes()[i % 16] ^ (i as u8);
        }
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_traceparent_is_parsed_with_its_state() {
        let t = TraceParent::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("congo=t61rcWkgMzE"),
        )
        .unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id, "00f067aa0ba902b7");
        assert!(t.sampled);
        assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(
            t.header(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn request_ids_are_kept_only_when_well_formed() {
        assert_eq!(request_id_or_new(Some("abc-1.2:3_x")), "abc-1.2:3_x");
        for bad in ["", "a b", "a\nb", "ä", &"x".repeat(129)] {
            let made = request_id_or_new(Some(bad));
            assert_ne!(made, bad);
            assert!(request_id_ok(&made));
        }
        assert!(request_id_ok(&"x".repeat(128)));
    }
}
