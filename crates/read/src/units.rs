//! Sizes as people write them: `4096`, `64K`, `4M`, `1G`, `1T`. One parser for the library's
//! `MEM_TRACE_*` variables and the command's options that set them, so that a value one
//! accepts the other accepts too.

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
}
