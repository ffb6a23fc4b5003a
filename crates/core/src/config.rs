//! `MEM_TRACE_*` environment variables: read once, at the first hooked call, into atomics the
//! hot path reads without locking. Every variable, its default and its meaning is listed here
//! and in README.adoc. A bad value is reported on one line naming the variable, and the default
//! is used: a typo must not take the traced program down.
//!
//! A leaf: the modules configured read these values (or are handed them by `record`'s
//! initialisation); nothing here reaches into them.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Default number of frames kept per stack.
pub(crate) const DEFAULT_FRAMES: usize = 64;
/// The upper bound on `MEM_TRACE_FRAMES`, and the size of a capture's frame buffer.
pub(crate) const MAX_FRAMES: usize = 128;
/// Default number of frees remembered (`MEM_TRACE_FREED`): 2.5 MiB of records, enough to
/// explain a dangling pointer freed tens of thousands of frees ago.
pub(crate) const DEFAULT_FREED: u64 = 1 << 16;
/// Default bytes held back from reuse (`MEM_TRACE_QUARANTINE`).
pub(crate) const DEFAULT_QUARANTINE: u64 = 4 << 20;

/// Frames kept per allocation stack (`MEM_TRACE_FRAMES`, 1..=128, default 64).
pub(crate) static FRAMES: AtomicUsize = AtomicUsize::new(DEFAULT_FRAMES);
/// Whether stacks are captured at all (`MEM_TRACE_UNWIND=cfi` (default), `fp` or `none`).
pub(crate) static UNWIND: AtomicBool = AtomicBool::new(true);
/// Whether the program's frames are walked by frame pointers (`MEM_TRACE_UNWIND=fp`) rather
/// than by CFI: cheaper, and right only for code built with `-fno-omit-frame-pointer`.
pub(crate) static UNWIND_FP: AtomicBool = AtomicBool::new(false);
/// Print one line of statistics to stderr at exit (`MEM_TRACE_STATS=1`).
pub(crate) static STATS: AtomicBool = AtomicBool::new(false);
/// Capture the freeing stack of every free (`MEM_TRACE_FREE_STACKS`, default 1).
pub(crate) static FREE_STACKS: AtomicBool = AtomicBool::new(true);
/// Abort right after reporting a double or invalid free, so a core is written there
/// (`MEM_TRACE_ON_ERROR=abort`; default `report`: report and go on without freeing).
pub(crate) static ABORT_ON_ERROR: AtomicBool = AtomicBool::new(false);

/// How stacks are captured (`MEM_TRACE_UNWIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unwind {
    /// `cfi`: `.eh_frame` rules, right for code built without frame pointers (the default).
    Cfi,
    /// `fp`: the rbp chain, for programs built with frame pointers.
    FramePointers,
    /// `none`: no stacks.
    None,
}

/// A parsed configuration, separate from the globals so it can be tested.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub frames: usize,
    pub unwind: Unwind,
    pub stats: bool,
    /// Frees remembered in the history ring (`MEM_TRACE_FREED`, 0 disables).
    pub freed: u64,
    /// Bytes of freed blocks held back from reuse (`MEM_TRACE_QUARANTINE`, 0 disables).
    pub quarantine: u64,
    pub free_stacks: bool,
    pub abort_on_error: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frames: DEFAULT_FRAMES,
            unwind: Unwind::Cfi,
            stats: false,
            freed: DEFAULT_FREED,
            quarantine: DEFAULT_QUARANTINE,
            free_stacks: true,
            abort_on_error: false,
        }
    }
}

