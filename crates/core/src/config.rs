//! `MEM_TRACE_*` environment variables: read once, at the first hooked call, into atomics the
//! hot path reads without locking. Every variable, its default and its meaning is listed here
//! and in README.adoc. A bad value is reported on one line naming the variable, and the default
//! is used: a typo must not take the traced program down.
//!
//! A leaf: the modules configured read these values (or are handed them by `record`'s
//! initialisation); nothing here reaches into them.

use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use mem_trace_read::units::{number, size as parse_size};
use std::sync::OnceLock;

/// Default number of frames kept per stack.
pub(crate) const DEFAULT_FRAMES: usize = 64;
/// The upper bound on `MEM_TRACE_FRAMES`, and the size of a capture's frame buffer.
pub(crate) const MAX_FRAMES: usize = 128;
/// Default number of frees remembered (`MEM_TRACE_FREED`): 2.5 MiB of records, enough to
/// explain a dangling pointer freed tens of thousands of frees ago.
pub(crate) const DEFAULT_FREED: u64 = 1 << 16;
/// Default cap on distinct stacks (`MEM_TRACE_MAX_STACKS`): far above the few thousand
/// stacks of most programs. A stack costs up to ~1.3 KB with its call-tree nodes and table
/// entries (clang++: 320 MB for 255k stacks), so the tracer's stacks stop growing by ~1.3 GB.
pub(crate) const DEFAULT_MAX_STACKS: u64 = 1 << 20;
/// The most `MEM_TRACE_MAX_STACKS` may be: stack ids are 24 bits wide.
const MAX_MAX_STACKS: u64 = (1 << 24) - 1;
/// Default bytes held back from reuse (`MEM_TRACE_QUARANTINE`).
pub(crate) const DEFAULT_QUARANTINE: u64 = 4 << 20;

/// Default time between periodic profile reports (`MEM_TRACE_PROFILE_INTERVAL`), in ms.
pub(crate) const DEFAULT_PROFILE_INTERVAL_MS: u64 = 30_000;
/// Default number of stacks a profile report ranks (`MEM_TRACE_PROFILE_TOP`).
pub(crate) const DEFAULT_PROFILE_TOP: usize = 10;
/// Default snapshot signal (`MEM_TRACE_SNAPSHOT_SIGNAL`).
pub(crate) const DEFAULT_SNAPSHOT_SIGNAL: i32 = libc::SIGUSR2;

/// Frames kept per allocation stack (`MEM_TRACE_FRAMES`, 1..=128, default 64).
pub(crate) static FRAMES: AtomicUsize = AtomicUsize::new(DEFAULT_FRAMES);
/// Whether stacks are captured at all (`MEM_TRACE_UNWIND=cfi` (default), `fp` or `none`).
pub(crate) static UNWIND: AtomicBool = AtomicBool::new(true);
/// Whether the program's frames are walked by frame pointers (`MEM_TRACE_UNWIND=fp`) rather
/// than by CFI: cheaper, and right only for code built with `-fno-omit-frame-pointer`.
pub(crate) static UNWIND_FP: AtomicBool = AtomicBool::new(false);
/// Print one line of statistics to stderr at exit (`MEM_TRACE_STATS=1`).
pub(crate) static STATS: AtomicBool = AtomicBool::new(false);
/// Check every Nth captured stack against framehop's walk from a fresh cache, and print
/// the agreement at exit (`MEM_TRACE_CHECK_STACKS=N`; 0: never). A diagnostic, for the
/// accuracy tests on real programs and for users who doubt a stack.
pub(crate) static CHECK_STACKS: AtomicU64 = AtomicU64::new(0);
/// Capture the freeing stack of every free (`MEM_TRACE_FREE_STACKS`, default 1).
pub(crate) static FREE_STACKS: AtomicBool = AtomicBool::new(true);
/// Abort right after reporting a double or invalid free, so a core is written there
/// (`MEM_TRACE_ON_ERROR=abort`; default `report`: report and go on without freeing).
pub(crate) static ABORT_ON_ERROR: AtomicBool = AtomicBool::new(false);
/// The status a process that failed ends with (`MEM_TRACE_ERROR_EXITCODE`; 0: its own).
pub(crate) static ERROR_EXITCODE: AtomicU8 = AtomicU8::new(0);
/// What fails a process, with [`ERROR_EXITCODE`] (`MEM_TRACE_FAIL_ON`): one of
/// [`FAIL_ON_ERRORS`], [`FAIL_ON_LEAKS`], [`FAIL_ON_POSSIBLY`], each including the ones before.
pub(crate) static FAIL_ON: AtomicU8 = AtomicU8::new(FAIL_ON_ERRORS);
/// Double and invalid frees fail a process.
pub(crate) const FAIL_ON_ERRORS: u8 = 0;
/// And blocks definitely lost.
pub(crate) const FAIL_ON_LEAKS: u8 = 1;
/// And blocks possibly lost.
pub(crate) const FAIL_ON_POSSIBLY: u8 = 2;

