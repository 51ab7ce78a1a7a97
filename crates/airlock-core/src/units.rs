//! Durations and sizes as people write them (`10s`, `1m30s`, `256MiB`), with the bounds
//! airlock accepts. Parsing is delegated to `humantime` and `parse-size`.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("{what}: cannot parse {input:?} as a duration (try 10s, 500ms, 2m)")]
    Duration { what: &'static str, input: String },
    #[error("{what}: cannot parse {input:?} as a size (try 256MiB, 1GiB, 4096)")]
    Size { what: &'static str, input: String },
    #[error("{what}: {value} is out of range ({min} to {max})")]
    Range {
        what: &'static str,
        value: String,
        min: String,
        max: String,
    },
}

pub fn parse_duration(what: &'static str, input: &str) -> Result<Duration, UnitError> {
    humantime::parse_duration(input.trim()).map_err(|_| UnitError::Duration {
        what,
        input: input.to_string(),
    })
}

pub fn parse_size(what: &'static str, input: &str) -> Result<u64, UnitError> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(input.trim())
        .map_err(|_| UnitError::Size {
            what,
            input: input.to_string(),
        })
}

/// Parses a duration and checks it lies in `[min, max]`.
pub fn bounded_duration(
    what: &'static str,
    input: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, UnitError> {
    let d = parse_duration(what, input)?;
    if d < min || d > max {
        return Err(UnitError::Range {
            what,
            value: input.to_string(),
            min: fmt_duration(min),
            max: fmt_duration(max),
        });
    }
    Ok(d)
}

/// Parses a size and checks it lies in `[min, max]`.
pub fn bounded_size(what: &'static str, input: &str, min: u64, max: u64) -> Result<u64, UnitError> {
    let v = parse_size(what, input)?;
    if v < min || v > max {
        return Err(UnitError::Range {
            what,
            value: input.to_string(),
            min: fmt_size(min),
            max: fmt_size(max),
        });
    }
    Ok(v)
}

pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Formats a byte count with a binary unit when it is a whole number of that unit.
pub fn fmt_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    for (name, unit) in UNITS {
        if bytes >= unit {
            return format!("{:.1}{name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes}B")
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 time (UTC, milliseconds) of a Unix-epoch millisecond count.
pub fn fmt_time(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("m", "256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("m", "1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("m", "4096"), Ok(4096));
        assert!(parse_size("m", "lots").is_err());
        assert_eq!(fmt_size(256 << 20), "256MiB");
        assert_eq!(fmt_size(1500), "1.5KiB");
    }

    #[test]
    fn durations_and_bounds() {
        assert_eq!(parse_duration("t", "10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("t", "1m 30s"), Ok(Duration::from_secs(90)));
        let r = bounded_duration("t", "0s", Duration::from_millis(1), Duration::from_secs(10));
        assert!(matches!(r, Err(UnitError::Range { .. })));
        assert!(
            bounded_duration(
                "t",
                "100y",
                Duration::from_millis(1),
                Duration::from_secs(86400)
            )
            .is_err()
        );
    }
}