/// One rejected variable: its name, the value given, and what was expected.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Rejected {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Parses the configuration from a variable lookup.
pub(crate) fn parse(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<Rejected>) {
    let mut c = Config::default();
    let mut bad = Vec::new();
    let mut reject = |var, value: String, expected| {
        bad.push(Rejected {
            var,
            value,
            expected,
        })
    };
    if let Some(v) = get("MEM_TRACE_FRAMES") {
        match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_FRAMES).contains(&n) => c.frames = n,
            _ => reject("MEM_TRACE_FRAMES", v, "a whole number from 1 to 128"),
        }
    }
    if let Some(v) = get("MEM_TRACE_UNWIND") {
        match v.trim() {
            "cfi" => c.unwind = Unwind::Cfi,
            "fp" => c.unwind = Unwind::FramePointers,
            "none" => c.unwind = Unwind::None,
            _ => reject("MEM_TRACE_UNWIND", v, "cfi, fp or none"),
        }
    }
    if let Some(v) = get("MEM_TRACE_STATS") {
        match v.trim() {
            "1" | "yes" | "true" => c.stats = true,
            "0" | "no" | "false" | "" => c.stats = false,
            _ => reject("MEM_TRACE_STATS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_FREED") {
        match parse_size(&v) {
            Some(n) if n <= 1 << 26 => c.freed = n,
            _ => reject("MEM_TRACE_FREED", v, "a number of frees from 0 to 67108864"),
        }
    }
    if let Some(v) = get("MEM_TRACE_QUARANTINE") {
        match parse_size(&v) {
            Some(n) if n <= 1 << 40 => c.quarantine = n,
            _ => reject(
                "MEM_TRACE_QUARANTINE",
                v,
                "a size in bytes, optionally with K, M or G (0 disables)",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_FREE_STACKS") {
        match v.trim() {
            "1" | "yes" | "true" => c.free_stacks = true,
            "0" | "no" | "false" => c.free_stacks = false,
            _ => reject("MEM_TRACE_FREE_STACKS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_ON_ERROR") {
        match v.trim() {
            "report" => c.abort_on_error = false,
            "abort" => c.abort_on_error = true,
            _ => reject("MEM_TRACE_ON_ERROR", v, "report or abort"),
        }
    }
    (c, bad)
}

/// `4096`, `64K`, `4M`, `1G` (binary units, case-insensitive, optional trailing `B`/`iB`).
fn parse_size(v: &str) -> Option<u64> {
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
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1 << shift)
}

fn getenv(name: &str) -> Option<String> {
    let mut buf = [0u8; 64];
    let bytes = name.as_bytes();
    buf[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `buf` is NUL-terminated; getenv neither allocates nor locks, and the value is
    // copied out at once.
    let p = unsafe { libc::getenv(buf.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    Some(String::from_utf8_lossy(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes()).into_owned())
}

/// Reads the environment into the globals, reports bad values on stderr, and returns the
/// whole configuration for the settings that other modules keep (history, quarantine).
pub(crate) fn load() -> Config {
    let (c, bad) = parse(getenv);
    for r in &bad {
        let mut out = crate::out::Out::stderr();
        let _ = core::fmt::write(
            &mut out,
            format_args!(
                "mem-trace: {}={:?} is not valid (expected {}); using the default\n",
                r.var, r.value, r.expected
            ),
        );
    }
    FRAMES.store(c.frames, Ordering::Relaxed);
    UNWIND.store(c.unwind != Unwind::None, Ordering::Relaxed);
    UNWIND_FP.store(c.unwind == Unwind::FramePointers, Ordering::Relaxed);
    STATS.store(c.stats, Ordering::Relaxed);
    FREE_STACKS.store(c.free_stacks, Ordering::Relaxed);
    ABORT_ON_ERROR.store(c.abort_on_error, Ordering::Relaxed);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults() {
        assert_eq!(parse(env(&[])), (Config::default(), vec![]));
    }

    #[test]
    fn good_values() {
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_FRAMES", "16"),
            ("MEM_TRACE_UNWIND", "none"),
            ("MEM_TRACE_STATS", "1"),
        ]));
        assert!(bad.is_empty());
        assert_eq!(
            c,
            Config {
                frames: 16,
                unwind: Unwind::None,
                stats: true,
                ..Config::default()
            }
        );
    }

    #[test]
    fn freed_block_settings() {
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_FREED", "1000"),
            ("MEM_TRACE_QUARANTINE", "64K"),
            ("MEM_TRACE_FREE_STACKS", "0"),
            ("MEM_TRACE_ON_ERROR", "abort"),
        ]));
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((c.freed, c.quarantine), (1000, 64 << 10));
        assert!(!c.free_stacks && c.abort_on_error);
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("K"), None);
        let (_, bad) = parse(env(&[
            ("MEM_TRACE_FREED", "-1"),
            ("MEM_TRACE_QUARANTINE", "big"),
            ("MEM_TRACE_FREE_STACKS", "2"),
            ("MEM_TRACE_ON_ERROR", "explode"),
        ]));
        let names: Vec<_> = bad.iter().map(|r| r.var).collect();
        assert_eq!(
            names,
            [
                "MEM_TRACE_FREED",
                "MEM_TRACE_QUARANTINE",
                "MEM_TRACE_FREE_STACKS",
                "MEM_TRACE_ON_ERROR"
            ]
        );
    }

    #[test]
    fn unwind_modes() {
        for (v, mode) in [
            ("cfi", Unwind::Cfi),
            ("fp", Unwind::FramePointers),
            (" none ", Unwind::None),
        ] {
            let (c, bad) = parse(env(&[("MEM_TRACE_UNWIND", v)]));
            assert!(bad.is_empty(), "{v}: {bad:?}");
            assert_eq!(c.unwind, mode, "{v}");
        }
        let (c, bad) = parse(env(&[("MEM_TRACE_UNWIND", "framepointer")]));
        assert_eq!(c.unwind, Unwind::Cfi);
        assert_eq!(bad[0].expected, "cfi, fp or none");
    }

    #[test]
    fn bad_values_are_named_and_defaulted() {
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_FRAMES", "lots"),
            ("MEM_TRACE_UNWIND", "fast"),
            ("MEM_TRACE_STATS", "maybe"),
        ]));
        assert_eq!(c, Config::default());
        let names: Vec<_> = bad.iter().map(|r| r.var).collect();
        assert_eq!(
            names,
            ["MEM_TRACE_FRAMES", "MEM_TRACE_UNWIND", "MEM_TRACE_STATS"]
        );
        assert_eq!(parse(env(&[("MEM_TRACE_FRAMES", "0")])).1.len(), 1);
        assert_eq!(parse(env(&[("MEM_TRACE_FRAMES", "129")])).1.len(), 1);
    }
}