/// Profiler builds: milliseconds between periodic reports (`MEM_TRACE_PROFILE_INTERVAL`, in
/// seconds, fractions allowed, default 30; `0` disables them).
pub(crate) static PROFILE_INTERVAL_MS: AtomicU64 = AtomicU64::new(DEFAULT_PROFILE_INTERVAL_MS);
/// Profiler builds: stacks per ranking (`MEM_TRACE_PROFILE_TOP`, 1..=10000, default 10).
pub(crate) static PROFILE_TOP: AtomicUsize = AtomicUsize::new(DEFAULT_PROFILE_TOP);
/// Profiler builds: what stacks are ranked by (`MEM_TRACE_PROFILE_BY`), a [`RankBy`] as `u8`.
pub(crate) static PROFILE_BY: AtomicU8 = AtomicU8::new(RankBy::Live as u8);
/// Whether reports are written at all (`MEM_TRACE_PROFILE`).
pub(crate) static REPORTS: AtomicBool = AtomicBool::new(cfg!(feature = "profiler"));
/// The leak report at exit (`MEM_TRACE_LEAKS`, default 1; `0` off), when reports are on.
pub(crate) static LEAKS: AtomicBool = AtomicBool::new(cfg!(feature = "profiler"));
/// Profiler builds: the signal that asks for a full report (`MEM_TRACE_SNAPSHOT_SIGNAL`, a name
/// such as `SIGUSR2` or `USR2`, or a number; default `SIGUSR2`; `0` off).
pub(crate) static SNAPSHOT_SIGNAL: AtomicI32 = AtomicI32::new(DEFAULT_SNAPSHOT_SIGNAL);
/// Profiler builds: the directory reports are written to, one file per report
/// (`MEM_TRACE_OUT=DIR`); unset: standard error.
pub(crate) static OUT_DIR: OnceLock<String> = OnceLock::new();
/// Listen for report requests on a shared file in [`OUT_DIR`] (`MEM_TRACE_REQUESTS=1`, set by
/// `mem-trace run`; needs reports on and `MEM_TRACE_OUT`).
pub(crate) static REQUESTS: AtomicBool = AtomicBool::new(false);
/// The pid of the `mem-trace run` the process runs under (`MEM_TRACE_RUN_PID`, set by `run`;
/// 0: none): its direct child is the program, which alone has the profiler thread from
/// start-up (`profile::reporter`).
pub(crate) static RUN_PID: AtomicU32 = AtomicU32::new(0);
/// Write the exit and final reports' frames as return addresses, for `mem-trace run` to
/// symbolize once the program has ended (`MEM_TRACE_DEFER_SYMBOLS=1`, set by `run`; needs
/// `MEM_TRACE_OUT`): symbolizing in the exiting process cost it ~50 ms.
pub(crate) static DEFER_SYMBOLS: AtomicBool = AtomicBool::new(false);
/// At exit, tell `mem-trace run` through its FIFO in [`OUT_DIR`] and wait, briefly, until it
/// has read the tables (`MEM_TRACE_HOLD_AT_EXIT=1`, set by `run --pprof`; needs
/// `MEM_TRACE_OUT`).
pub(crate) static HOLD_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// What a profile report ranks stacks by (`MEM_TRACE_PROFILE_BY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RankBy {
    /// `live`: bytes in live blocks (the default).
    Live = 0,
    /// `allocated`: bytes ever allocated, freed or not.
    Allocated = 1,
    /// `blocks`: live blocks.
    Blocks = 2,
    /// `peak`: bytes each stack held at the global peak.
    Peak = 3,
}

impl RankBy {
    // Read by the profiler's reports only.
    /// The value stored in [`PROFILE_BY`] back as a `RankBy`.
    pub(crate) fn from_u8(v: u8) -> RankBy {
        match v {
            1 => RankBy::Allocated,
            2 => RankBy::Blocks,
            3 => RankBy::Peak,
            _ => RankBy::Live,
        }
    }
}

/// What the tracer is for (`MEM_TRACE_MODE`): the defaults of the freed-block features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `debug` (the default): free stacks, the freed-block history and the quarantine, so
    /// that a dangling pointer's block can be told with who freed it.
    Debug,
    /// `profile`: allocation stacks only, for where the memory goes (heaptrack's job), at
    /// about half debug's cost: no second capture per block, no history, no quarantine.
    Profile,
}

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
    /// The mode the freed-block defaults came from.
    pub mode: Mode,
    pub frames: usize,
    pub unwind: Unwind,
    pub stats: bool,
    /// Every how many captures a stack is checked against framehop's (0: none).
    pub check_stacks: u64,
    /// Frees remembered in the history ring (`MEM_TRACE_FREED`, 0 disables).
    pub freed: u64,
    /// Bytes of freed blocks held back from reuse (`MEM_TRACE_QUARANTINE`, 0 disables).
    pub quarantine: u64,
    pub free_stacks: bool,
    /// Distinct full stacks stored before new ones are cut (`MEM_TRACE_MAX_STACKS`).
    pub max_stacks: u64,
    pub abort_on_error: bool,
    /// `MEM_TRACE_ERROR_EXITCODE` (0: none).
    pub error_exitcode: u8,
    /// `MEM_TRACE_FAIL_ON`, as [`FAIL_ON`].
    pub fail_on: u8,
    /// Milliseconds between periodic profile reports (0: none).
    pub profile_interval_ms: u64,
    pub profile_top: usize,
    pub profile_by: RankBy,
    /// Whether the library writes reports at all (`MEM_TRACE_PROFILE`): the periodic ones, the
    /// exit report and the snapshot signal's. Off by default, on in the `profiler` build; the
    /// counters the reports are made from are kept either way.
    pub reports: bool,
    /// The leak report at exit.
    pub leaks: bool,
    /// The snapshot signal's number (0: none).
    pub snapshot_signal: i32,
    /// Where reports go: a directory, or standard error.
    pub out_dir: Option<String>,
    /// Whether to listen for report requests (`MEM_TRACE_REQUESTS`).
    pub requests: bool,
    /// The pid of the `mem-trace run` above (`MEM_TRACE_RUN_PID`; 0: none).
    pub run_pid: u32,
    /// Whether the exit and final reports leave symbolizing to `mem-trace run`
    /// (`MEM_TRACE_DEFER_SYMBOLS`).
    pub defer_symbols: bool,
    /// Whether the exiting process waits for `mem-trace run` to read it
    /// (`MEM_TRACE_HOLD_AT_EXIT`).
    pub hold_at_exit: bool,
    /// Mean bytes between sampled allocations (`MEM_TRACE_SAMPLE`, 0: record every block).
    pub sample: u64,
    /// `MEM_TRACE_SAMPLE_SEED`: the same samples run after run.
    pub sample_seed: Option<u64>,
    /// Small blocks' records in tags in front of them rather than in the table
    /// (`MEM_TRACE_TAGS`; on by default). See [`Config::tags_apply`].
    pub tags: bool,
}

