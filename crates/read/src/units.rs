//! Sizes as people write them: `4096`, `64K`, `4M`, `1G`, `1T`. One parser for the library's
//! `MEM_TRACE_*` variables and the command's options that set them, so that a value one
//! accepts the other accepts too. And byte counts as people read them ([`HumanBytes`]), for
//! the messages and reports.

use core::fmt;

/// Decimal digits (surrounding spaces allowed), as a number; `None` for anything else,
/// including a sign: `str::parse` takes `+5`, which made some variables take it and others not.
pub fn number(v: &str) -> Option<u64> {
    let t = v.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// `4096`, `64K`, `4M`, `1G`, `1T`: binary units, case-insensitive, with an optional
/// trailing `B` or `iB`; `None` when not such a size or past `u64`.
pub fn size(v: &str) -> Option<u64> {
    let t = v.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 10),
        'm' | 'M' => (&t[..t.len() - 1], 20),
        'g' | 'G' => (&t[..t.len() - 1], 30),
        't' | 'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    number(digits)?.checked_mul(1 << shift)
}

/// `bytes` for a message: "96 GiB", "4 KiB", "24 bytes".
pub(crate) fn human_bytes(bytes: u64) -> String {
    HumanBytes(bytes).to_string()
}

/// A byte count as a person says it ("96 GiB", "1.5 KiB", "24 bytes"), written without
/// allocating (`print_trace` writes it).
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        let bytes = self.0;
        if bytes < 1024 {
            return write!(f, "{bytes} bytes");
        }
        let mut value = bytes as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if value.fract() == 0.0 || value >= 100.0 {
            write!(f, "{value:.0} {}", UNITS[unit])
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size("4096"), Some(4096));
        assert_eq!(size(" 64K "), Some(64 << 10));
        assert_eq!(size("4M"), Some(4 << 20));
        assert_eq!(size("2GiB"), Some(2 << 30));
        assert_eq!(size("1tb"), Some(1 << 40));
        assert_eq!(size("0"), Some(0));
        assert_eq!(size("lots"), None);
        assert_eq!(size("K"), None);
        assert_eq!(size("-1K"), None);
        assert_eq!(size("99999999999T"), None);
    }

    #[test]
    fn numbers() {
        assert_eq!(number("42"), Some(42));
        assert_eq!(number("4 2"), None);
        assert_eq!(number(""), None);
    }

    #[test]
    fn sizes_read_as_a_person_would_say_them() {
        assert_eq!(human_bytes(24), "24 bytes");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(96 << 30), "96 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384 PiB");
    }
}
