//! Durations, sizes and timestamps as the contract writes them.
//!
//! Durations are written `500ms`, `20s`, `5m`, `3h`, `7d`; sizes `512`, `64KiB`, `10MiB`,
//! `1GiB` (also `KB`/`MB`/`GB` as powers of ten). Timestamps are milliseconds since the
//! Unix epoch, UTC, shown as RFC 3339.

use std::fmt;
use std::time::Duration;

/// Parses a duration such as `500ms`, `20s`, `5m`, `3h` or `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("duration {text:?} has no unit (write e.g. 500ms, 20s, 5m, 3h, 7d)")
    })?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("duration {text:?} does not start with a number"));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("duration {text:?} is too large"))?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "duration {text:?} has unknown unit {unit:?} (use ms, s, m, h or d)"
            ))
        }
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration {text:?} is too large"))
}

/// Formats a duration the way [`parse_duration`] reads it, in the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms > 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Parses a size such as `10MiB`, `64KiB`, `1GB` or a plain number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("size {text:?} does not start with a number"));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("size {text:?} is too large"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "size {text:?} has unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// A point in time: milliseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// This time plus a duration (saturating).
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// This time minus a duration (saturating).
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_sub(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// How long from `self` until `later`; zero when `later` is not later.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }

    /// Parses an RFC 3339 time such as `2026-11-06T10:00:00Z` or
    /// `2026-11-06T12:00:00.250+02:00`.
    pub fn parse_rfc3339(text: &str) -> Result<Timestamp, String> {
        let bad = || format!("{text:?} is not an RFC 3339 time");
        let b = text.trim().as_bytes();
        if b.len() < 20 {
            return Err(bad());
        }
        let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
            let s = std::str::from_utf8(&b[range]).map_err(|_| bad())?;
            if !s.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse::<i64>().map_err(|_| bad())
        };
        if b[4] != b'-'
            || b[7] != b'-'
            || !matches!(b[10], b'T' | b't' | b' ')
            || b[13] != b':'
            || b[16] != b':'
        {
            return Err(bad());
        }
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&month)
            || !(1..=31).contains(&day)
            || hour > 23
            || minute > 59
            || second > 60
        {
            return Err(bad());
        }
        let mut i = 19;
        let mut millis = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == start {
                return Err(bad());
            }
            let frac = &b[start..i.min(start + 3)];
            let mut value = 0i64;
            for (n, digit) in frac.iter().enumerate() {
                value += i64::from(digit - b'0') * [100, 10, 1][n];
            }
            millis = value;
        }
        let offset_secs = match b.get(i) {
            Some(b'Z' | b'z') if i + 1 == b.len() => 0,
            Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
                let h = num(i + 1..i + 3)?;
                let m = num(i + 4..i + 6)?;
                (h * 3600 + m * 60) * if *sign == b'+' { 1 } else { -1 }
            }
            _ => return Err(bad()),
        };
        let days = days_from_civil(year, month, day);
        let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_secs;
        Ok(Timestamp(secs * 1000 + millis))
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-06T10:00:00.000Z`.
    pub fn to_rfc3339(self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.div_euclid(1000);
        let millis = self.0.rem_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

// Howard Hinnant's civil calendar algorithms (public domain).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("3h").unwrap(), Duration::from_secs(10_800));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        for bad in ["", "5", "s", "5x", "-5s", "1.5s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(format_duration(Duration::from_secs(10_800)), "3h");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10MiB").unwrap(), 10 * 1024 * 1024);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert!(parse_size("10 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn rfc3339_round_trip() {
        let t = Timestamp::parse_rfc3339("2026-11-06T10:00:00Z").unwrap();
        assert_eq!(t.to_string(), "2026-11-06T10:00:00.000Z");
        let with_offset = Timestamp::parse_rfc3339("2026-11-06T12:00:00.250+02:00").unwrap();
        assert_eq!(with_offset.0 - t.0, 250);
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        for ms in [
            0i64,
            1,
            951_782_400_000,
            1_700_000_000_123,
            4_102_444_800_000,
        ] {
            let t = Timestamp(ms);
            assert_eq!(Timestamp::parse_rfc3339(&t.to_string()).unwrap(), t);
        }
        for bad in [
            "",
            "2026-11-06",
            "2026-13-06T10:00:00Z",
            "2026-11-06T10:00:00",
            "yesterday at noon!!",
        ] {
            assert!(Timestamp::parse_rfc3339(bad).is_err(), "{bad:?}");
        }
    }
}