impl Config {
    /// Whether blocks are tagged: asked for, and not sampling (whose filter at `free` stands
    /// for the table, and whose unsampled blocks must pass to glibc untouched).
    pub fn tags_apply(&self) -> bool {
        self.tags && self.sample == 0
    }

    /// Whether tags carry the block's sequence number (32 bytes instead of 16): in debug mode,
    /// or whenever the freed-block history is on, whose records name the allocation's.
    pub fn tags_carry_seq(&self) -> bool {
        self.mode == Mode::Debug || self.freed != 0
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Debug,
            frames: DEFAULT_FRAMES,
            unwind: Unwind::Cfi,
            stats: false,
            check_stacks: 0,
            freed: DEFAULT_FREED,
            quarantine: DEFAULT_QUARANTINE,
            free_stacks: true,
            max_stacks: DEFAULT_MAX_STACKS,
            abort_on_error: false,
            error_exitcode: 0,
            fail_on: FAIL_ON_ERRORS,
            profile_interval_ms: DEFAULT_PROFILE_INTERVAL_MS,
            profile_top: DEFAULT_PROFILE_TOP,
            profile_by: RankBy::Live,
            reports: cfg!(feature = "profiler"),
            leaks: true,
            snapshot_signal: DEFAULT_SNAPSHOT_SIGNAL,
            out_dir: None,
            requests: false,
            run_pid: 0,
            hold_at_exit: false,
            defer_symbols: false,
            sample: 0,
            sample_seed: None,
            tags: true,
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
///
/// The same rules hold for every variable: an empty value is as if the variable were unset
/// (`MEM_TRACE_STATS= prog` is the shell's way to clear it), a number is decimal digits only
/// (no sign, no spaces inside), sizes take `K`, `M`, `G` and `T`.
pub(crate) fn parse(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<Rejected>) {
    let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let mut c = Config::default();
    let mut bad = Vec::new();
    let mut reject = |var, value: String, expected| {
        bad.push(Rejected {
            var,
            value,
            expected,
        })
    };
    // First: the mode sets defaults that the variables of each feature then override.
    if let Some(v) = get("MEM_TRACE_MODE") {
        match v.trim() {
            "debug" => {}
            "profile" => {
                c.mode = Mode::Profile;
                c.free_stacks = false;
                c.freed = 0;
                c.quarantine = 0;
            }
            _ => reject("MEM_TRACE_MODE", v, "debug or profile"),
        }
    }
    if let Some(v) = get("MEM_TRACE_FRAMES") {
        match number(&v) {
            Some(n) if (1..=MAX_FRAMES as u64).contains(&n) => c.frames = n as usize,
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
            "0" | "no" | "false" => c.stats = false,
            _ => reject("MEM_TRACE_STATS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_CHECK_STACKS") {
        match number(&v) {
            Some(n) if n <= u64::from(u32::MAX) => c.check_stacks = n,
            _ => reject(
                "MEM_TRACE_CHECK_STACKS",
                v,
                "a whole number N: check every Nth stack (0: none)",
            ),
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
                "a size in bytes, optionally with K, M, G or T, at most 1T (0 disables)",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_SAMPLE") {
        match mem_trace_read::sample::parse_mean(&v) {
            Some(n) => c.sample = n,
            None => reject("MEM_TRACE_SAMPLE", v, mem_trace_read::sample::MEAN_WANTED),
        }
    }
    if let Some(v) = get("MEM_TRACE_SAMPLE_SEED") {
        match number(&v) {
            Some(n) => c.sample_seed = Some(n),
            None => reject("MEM_TRACE_SAMPLE_SEED", v, "a number from 0 to 2^64-1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_FREE_STACKS") {
        match v.trim() {
            "1" | "yes" | "true" => c.free_stacks = true,
            "0" | "no" | "false" => c.free_stacks = false,
            _ => reject("MEM_TRACE_FREE_STACKS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_TAGS") {
        match v.trim() {
            "1" | "yes" | "true" => c.tags = true,
            "0" | "no" | "false" => c.tags = false,
            _ => reject("MEM_TRACE_TAGS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_MAX_STACKS") {
        match parse_size(&v) {
            Some(n) if (1..=MAX_MAX_STACKS).contains(&n) => c.max_stacks = n,
            _ => reject(
                "MEM_TRACE_MAX_STACKS",
                v,
                "a number of stacks from 1 to 16777215, optionally with K or M",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_ON_ERROR") {
        match v.trim() {
            "report" => c.abort_on_error = false,
            "abort" => c.abort_on_error = true,
            _ => reject("MEM_TRACE_ON_ERROR", v, "report or abort"),
        }
    }
    if let Some(v) = get("MEM_TRACE_ERROR_EXITCODE") {
        match v.trim().parse::<u8>() {
            Ok(n @ 1..) => c.error_exitcode = n,
            _ => reject(
                "MEM_TRACE_ERROR_EXITCODE",
                v,
                "an exit status from 1 to 255",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_FAIL_ON") {
        match v.trim() {
            "errors" => c.fail_on = FAIL_ON_ERRORS,
            "leaks" => c.fail_on = FAIL_ON_LEAKS,
            "possibly" => c.fail_on = FAIL_ON_POSSIBLY,
            _ => reject("MEM_TRACE_FAIL_ON", v, "errors, leaks or possibly"),
        }
    }
    parse_profile(&get, &mut c, &mut reject);
    (c, bad)
}

/// The profiler's variables: whether reports are written, and how.
fn parse_profile(
    get: &impl Fn(&str) -> Option<String>,
    c: &mut Config,
    reject: &mut impl FnMut(&'static str, String, &'static str),
) {
    if let Some(v) = get("MEM_TRACE_PROFILE") {
        match v.trim() {
            "1" | "yes" | "true" => c.reports = true,
            "0" | "no" | "false" => c.reports = false,
            _ => reject("MEM_TRACE_PROFILE", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_PROFILE_INTERVAL") {
        match parse_seconds_ms(&v) {
            Some(ms) => c.profile_interval_ms = ms,
            None => reject(
                "MEM_TRACE_PROFILE_INTERVAL",
                v,
                "seconds between reports, e.g. 30 or 0.5, at most 86400 (0 disables)",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_PROFILE_TOP") {
        match number(&v) {
            Some(n) if (1..=10_000).contains(&n) => c.profile_top = n as usize,
            _ => reject(
                "MEM_TRACE_PROFILE_TOP",
                v,
                "a number of stacks from 1 to 10000",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_PROFILE_BY") {
        match v.trim() {
            "live" => c.profile_by = RankBy::Live,
            "allocated" => c.profile_by = RankBy::Allocated,
            "blocks" => c.profile_by = RankBy::Blocks,
            "peak" => c.profile_by = RankBy::Peak,
            _ => reject("MEM_TRACE_PROFILE_BY", v, "live, allocated, blocks or peak"),
        }
    }
    if let Some(v) = get("MEM_TRACE_LEAKS") {
        match v.trim() {
            "1" | "yes" | "true" => c.leaks = true,
            "0" | "no" | "false" => c.leaks = false,
            _ => reject("MEM_TRACE_LEAKS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_SNAPSHOT_SIGNAL") {
        match parse_signal(&v) {
            Some(n) => c.snapshot_signal = n,
            None => reject(
                "MEM_TRACE_SNAPSHOT_SIGNAL",
                v,
                "a signal name such as SIGUSR2 or USR2, a number, or 0 for none",
            ),
        }
    }
    if let Some(v) = get("MEM_TRACE_OUT") {
        c.out_dir = Some(v.trim().to_string());
    }
    if let Some(v) = get("MEM_TRACE_REQUESTS") {
        match v.trim() {
            "1" | "yes" | "true" => c.requests = true,
            "0" | "no" | "false" => c.requests = false,
            _ => reject("MEM_TRACE_REQUESTS", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_RUN_PID") {
        match v.trim().parse() {
            Ok(pid) => c.run_pid = pid,
            Err(_) => reject("MEM_TRACE_RUN_PID", v, "a process id"),
        }
    }
    if let Some(v) = get("MEM_TRACE_HOLD_AT_EXIT") {
        match v.trim() {
            "1" | "yes" | "true" => c.hold_at_exit = true,
            "0" | "no" | "false" => c.hold_at_exit = false,
            _ => reject("MEM_TRACE_HOLD_AT_EXIT", v, "0 or 1"),
        }
    }
    if let Some(v) = get("MEM_TRACE_DEFER_SYMBOLS") {
        match v.trim() {
            "1" | "yes" | "true" => c.defer_symbols = true,
            "0" | "no" | "false" => c.defer_symbols = false,
            _ => reject("MEM_TRACE_DEFER_SYMBOLS", v, "0 or 1"),
        }
    }
}

/// The value of variable `.1` that `.0` holds, as the variable would say it (with what it
/// means where the number alone would not tell): the line rejecting a bad value names what
/// is used instead, which for some variables depends on the mode or the build. Written
/// straight into the line, with no allocation.
struct InForce<'a>(&'a Config, &'static str);

impl core::fmt::Display for InForce<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let c = self.0;
        let flag = |on: bool| if on { "1" } else { "0" };
        match self.1 {
            "MEM_TRACE_MODE" => f.write_str(match c.mode {
                Mode::Debug => "debug",
                Mode::Profile => "profile",
            }),
            "MEM_TRACE_FRAMES" => write!(f, "{}", c.frames),
            "MEM_TRACE_UNWIND" => f.write_str(match c.unwind {
                Unwind::Cfi => "cfi",
                Unwind::FramePointers => "fp",
                Unwind::None => "none",
            }),
            "MEM_TRACE_STATS" => f.write_str(flag(c.stats)),
            "MEM_TRACE_CHECK_STACKS" => match c.check_stacks {
                0 => f.write_str("0 (no stack checked)"),
                n => write!(f, "{n}"),
            },
            "MEM_TRACE_FREED" => match c.freed {
                0 => f.write_str("0 (no history of frees)"),
                n => write!(f, "{n}"),
            },
            "MEM_TRACE_QUARANTINE" => match c.quarantine {
                0 => f.write_str("0 (no quarantine)"),
                n => write!(f, "{n} bytes"),
            },
            "MEM_TRACE_SAMPLE" => match c.sample {
                0 => f.write_str("0 (every block recorded)"),
                n => write!(f, "{n}"),
            },
            "MEM_TRACE_SAMPLE_SEED" => match c.sample_seed {
                None => f.write_str("none (a new seed each run)"),
                Some(n) => write!(f, "{n}"),
            },
            "MEM_TRACE_FREE_STACKS" => f.write_str(flag(c.free_stacks)),
            "MEM_TRACE_TAGS" => f.write_str(flag(c.tags)),
            "MEM_TRACE_MAX_STACKS" => write!(f, "{}", c.max_stacks),
            "MEM_TRACE_ON_ERROR" => f.write_str(if c.abort_on_error { "abort" } else { "report" }),
            "MEM_TRACE_ERROR_EXITCODE" => match c.error_exitcode {
                0 => f.write_str("none (the program's own exit status)"),
                n => write!(f, "{n}"),
            },
            "MEM_TRACE_FAIL_ON" => f.write_str(match c.fail_on {
                FAIL_ON_ERRORS => "errors",
                FAIL_ON_LEAKS => "leaks",
                _ => "possibly",
            }),
            "MEM_TRACE_PROFILE" => f.write_str(flag(c.reports)),
            "MEM_TRACE_PROFILE_INTERVAL" => match c.profile_interval_ms {
                0 => f.write_str("0 (no periodic report)"),
                ms if ms % 1000 == 0 => write!(f, "{} seconds", ms / 1000),
                ms => write!(f, "{}.{:03} seconds", ms / 1000, ms % 1000),
            },
            "MEM_TRACE_PROFILE_TOP" => write!(f, "{}", c.profile_top),
            "MEM_TRACE_PROFILE_BY" => f.write_str(match c.profile_by {
                RankBy::Live => "live",
                RankBy::Allocated => "allocated",
                RankBy::Blocks => "blocks",
                RankBy::Peak => "peak",
            }),
            "MEM_TRACE_LEAKS" => f.write_str(flag(c.leaks)),
            "MEM_TRACE_SNAPSHOT_SIGNAL" => match c.snapshot_signal {
                0 => f.write_str("0 (no snapshot signal)"),
                n => match SIGNALS.iter().find(|&&(_, s)| s == n) {
                    Some((name, _)) => write!(f, "SIG{name}"),
                    None => write!(f, "{n}"),
                },
            },
            "MEM_TRACE_OUT" => match &c.out_dir {
                None => f.write_str("none (reports on standard error)"),
                Some(dir) => f.write_str(dir),
            },
            "MEM_TRACE_REQUESTS" => f.write_str(flag(c.requests)),
            "MEM_TRACE_RUN_PID" => match c.run_pid {
                0 => f.write_str("0 (none)"),
                n => write!(f, "{n}"),
            },
            "MEM_TRACE_HOLD_AT_EXIT" => f.write_str(flag(c.hold_at_exit)),
            "MEM_TRACE_DEFER_SYMBOLS" => f.write_str(flag(c.defer_symbols)),
            // Every variable `parse` and `load` reject has its arm above (a test holds it).
            _ => f.write_str("its default"),
        }
    }
}

/// `30`, `0.5`, `2s` as milliseconds, at most a day; `None` if not that.
fn parse_seconds_ms(v: &str) -> Option<u64> {
    let t = v.trim();
    let t = t.strip_suffix('s').unwrap_or(t);
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut ms = 0;
    for (i, d) in frac.bytes().take(3).enumerate() {
        ms += u64::from(d - b'0') * [100, 10, 1][i];
    }
    let total = secs.checked_mul(1000)?.checked_add(ms)?;
    (total <= 86_400_000).then_some(total)
}

/// Signals a snapshot may use, by name (without `SIG`). Not KILL or STOP (no handler is
/// possible), nor the ones that mean a fault (SEGV, BUS, ILL, FPE, ABRT, TRAP, SYS).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
];

/// A signal by name (`SIGUSR2`, `USR2`, `SIGRTMIN+3`, case-insensitive) or number; `Some(0)`
/// for `0` (no signal).
fn parse_signal(v: &str) -> Option<i32> {
    let t = v.trim().to_ascii_uppercase();
    if let Some(n) = number(&t) {
        let n = i32::try_from(n).ok()?;
        let allowed = n == 0 || SIGNALS.iter().any(|&(_, s)| s == n) || (34..=64).contains(&n);
        return allowed.then_some(n);
    }
    let name = t.strip_prefix("SIG").unwrap_or(&t);
    if let Some(rt) = name.strip_prefix("RTMIN") {
        // glibc reserves the first two real-time signals: SIGRTMIN is 34 for programs.
        let off: i32 = match rt.strip_prefix('+') {
            Some(n) => i32::try_from(number(n)?).ok()?,
            None if rt.is_empty() => 0,
            None => return None,
        };
        return (0..=30).contains(&off).then_some(34 + off);
    }
    SIGNALS.iter().find(|&&(n, _)| n == name).map(|&(_, s)| s)
}

/// Whether `dir` names a directory (`MEM_TRACE_OUT`).
fn is_directory(dir: &str) -> bool {
    std::ffi::CString::new(dir).is_ok_and(|c| {
        // SAFETY: an all-zero `stat` is a valid buffer for stat(2) to fill.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and `st` is writable.
        unsafe {
            libc::stat(c.as_ptr(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
        }
    })
}

/// The settings `mem-trace attach` handed to the library (`record::attach`): `NAME=VALUE`
/// lines, the same names as the environment's. Set once, before the tracer initialises.
pub(crate) static ATTACH_SETTINGS: OnceLock<String> = OnceLock::new();

/// Whether the tracer was started by `mem-trace attach` (its settings came from it).
pub(crate) fn attached() -> bool {
    ATTACH_SETTINGS.get().is_some()
}

/// The value of `name` in `NAME=VALUE` lines.
fn setting(settings: &str, name: &str) -> Option<String> {
    settings.lines().find_map(|line| {
        let (n, v) = line.split_once('=')?;
        (n.trim() == name).then(|| v.trim().to_string())
    })
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
    // Attached: the settings `mem-trace attach` wrote, never the target's environment, which
    // was set for the program (and may name variables of its own run under the preload).
    let (mut c, mut bad) = match ATTACH_SETTINGS.get() {
        Some(settings) => parse(|name| setting(settings, name)),
        None => parse(getenv),
    };
    if let Some(dir) = c.out_dir.take() {
        // Checked here rather than in `parse`, which is pure: a missing directory is as bad as
        // a malformed value, and is better said once at start than at every report.
        if is_directory(&dir) {
            c.out_dir = Some(dir);
        } else {
            bad.push(Rejected {
                var: "MEM_TRACE_OUT",
                value: dir,
                expected: "an existing directory",
            });
        }
    }
    for r in &bad {
        let mut out = crate::out::Out::stderr();
        let _ = core::fmt::write(
            &mut out,
            format_args!(
                "mem-trace: {}={:?} is not valid (expected {}); using the default, {}\n",
                r.var,
                r.value,
                r.expected,
                InForce(&c, r.var)
            ),
        );
    }
    FRAMES.store(c.frames, Ordering::Relaxed);
    UNWIND.store(c.unwind != Unwind::None, Ordering::Relaxed);
    UNWIND_FP.store(c.unwind == Unwind::FramePointers, Ordering::Relaxed);
    STATS.store(c.stats, Ordering::Relaxed);
    CHECK_STACKS.store(c.check_stacks, Ordering::Relaxed);
    FREE_STACKS.store(c.free_stacks, Ordering::Relaxed);
    ABORT_ON_ERROR.store(c.abort_on_error, Ordering::Relaxed);
    ERROR_EXITCODE.store(c.error_exitcode, Ordering::Relaxed);
    FAIL_ON.store(c.fail_on, Ordering::Relaxed);
    // Reports off: no reporter thread, no signal handler, no exit report; the counters stay.
    let on = c.reports;
    REPORTS.store(on, Ordering::Relaxed);
    PROFILE_INTERVAL_MS.store(
        if on { c.profile_interval_ms } else { 0 },
        Ordering::Relaxed,
    );
    PROFILE_TOP.store(c.profile_top, Ordering::Relaxed);
    PROFILE_BY.store(c.profile_by as u8, Ordering::Relaxed);
    // A process that fails on leaks needs its leak check at exit, reports on or not: the
    // report then says what failed it.
    let gated = c.error_exitcode != 0 && c.fail_on >= FAIL_ON_LEAKS;
    LEAKS.store((on || gated) && c.leaks, Ordering::Relaxed);
    SNAPSHOT_SIGNAL.store(if on { c.snapshot_signal } else { 0 }, Ordering::Relaxed);
    if let Some(dir) = &c.out_dir {
        let _ = OUT_DIR.set(dir.clone());
    }
    REQUESTS.store(on && c.requests && c.out_dir.is_some(), Ordering::Relaxed);
    RUN_PID.store(c.run_pid, Ordering::Relaxed);
    DEFER_SYMBOLS.store(c.defer_symbols && c.out_dir.is_some(), Ordering::Relaxed);
    HOLD_AT_EXIT.store(
        on && c.hold_at_exit && c.out_dir.is_some(),
        Ordering::Relaxed,
    );
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
    fn attach_settings_are_name_value_lines() {
        let s = "MEM_TRACE_MODE=profile\nMEM_TRACE_SAMPLE = 4096\nbad line\n";
        assert_eq!(setting(s, "MEM_TRACE_MODE").as_deref(), Some("profile"));
        assert_eq!(setting(s, "MEM_TRACE_SAMPLE").as_deref(), Some("4096"));
        assert_eq!(setting(s, "MEM_TRACE_OUT"), None);
        let (c, bad) = parse(|n| setting(s, n));
        assert!(bad.is_empty());
        assert_eq!(c.mode, Mode::Profile);
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
    fn modes_set_defaults_that_variables_override() {
        let (c, bad) = parse(env(&[("MEM_TRACE_MODE", "profile")]));
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(c.mode, Mode::Profile);
        assert!(!c.free_stacks);
        assert_eq!((c.freed, c.quarantine), (0, 0));
        assert!(c.tags && c.tags_apply());
        // Each feature's own variable still wins, whichever order the environment lists them.
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_QUARANTINE", "1M"),
            ("MEM_TRACE_MODE", " profile "),
            ("MEM_TRACE_FREE_STACKS", "1"),
        ]));
        assert!(bad.is_empty(), "{bad:?}");
        assert!(c.free_stacks);
        assert_eq!((c.freed, c.quarantine), (0, 1 << 20));
        // A quarantine and free stacks keep tags (which then carry no sequence number: the
        // history is off).
        assert!(c.tags && c.tags_apply() && !c.tags_carry_seq());
        let (c, _) = parse(env(&[
            ("MEM_TRACE_MODE", "profile"),
            ("MEM_TRACE_TAGS", "0"),
        ]));
        assert!(!c.tags_apply());
        let (c, _) = parse(env(&[
            ("MEM_TRACE_MODE", "profile"),
            ("MEM_TRACE_SAMPLE", "64K"),
        ]));
        assert!(
            !c.tags_apply(),
            "sampling keeps every sampled block in the table"
        );
        let (c, bad) = parse(env(&[("MEM_TRACE_TAGS", "2")]));
        assert_eq!(bad[0].var, "MEM_TRACE_TAGS");
        assert!(c.tags, "a bad value keeps the default");
        // Debug mode tags too, with the sequence number its history records name.
        let c = Config::default();
        assert!(c.tags_apply() && c.tags_carry_seq());
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_MODE", "debug"),
            ("MEM_TRACE_FREED", "0"),
        ]));
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((c.mode, c.freed, c.free_stacks), (Mode::Debug, 0, true));
        assert_eq!(
            parse(env(&[("MEM_TRACE_MODE", "debug")])).0,
            Config::default()
        );
        for v in ["fast", "Profile", "1"] {
            let (c, bad) = parse(env(&[("MEM_TRACE_MODE", v)]));
            assert_eq!(c, Config::default(), "{v}");
            assert_eq!(bad.len(), 1, "{v}");
            assert_eq!(
                (bad[0].var, bad[0].expected),
                ("MEM_TRACE_MODE", "debug or profile")
            );
        }
    }

    /// Each rejected variable's line names the value used instead, the one the
    /// configuration holds: the default, or the mode's.
    #[test]
    fn a_rejected_value_names_the_value_in_force() {
        let said = |pairs: &[(&str, &str)]| {
            let (c, bad) = parse(env(pairs));
            assert_eq!(bad.len(), 1, "{pairs:?}: {bad:?}");
            InForce(&c, bad[0].var).to_string()
        };
        for (var, garbage, used) in [
            ("MEM_TRACE_MODE", "fast", "debug"),
            ("MEM_TRACE_FRAMES", "0", "64"),
            ("MEM_TRACE_UNWIND", "x", "cfi"),
            ("MEM_TRACE_STATS", "x", "0"),
            ("MEM_TRACE_CHECK_STACKS", "x", "0 (no stack checked)"),
            ("MEM_TRACE_FREED", "x", "65536"),
            ("MEM_TRACE_QUARANTINE", "x", "4194304 bytes"),
            ("MEM_TRACE_SAMPLE", "banana", "0 (every block recorded)"),
            ("MEM_TRACE_SAMPLE_SEED", "x", "none (a new seed each run)"),
            ("MEM_TRACE_FREE_STACKS", "x", "1"),
            ("MEM_TRACE_TAGS", "x", "1"),
            ("MEM_TRACE_MAX_STACKS", "x", "1048576"),
            ("MEM_TRACE_ON_ERROR", "x", "report"),
            ("MEM_TRACE_PROFILE_INTERVAL", "x", "30 seconds"),
            ("MEM_TRACE_PROFILE_TOP", "x", "10"),
            ("MEM_TRACE_PROFILE_BY", "x", "live"),
            ("MEM_TRACE_LEAKS", "x", "1"),
            ("MEM_TRACE_SNAPSHOT_SIGNAL", "x", "SIGUSR2"),
            ("MEM_TRACE_REQUESTS", "x", "0"),
            ("MEM_TRACE_RUN_PID", "x", "0 (none)"),
            ("MEM_TRACE_HOLD_AT_EXIT", "x", "0"),
            ("MEM_TRACE_DEFER_SYMBOLS", "x", "0"),
        ] {
            assert_eq!(said(&[(var, garbage)]), used, "{var}={garbage}");
        }
        let profile = if cfg!(feature = "profiler") { "1" } else { "0" };
        assert_eq!(said(&[("MEM_TRACE_PROFILE", "x")]), profile);
        // The mode's value, not the debug default's.
        assert_eq!(
            said(&[("MEM_TRACE_MODE", "profile"), ("MEM_TRACE_FREED", "x")]),
            "0 (no history of frees)"
        );
        let c = Config::default();
        assert_eq!(
            InForce(&c, "MEM_TRACE_OUT").to_string(),
            "none (reports on standard error)"
        );
    }

    #[test]
    fn profile_settings() {
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_PROFILE_INTERVAL", "0.25"),
            ("MEM_TRACE_PROFILE_TOP", "3"),
            ("MEM_TRACE_PROFILE_BY", "allocated"),
            ("MEM_TRACE_LEAKS", "0"),
            ("MEM_TRACE_SNAPSHOT_SIGNAL", "SIGUSR1"),
            ("MEM_TRACE_OUT", "/tmp"),
            ("MEM_TRACE_REQUESTS", "1"),
            ("MEM_TRACE_DEFER_SYMBOLS", "1"),
            ("MEM_TRACE_HOLD_AT_EXIT", "1"),
        ]));
        assert!(bad.is_empty(), "{bad:?}");
        assert!(c.requests && c.defer_symbols && c.hold_at_exit);
        assert_eq!(c.profile_interval_ms, 250);
        assert_eq!((c.profile_top, c.profile_by), (3, RankBy::Allocated));
        assert!(!c.leaks);
        assert_eq!(c.snapshot_signal, libc::SIGUSR1);
        assert_eq!(c.out_dir.as_deref(), Some("/tmp"));
        assert_eq!(parse_seconds_ms("30"), Some(30_000));
        assert_eq!(parse_seconds_ms("0"), Some(0));
        assert_eq!(parse_seconds_ms("2s"), Some(2000));
        assert_eq!(parse_seconds_ms(".5"), Some(500));
        assert_eq!(parse_seconds_ms("-1"), None);
        assert_eq!(parse_seconds_ms("1e3"), None);
        assert_eq!(parse_seconds_ms("."), None);
        assert_eq!(parse_seconds_ms("86401"), None);
        for (v, n) in [
            ("USR2", libc::SIGUSR2),
            ("sigusr1", libc::SIGUSR1),
            ("12", 12),
            ("0", 0),
            ("SIGRTMIN+2", 36),
            ("40", 40),
        ] {
            assert_eq!(parse_signal(v), Some(n), "{v}");
        }
        for v in ["SIGKILL", "9", "19", "SEGV", "USR3", "65", "RTMIN+31", ""] {
            assert_eq!(parse_signal(v), None, "{v}");
        }
        assert_eq!(
            parse(env(&[("MEM_TRACE_PROFILE_BY", " peak ")]))
                .0
                .profile_by,
            RankBy::Peak
        );
        assert_eq!(RankBy::from_u8(RankBy::Peak as u8), RankBy::Peak);
        assert_eq!(
            parse(env(&[("MEM_TRACE_PROFILE_BY", "blocks")]))
                .0
                .profile_by,
            RankBy::Blocks
        );
        assert_eq!(
            parse(env(&[("MEM_TRACE_PROFILE_INTERVAL", "0")]))
                .0
                .profile_interval_ms,
            0
        );
    }

    /// Reports are a run-time switch whose default is the build's.
    #[test]
    fn reports_switch() {
        assert_eq!(Config::default().reports, cfg!(feature = "profiler"));
        for (v, on) in [("1", true), ("yes", true), ("0", false), ("false", false)] {
            let (c, bad) = parse(env(&[("MEM_TRACE_PROFILE", v)]));
            assert!(bad.is_empty(), "{v}: {bad:?}");
            assert_eq!(c.reports, on, "{v}");
        }
        let (c, bad) = parse(env(&[("MEM_TRACE_PROFILE", "2")]));
        assert_eq!(c, Config::default());
        assert_eq!(
            (bad[0].var, bad[0].expected),
            ("MEM_TRACE_PROFILE", "0 or 1")
        );
    }

    #[test]
    fn bad_profile_values_are_named_and_defaulted() {
        let (c, bad) = parse(env(&[
            ("MEM_TRACE_PROFILE_INTERVAL", "soon"),
            ("MEM_TRACE_PROFILE_TOP", "0"),
            ("MEM_TRACE_PROFILE_BY", "size"),
            ("MEM_TRACE_LEAKS", "2"),
            ("MEM_TRACE_SNAPSHOT_SIGNAL", "SIGKILL"),
        ]));
        assert_eq!(c, Config::default());
        let names: Vec<_> = bad.iter().map(|r| r.var).collect();
        assert_eq!(
            names,
            [
                "MEM_TRACE_PROFILE_INTERVAL",
                "MEM_TRACE_PROFILE_TOP",
                "MEM_TRACE_PROFILE_BY",
                "MEM_TRACE_LEAKS",
                "MEM_TRACE_SNAPSHOT_SIGNAL",
            ]
        );
        assert!(!is_directory("/nonexistent/mem-trace"));
        assert!(is_directory("/tmp"));
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

    #[test]
    fn max_stacks() {
        for (v, n) in [("200", 200), ("1", 1), ("64K", 64 << 10), ("2M", 2 << 20)] {
            let (c, bad) = parse(env(&[("MEM_TRACE_MAX_STACKS", v)]));
            assert!(bad.is_empty(), "{v}: {bad:?}");
            assert_eq!(c.max_stacks, n, "{v}");
        }
        let (c, bad) = parse(env(&[("MEM_TRACE_MAX_STACKS", "16777215")]));
        assert!(bad.is_empty());
        assert_eq!(c.max_stacks, 16_777_215);
        for v in ["0", "16777216", "16M", "1G", "lots", "-5", "1.5M"] {
            let (c, bad) = parse(env(&[("MEM_TRACE_MAX_STACKS", v)]));
            assert_eq!(c.max_stacks, DEFAULT_MAX_STACKS, "{v}");
            assert_eq!(bad.len(), 1, "{v}");
            assert_eq!(bad[0].var, "MEM_TRACE_MAX_STACKS");
        }
    }

    /// One rule for numbers in every variable: digits only, so a sign is refused everywhere
    /// (some took `+5`, one did not).
    #[test]
    fn signs_are_refused_by_every_number() {
        for var in [
            "MEM_TRACE_FRAMES",
            "MEM_TRACE_FREED",
            "MEM_TRACE_QUARANTINE",
            "MEM_TRACE_MAX_STACKS",
            "MEM_TRACE_PROFILE_TOP",
            "MEM_TRACE_PROFILE_INTERVAL",
            "MEM_TRACE_SNAPSHOT_SIGNAL",
        ] {
            for v in ["+5", "-5", "5 5", "0x10"] {
                let (c, bad) = parse(env(&[(var, v)]));
                assert_eq!(c, Config::default(), "{var}={v}");
                assert_eq!(bad.len(), 1, "{var}={v}: {bad:?}");
            }
        }
        assert_eq!(parse_signal("SIGRTMIN+2"), Some(36));
        assert_eq!(parse_signal("SIGRTMIN++2"), None);
    }

    /// An empty value is an unset variable, for every variable (some took it as a value,
    /// others refused it).
    #[test]
    fn empty_values_are_unset() {
        for var in [
            "MEM_TRACE_MODE",
            "MEM_TRACE_FRAMES",
            "MEM_TRACE_UNWIND",
            "MEM_TRACE_STATS",
            "MEM_TRACE_CHECK_STACKS",
            "MEM_TRACE_FREED",
            "MEM_TRACE_QUARANTINE",
            "MEM_TRACE_FREE_STACKS",
            "MEM_TRACE_MAX_STACKS",
            "MEM_TRACE_ON_ERROR",
            "MEM_TRACE_ERROR_EXITCODE",
            "MEM_TRACE_FAIL_ON",
            "MEM_TRACE_PROFILE",
            "MEM_TRACE_PROFILE_INTERVAL",
            "MEM_TRACE_PROFILE_TOP",
            "MEM_TRACE_PROFILE_BY",
            "MEM_TRACE_LEAKS",
            "MEM_TRACE_SNAPSHOT_SIGNAL",
            "MEM_TRACE_OUT",
        ] {
            for v in ["", "  "] {
                let (c, bad) = parse(env(&[(var, v)]));
                assert_eq!(c, Config::default(), "{var}={v:?}");
                assert!(bad.is_empty(), "{var}={v:?}: {bad:?}");
            }
        }
    }

    /// Sizes go up to what `MEM_TRACE_QUARANTINE` allows, in its own unit (`1024G` was taken
    /// and `1T` refused).
    #[test]
    fn sizes_take_terabytes() {
        for v in ["1T", "1t", "1TiB", "1024G"] {
            let (c, bad) = parse(env(&[("MEM_TRACE_QUARANTINE", v)]));
            assert!(bad.is_empty(), "{v}: {bad:?}");
            assert_eq!(c.quarantine, 1 << 40, "{v}");
        }
        assert_eq!(parse(env(&[("MEM_TRACE_QUARANTINE", "2T")])).1.len(), 1);
    }
}
