//! The command line: `mem-trace SUBCOMMAND ...`, parsed with clap.
//!
//! The reading subcommands take the options of the gdb commands they mirror
//! (`python/mem_trace_gdb/commands/`, whose answers are the same code's), with the same names,
//! defaults and limits, so that
//! `mtrace-top -n 3 --by allocated` in gdb is `mem-trace top PID -n 3 --by allocated` here.
//!
//! One idea has one spelling in every subcommand that has it: frames per stack `-f/--frames`,
//! how many entries to list `-n/--count`, the tracer's mode `--mode`, sampling `--sample`,
//! where the output goes `-o/--output`. Spellings that once differed (`why -n/--max-frames`,
//! `history -n`, `attach --out`, `top PID N`) still parse, as hidden aliases, so that scripts
//! written against them keep working; tests/cli_spelling.rs reads every `--help` for it.

use crate::error::{Error, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use mem_trace_read::target::{Source, Target};
use std::path::PathBuf;

/// Frames per stack when the user does not say (as the gdb commands).
pub const DEFAULT_FRAMES: usize = 8;

/// mem-trace: where every heap block came from, for a running process or a core file.
#[derive(Debug, Parser)]
#[command(name = "mem-trace", version)]
#[command(
    after_help = "TARGET is a PID (a running process, read without stopping it, but by \
`leaks`, which stops it for its scan) or a core file (--exe names the executable when the \
core's own notes do not).\n\
The program must run with libmem_trace.so preloaded (`mem-trace run PROGRAM` does that) or \
have it loaded by `mem-trace attach PID`."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program with the tracer preloaded; at exit, write its report, leak report and
    /// flame graph into a directory.
    Run(RunArgs),
    /// Start gdb on a program run under the tracer (or on a core), with the mtrace-* commands
    /// loaded.
    Gdb(GdbArgs),
    /// List the allocation stacks that hold the most memory, biggest last (mtrace-top).
    Top(TopArgs),
    /// Show live bytes now and at the peak, per thread, and the stacks that held the peak
    /// (mtrace-peaks).
    Peaks(PeaksArgs),
    /// List the live blocks definitely lost, possibly lost and still reachable, by allocation
    /// stack, biggest first in each class (mtrace-leaks).
    Leaks(LeaksArgs),
    /// Show the heap block that holds an address, and the stacks that allocated (and freed)
    /// it (mtrace-why).
    Why(WhyArgs),
    /// List every remembered allocation and free of the memory at an address, newest first
    /// (mtrace-history).
    History(HistoryArgs),
    /// Show whether mem-trace is loaded and its live blocks, stacks, threads and freed-block
    /// history (mtrace-info).
    Info(InfoArgs),
    /// Draw a flame graph (SVG) of the allocation stacks.
    Flamegraph(FlamegraphArgs),
    /// Write DHAT's JSON, for valgrind's viewer (dh_view.html).
    Dhat(DhatArgs),
    /// Write a heap profile in pprof's format (gzipped profile.proto), for `go tool pprof`,
    /// Pyroscope, Parca and speedscope.
    Pprof(PprofArgs),
    /// Send the heap profile to a continuous-profiling server (Grafana Pyroscope, or Parca)
    /// at each interval, until the process ends.
    Push(PushArgs),
    /// Load the tracer into a running process and record what it allocates from then on.
    Attach(AttachArgs),
    /// Stop recording in a process `mem-trace attach` loaded the tracer into, and put its
    /// allocator calls back as they were.
    Detach(DetachArgs),
    /// Print a shell completion script (e.g. `mem-trace completions bash >
    /// /etc/bash_completion.d/mem-trace`).
    Completions(CompletionsArgs),
}

/// `mem-trace attach`.
#[derive(Debug, Args)]
#[command(
    long_about = "Load libmem_trace.so into a running process and record what it allocates from \
then on, without restarting it: the reading subcommands (top, why, leaks, ...) and gdb's \
mtrace-* commands then answer for those blocks. Blocks allocated before the attach are unknown: \
their frees go to glibc untouched. One thread is stopped for a moment where it is inside neither \
the allocator nor the loader; the others run on. Settings come from these options, not from the \
process's environment; a second attach after a detach keeps the first one's."
)]
pub struct AttachArgs {
    /// The running process.
    #[arg(value_name = "PID")]
    pub pid: i32,
    /// What the tracer records: `profile` (allocation stacks only) or `debug` (also who freed
    /// each block, and a history of frees). An attached tracer holds no quarantine in either
    /// mode: blocks from before the attach are unknown to it. Default: profile, as for `run`:
    /// a process attached to is one that has run for long, to see where its memory goes,
    /// and profile costs about half of debug.
    // Always `Some`: the settings name the mode the library is to use, whatever its own
    // default.
    #[arg(long, value_enum, value_name = "MODE", default_value = "profile")]
    pub mode: Option<Mode>,
    /// Record one allocation per BYTES allocated, on average (MEM_TRACE_SAMPLE): a number
    /// with K, M, G or T if wanted, at most 1T; 0 records every block.
    #[arg(long, value_name = "BYTES", value_parser = sample_mean)]
    pub sample: Option<u64>,
    /// Frames kept per stack, 1 to 128 (MEM_TRACE_FRAMES; default 64).
    #[arg(short = 'f', long = "frames", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub frames: Option<u32>,
    /// Write the profiler's reports into DIR, which must exist: at exit, on SIGUSR2, and
    /// every 30 s. Without it nothing is written.
    #[arg(short = 'o', long = "output", alias = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `mem-trace detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The process `mem-trace attach` loaded the tracer into.
    #[arg(value_name = "PID")]
    pub pid: i32,
}

/// `mem-trace completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `mem-trace run`.
#[derive(Debug, Args)]
#[command(
    after_help = "The library is $MEM_TRACE_LIB, else libmem_trace.so beside this \
binary (`cargo build --release` puts it there), else the one an installed mem-trace carries. \
Reports are switched on for the program (MEM_TRACE_PROFILE=1). The program's \
stdin, stdout and stderr are its own, and its exit status (or the signal that killed it) is \
passed on. Reports go to DIR: mem-trace.<pid>.<n>.txt, with .folded and .svg beside each, and \
the exit report's leak check in mem-trace.<pid>.<n>.leaks.txt. Told to stop (SIGTERM, or \
a SIGINT sent to it), it asks every traced process for a final report, waits for them (5 s at \
most), then passes the signal on; processes that ended with no exit report are named."
)]
pub struct RunArgs {
    /// What the tracer records: `profile` (allocation stacks only) or `debug` (also who freed
    /// each block, a history of frees and a quarantine, for dangling pointers). Default:
    /// $MEM_TRACE_MODE if set, else profile, as for `attach`: the reports are of where the
    /// memory goes, which profile answers at about half debug's cost.
    #[arg(long, value_enum, value_name = "MODE")]
    pub mode: Option<Mode>,
    /// Record one allocation per BYTES allocated, on average (MEM_TRACE_SAMPLE): a number
    /// with K, M, G or T if wanted, at most 1T; 0 records every block. Default:
    /// $MEM_TRACE_SAMPLE if set, else 0.
    #[arg(long, value_name = "BYTES", value_parser = sample_mean)]
    pub sample: Option<u64>,
    /// Frames kept per stack, 1 to 128 (MEM_TRACE_FRAMES). Default: $MEM_TRACE_FRAMES if
    /// set, else 64.
    #[arg(short = 'f', long = "frames", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub frames: Option<u32>,
    /// Also write a report every MEM_TRACE_PROFILE_INTERVAL seconds (default 30), not only at
    /// exit.
    #[arg(long)]
    pub profile: bool,
    /// Where the reports go (created if missing; default: a new mem-trace.<prog>.<pid>/ in
    /// the current directory).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Keep every process's exit report, also of those that allocated nothing worth one (by
    /// default not kept, only named: nothing allocated, or, in a process other than the
    /// program, nothing lost and a peak under 1 MiB).
    #[arg(long)]
    pub all_reports: bool,
    /// Also send the program's heap profile to a profiling server (Grafana Pyroscope) every
    /// --push-every seconds while it runs, as `mem-trace push` does.
    #[arg(long, value_name = "URL", value_parser = push_url)]
    pub push: Option<String>,
    /// Seconds between pushed profiles (the first after one interval).
    #[arg(long, value_name = "SECONDS", default_value = "15", value_parser = seconds)]
    pub push_every: f64,
    /// The service the pushed profiles are filed under (default: the program's name).
    #[arg(long, value_name = "NAME")]
    pub push_service: Option<String>,
    /// A label of every pushed profile, NAME=VALUE (repeatable).
    #[arg(long = "push-label", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub push_labels: Vec<(String, String)>,
    /// The kind of server --push names.
    #[arg(long, value_name = "KIND", value_enum, default_value_t = Server::Pyroscope)]
    pub push_server: Server,
    /// Also write a pprof profile of each process as it exits (mem-trace.PID.pb.gz beside its
    /// report): every stack's allocated and in-use counts, read while the process waits at
    /// the end of `exit`.
    #[arg(long)]
    pub pprof: bool,
    /// Exit with status N (1-255) when any process of the run had a double or invalid free,
    /// or, with --fail-on, lost memory; each process keeps its own status, and the summary
    /// names what failed the run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub error_exitcode: Option<u8>,
    /// With --error-exitcode, what else fails the run: `leaks` (blocks definitely lost) or
    /// `possibly` (definitely or possibly lost).
    #[arg(long, value_enum, value_name = "WHAT", requires = "error_exitcode")]
    pub fail_on: Option<FailOn>,
    /// The program and its arguments. Words after the program are its own, dashes and all;
    /// before it, an unknown option is refused as one (not run as a program named
    /// `--no-such-flag`).
    #[arg(value_name = "PROGRAM", trailing_var_arg = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// `mem-trace gdb`: the words are split by hand (`gdb::args`), since which of gdb's options
/// take a value is gdb's to know.
#[derive(Debug, Args)]
#[command(
    override_usage = "mem-trace gdb [GDB OPTIONS...] -- PROGRAM [ARGS...]\n       \
mem-trace gdb [GDB OPTIONS...] CORE [--exe PROGRAM]\n       \
mem-trace gdb [GDB OPTIONS...] PROGRAM CORE",
    after_help = "gdb starts with the mtrace-* commands (mtrace-why, mtrace-history, \
mtrace-info, mtrace-top, mtrace-peaks, mtrace-leaks) already defined, taken from the library, \
and runs PROGRAM with the library preloaded (LD_PRELOAD: the library, then yours) on every \
`run`, through gdb's exec-wrapper. A CORE alone opens with the executable its own notes name, \
found as `mem-trace top CORE` finds it; --exe names it when they do not. GDB OPTIONS (-batch, \
-q, -nx, -ex CMD, -x FILE, ...) are passed to gdb as they are. The library is $MEM_TRACE_LIB, \
else libmem_trace.so beside this binary, else the one an installed mem-trace carries; either \
build will do. The exit status is gdb's. Attaching (-p PID) is not supported yet."
)]
pub struct GdbArgs {
    /// gdb's options, verbatim; or (without `--`) gdb's options and a core and its program.
    #[arg(value_name = "GDB OPTIONS", allow_hyphen_values = true, num_args = 0..)]
    pub options: Vec<std::ffi::OsString>,
    /// The program and its arguments, after `--`.
    #[arg(value_name = "PROGRAM", last = true)]
    pub command: Vec<std::ffi::OsString>,
}

impl GdbArgs {
    /// The words as typed, `--` included: clap takes the first `--` away, and whether there
    /// was one tells a program with arguments from a core.
    pub fn words(&self) -> Vec<std::ffi::OsString> {
        let mut words = self.options.clone();
        if !self.command.is_empty() {
            words.push("--".into());
            words.extend(self.command.iter().cloned());
        }
        words
    }
}

/// The continuous-profiling server a push goes to: each takes the same gzipped pprof
/// profile and labels, through its own ingestion API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Server {
    /// Grafana Pyroscope: POST URL/push.v1.PusherService/Push (Connect, JSON).
    Pyroscope,
    /// Parca: POST URL/profiles/writeraw (WriteRaw through its HTTP gateway, JSON).
    Parca,
}

/// `mem-trace run --mode` and `attach --mode`: the library's `MEM_TRACE_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Allocation stacks only: where the memory goes.
    Profile,
    /// Allocation and free stacks and the history of frees: where a pointer came from, and
    /// who freed it.
    Debug,
}

/// What fails a run besides double and invalid frees (`run --fail-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// Blocks definitely lost.
    Leaks,
    /// Blocks definitely or possibly lost.
    Possibly,
}

impl Mode {
    /// The value of `MEM_TRACE_MODE`.
    pub fn as_env(self) -> &'static str {
        match self {
            Mode::Profile => "profile",
            Mode::Debug => "debug",
        }
    }
}

/// What every reading subcommand reads.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// A PID (a running process) or a core file.
    #[arg(value_name = "TARGET")]
    pub target: String,
    /// The executable, when the core's own notes do not name it.
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
}

impl TargetArgs {
    /// Opens the target; a failure is its one-line message.
    pub fn open(&self) -> Result<Target> {
        Target::open(&self.source()).map_err(|e| Error::new(e.to_string()))
    }

    /// The target as the readers take it: all digits is a pid, anything else a core file.
    pub fn source(&self) -> Source {
        match self.target.parse::<i32>() {
            Ok(pid) if pid > 0 && self.target.bytes().all(|b| b.is_ascii_digit()) => {
                Source::Pid(pid)
            }
            _ => Source::Core {
                core: PathBuf::from(&self.target),
                exe: self.exe.clone(),
            },
        }
    }
}

/// What stacks are ranked (and a flame graph's widths counted) by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// Bytes in live blocks.
    Live,
    /// Bytes ever allocated, freed or not.
    Allocated,
    /// Live blocks.
    Blocks,
    /// Bytes held at the global peak (since the last mem_trace_reset_peaks).
    Peak,
}

impl From<By> for mem_trace_read::answer::profile::By {
    fn from(by: By) -> Self {
        use mem_trace_read::answer::profile::By as Answer;
        match by {
            By::Live => Answer::Live,
            By::Allocated => Answer::Allocated,
            By::Blocks => Answer::Blocks,
            By::Peak => Answer::Peak,
        }
    }
}

impl By {
    /// The count in words, as the gdb commands say it.
    pub fn what(self) -> &'static str {
        mem_trace_read::answer::profile::By::from(self).title()
    }

    /// The unit of the count.
    pub fn unit(self) -> &'static str {
        match self {
            By::Blocks => "blocks",
            _ => "bytes",
        }
    }
}

/// Frames per stack (`-f N`, 0: all), raw addresses (`-r`).
#[derive(Debug, Clone, Args)]
pub struct StackOptions {
    /// Frames per stack (0: all).
    #[arg(short = 'f', long = "frames", value_name = "N", default_value_t = DEFAULT_FRAMES)]
    pub frames: usize,
    /// Print return addresses without symbolizing them.
    #[arg(short = 'r', long)]
    pub raw: bool,
}

/// `mem-trace top`.
#[derive(Debug, Args)]
#[command(after_help = "--thread T keeps \
the live blocks allocated by thread T (the tracer's thread index), from the live-block table: \
it works with --by live and --by blocks only.")]
pub struct TopArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// How many stacks (default 10).
    #[arg(short = 'n', long = "count", value_name = "N", value_parser = positive)]
    pub count: Option<u64>,
    /// The count as a word after the target (`top PID 3`), as it was first spelled: kept for
    /// the scripts that use it, out of the help.
    #[arg(value_name = "N", value_parser = positive, hide = true, conflicts_with = "count")]
    pub count_word: Option<u64>,
    /// What to rank by.
    #[arg(long, value_enum, default_value_t = By::Live)]
    pub by: By,
    /// Only live blocks allocated by thread index T.
    #[arg(long, value_name = "T", value_parser = positive)]
    pub thread: Option<u64>,
    /// Frames and symbolization.
    #[command(flatten)]
    pub stacks: StackOptions,
}

impl TopArgs {
    /// How many stacks, however spelled.
    pub fn count(&self) -> u64 {
        self.count.or(self.count_word).unwrap_or(10)
    }
}

/// `mem-trace peaks`.
#[derive(Debug, Args)]
pub struct PeaksArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Stacks at the peak to show.
    #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 5, value_parser = positive)]
    pub count: u64,
    /// Frames and symbolization.
    #[command(flatten)]
    pub stacks: StackOptions,
}

/// `mem-trace leaks`.
#[derive(Debug, Args)]
#[command(
    after_help = "A conservative scan from the roots (writable data of the loaded \
objects, thread stacks, registers), with the rules of the profiler's exit report. A running \
process is stopped for the scan (with ptrace) and resumed as it was; --no-stop reads it \
running.\n\
Each class (definitely lost, possibly lost, still reachable) lists its stacks biggest first, \
unlike top and peaks, which put the biggest last, next to the prompt: here three lists and a \
summary follow one another, so no order puts the biggest of each there, and first opens each \
list with the stack that matters most, as memcheck, LeakSanitizer and the exit report do."
)]
pub struct LeaksArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Stacks of each kind to show (0: all).
    #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 10)]
    pub count: u64,
    /// Do not list the still reachable blocks (the summary counts them).
    #[arg(long)]
    pub no_reachable: bool,
    /// Read a running process without stopping it: blocks it changes during the read may be
    /// misclassified, and its threads' registers are not roots (by default the process is
    /// stopped with ptrace for the scan and resumed as it was).
    #[arg(long)]
    pub no_stop: bool,
    /// Frames and symbolization.
    #[command(flatten)]
    pub stacks: StackOptions,
}

/// `mem-trace why`.
#[derive(Debug, Args)]
pub struct WhyArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The address to explain (0x... or decimal).
    #[arg(value_name = "ADDR", value_parser = address)]
    pub address: u64,
    /// Frames per stack (0: all; default 0, since the answer is about one block).
    // `-n` and `--max-frames` were its first spellings: hidden, for the scripts that use them.
    #[arg(
        short = 'f',
        long = "frames",
        value_name = "N",
        default_value_t = 0,
        hide_default_value = true,
        short_alias = 'n',
        alias = "max-frames"
    )]
    pub frames: usize,
    /// How far outside a block to still name it (0: off).
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub gap: u64,
    /// Print return addresses without symbolizing them.
    #[arg(short = 'r', long)]
    pub raw: bool,
}

/// `mem-trace history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The address whose history to show (0x... or decimal).
    #[arg(value_name = "ADDR", value_parser = address)]
    pub address: u64,
    /// Frames per stack (0: all).
    // `-n` was its first spelling: hidden, for the scripts that use it.
    #[arg(
        short = 'f',
        long = "frames",
        value_name = "N",
        default_value_t = DEFAULT_FRAMES,
        short_alias = 'n'
    )]
    pub frames: usize,
    /// One line per event, no stacks.
    #[arg(long)]
    pub no_stacks: bool,
    /// Print return addresses without symbolizing them.
    #[arg(short = 'r', long)]
    pub raw: bool,
}

/// `mem-trace info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `mem-trace flamegraph`.
#[derive(Debug, Args)]
#[command(
    after_help = "Draws every stack with a nonzero count, outermost frame at the bottom, \
each as wide as its count. --folded writes the folded stacks (`main;f;g 4096` per line) \
instead, for other tools. --from-folded draws a file of folded stacks (the profiler's reports \
write one beside each report) instead of reading a target."
)]
pub struct FlamegraphArgs {
    /// A PID (a running process) or a core file.
    #[arg(
        value_name = "TARGET",
        required_unless_present = "from_folded",
        conflicts_with = "from_folded"
    )]
    pub target: Option<String>,
    /// The executable, when the core's own notes do not name it.
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// What each stack's width counts.
    #[arg(long, value_enum, default_value_t = By::Live)]
    pub by: By,
    /// Only live blocks allocated by thread index T (with --by live or --by blocks).
    #[arg(long, value_name = "T", value_parser = positive, conflicts_with = "from_folded")]
    pub thread: Option<u64>,
    /// Write the folded stacks instead of the SVG.
    #[arg(long, conflicts_with = "from_folded")]
    pub folded: bool,
    /// Draw this file of folded stacks instead of reading a target.
    #[arg(long, value_name = "FILE")]
    pub from_folded: Option<PathBuf>,
    /// The graph's title (default: the target and the count).
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
    /// The file to write ("-": standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

impl FlamegraphArgs {
    /// The target to read, unless drawing from a folded file.
    pub fn target(&self) -> Option<TargetArgs> {
        self.target.as_ref().map(|t| TargetArgs {
            target: t.clone(),
            exe: self.exe.clone(),
        })
    }
}

/// `mem-trace dhat`.
#[derive(Debug, Args)]
#[command(
    after_help = "Open the file in valgrind's viewer (dh_view.html, installed with \
valgrind) with its Load button. Per stack: bytes and blocks ever allocated (Total), live at the \
global peak (At t-gmax) and live now (At t-end); times are counted in allocation events. \
mem-trace keeps no block lifetimes and no per-stack maximum: the viewer shows the lifetimes as \
NaN, and Max is a lower bound (the most of at-peak, live now, and one block of average size)."
)]
pub struct DhatArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The file to write ("-": standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// `mem-trace pprof`.
#[derive(Debug, Args)]
#[command(
    after_help = "Go's heap-profile convention: sample types alloc_objects, alloc_space, \
inuse_objects and inuse_space (the default). In-use samples carry a `thread` label (the \
allocating thread's name) and a numeric `tid`; allocation totals are per stack, without a \
thread. Read it with `go tool pprof -top FILE`, `-sample_index=alloc_space`, \
`-tagfocus=thread=NAME`, `-diff_base=OLD`."
)]
pub struct PprofArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The file to write ("-": standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// `mem-trace push`.
#[derive(Debug, Args)]
#[command(
    after_help = "Pyroscope's ingestion API (POST URL/push.v1.PusherService/Push), or with \
--server parca Parca's (POST URL/profiles/writeraw): labels \
__name__=memory, service_name and every --label; the profile is mem-trace pprof's, with \
allocations as deltas since the last accepted push and in-use values absolute. A failed push \
is one line on stderr, retried until the next interval is due. Ends when the process does \
(after one push for a core, or after --count pushes)."
)]
pub struct PushArgs {
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The server's base URL (http:// or https://), e.g. http://pyroscope:4040 or
    /// http://parca:7070.
    #[arg(long, value_name = "URL", value_parser = push_url)]
    pub url: String,
    /// The kind of server at --url.
    #[arg(long, value_name = "KIND", value_enum, default_value_t = Server::Pyroscope)]
    pub server: Server,
    /// Seconds between profiles.
    #[arg(long, value_name = "SECONDS", default_value = "15", value_parser = seconds)]
    pub every: f64,
    /// The service the profiles are filed under (default: the program's name).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// A label of every profile, NAME=VALUE (repeatable).
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Stop after this many profiles (0: when the process ends).
    #[arg(short = 'n', long = "count", value_name = "N", default_value = "0")]
    pub count: u64,
    /// Seconds to wait for the server to connect and to answer.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = seconds)]
    pub timeout: f64,
}

/// A label name as Prometheus (and so Pyroscope) accepts it.
fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `K=V` of `--label` and `--push-label`, checked (the push sends them as Pyroscope labels).
pub fn parse_label(text: &str) -> std::result::Result<(String, String), String> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(format!("{text:?} is not NAME=VALUE"));
    };
    if !valid_label_name(name) || name.starts_with("__") {
        return Err(format!(
            "{name:?} is not a label name (letters, digits and _, not starting with a digit or __)"
        ));
    }
    if name == "service_name" {
        return Err("service_name is set with --service".into());
    }
    Ok((name.to_string(), value.to_string()))
}

/// A duration in seconds, above zero and at most a day.
fn seconds(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds above 0 (at most 86400)"
        )),
    }
}

/// A server URL: http or https, with a host.
fn push_url(text: &str) -> std::result::Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .ok_or_else(|| format!("{text:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{text:?} names no host"));
    }
    Ok(text.to_string())
}

/// A count of at least 1, in any base gdb users type (`10`, `0x10`).
fn positive(text: &str) -> std::result::Result<u64, String> {
    match parse_int(text) {
        Some(0) => Err(format!("{text} is not a positive number")),
        Some(n) => Ok(n),
        None => Err(format!("{text:?} is not a number")),
    }
}

/// An address: `0x...` (hexadecimal), `0o...`, `0b...` or decimal.
fn address(text: &str) -> std::result::Result<u64, String> {
    parse_int(text).ok_or_else(|| format!("{text:?} is not an address (0x... or decimal)"))
}

fn parse_int(text: &str) -> Option<u64> {
    let t = text.trim().replace('_', "");
    let lower = t.to_ascii_lowercase();
    let (digits, radix) = if let Some(h) = lower.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = lower.strip_prefix("0o") {
        (o, 8)
    } else if let Some(b) = lower.strip_prefix("0b") {
        (b, 2)
    } else {
        (lower.as_str(), 10)
    };
    u64::from_str_radix(digits, radix).ok()
}

/// `--sample`: what `MEM_TRACE_SAMPLE` takes.
fn sample_mean(v: &str) -> std::result::Result<u64, &'static str> {
    mem_trace_read::sample::parse_mean(v).ok_or(mem_trace_read::sample::MEAN_WANTED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn labels_are_checked_as_pyroscope_takes_them() {
        assert_eq!(
            parse_label("host=a-1.example"),
            Ok(("host".into(), "a-1.example".into()))
        );
        assert_eq!(parse_label("region="), Ok(("region".into(), String::new())));
        for bad in [
            "nothing",
            "1x=2",
            "__name__=x",
            "a-b=c",
            "=v",
            "service_name=x",
        ] {
            assert!(parse_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completions_know_every_subcommand() {
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "mem-trace",
            &mut script,
        );
        let script = String::from_utf8(script).expect("utf-8");
        for sub in [
            "run",
            "gdb",
            "top",
            "peaks",
            "leaks",
            "why",
            "history",
            "info",
            "flamegraph",
            "dhat",
        ] {
            assert!(script.contains(sub), "no {sub} in the bash completion");
        }
        assert!(script.contains("--by"), "no --by in the bash completion");
    }

    #[test]
    fn numbers_and_addresses() {
        assert_eq!(address("0x7f00_0000_1000"), Ok(0x7f00_0000_1000));
        assert_eq!(address("4096"), Ok(4096));
        assert!(address("p").is_err());
        assert_eq!(positive("0x10"), Ok(16));
        assert!(positive("0").unwrap_err().contains("not a positive number"));
    }

    #[test]
    fn targets_are_pids_or_cores() {
        let t = |s: &str| TargetArgs {
            target: s.into(),
            exe: None,
        };
        assert_eq!(t("1234").source(), Source::Pid(1234));
        assert_eq!(
            t("core.1234").source(),
            Source::Core {
                core: "core.1234".into(),
                exe: None
            }
        );
        assert!(matches!(t("0").source(), Source::Core { .. }));
    }

    #[test]
    fn run_takes_the_program_and_its_own_options_verbatim() {
        let cli =
            Cli::try_parse_from(["mem-trace", "run", "-o", "d", "ls", "-l", "--color"]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.output, Some(PathBuf::from("d")));
        assert_eq!(r.command, ["ls", "-l", "--color"]);
        let cli = Cli::try_parse_from(["mem-trace", "run", "--", "--weird"]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.command, ["--weird"]);
    }

    #[test]
    fn gdb_gets_every_word_verbatim_even_a_leading_double_dash() {
        let words = |args: &[&str]| {
            let cli = Cli::try_parse_from(["mem-trace", "gdb"].iter().chain(args)).unwrap();
            let Command::Gdb(g) = cli.command else {
                panic!("not gdb")
            };
            g.words()
        };
        for args in [
            &["--", "./p", "a", "b"][..],
            &["-batch", "-ex", "run", "--", "./p", "--", "-x"],
            &["-q", "core", "--exe", "./p"],
            &["--exe=./p", "core"],
            &[],
        ] {
            assert_eq!(words(args), args, "mem-trace gdb {args:?}");
        }
    }

    #[test]
    fn old_spellings_still_parse() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["mem-trace"].iter().chain(args))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"))
                .command
        };
        for args in [
            &["why", "core", "0x10", "-f", "3"][..],
            &["why", "core", "0x10", "-n", "3"],
            &["why", "core", "0x10", "--max-frames", "3"],
            &["why", "core", "0x10", "--max-frames=3"],
        ] {
            let Command::Why(w) = parse(args) else {
                panic!("not why")
            };
            assert_eq!(w.frames, 3, "{args:?}");
        }
        let Command::Why(w) = parse(&["why", "core", "0x10"]) else {
            panic!("not why")
        };
        assert_eq!(w.frames, 0, "whole stacks by default");
        for args in [
            &["history", "core", "0x10", "-f", "3"][..],
            &["history", "core", "0x10", "-n", "3"],
        ] {
            let Command::History(h) = parse(args) else {
                panic!("not history")
            };
            assert_eq!(h.frames, 3, "{args:?}");
        }
        for args in [&["top", "core", "-n", "3"][..], &["top", "core", "3"]] {
            let Command::Top(t) = parse(args) else {
                panic!("not top")
            };
            assert_eq!(t.count(), 3, "{args:?}");
        }
        let Command::Top(t) = parse(&["top", "core"]) else {
            panic!("not top")
        };
        assert_eq!(t.count(), 10);
        assert!(Cli::try_parse_from(["mem-trace", "top", "core", "3", "-n", "4"]).is_err());
        for args in [
            &["attach", "1", "-o", "d", "-f", "16"][..],
            &["attach", "1", "--out", "d", "--frames", "16"],
        ] {
            let Command::Attach(a) = parse(args) else {
                panic!("not attach")
            };
            assert_eq!(a.out, Some(PathBuf::from("d")), "{args:?}");
            assert_eq!(a.frames, Some(16), "{args:?}");
            assert_eq!(a.mode, Some(Mode::Profile), "profile unless told");
        }
        let Command::Run(r) = parse(&["run", "--sample", "64K", "-f", "16", "ls"]) else {
            panic!("not run")
        };
        assert_eq!((r.sample, r.frames, r.mode), (Some(65536), Some(16), None));
        assert!(Cli::try_parse_from(["mem-trace", "run", "-f", "0", "ls"]).is_err());
    }

    #[test]
    fn top_mirrors_mtrace_top() {
        let cli = Cli::try_parse_from([
            "mem-trace",
            "top",
            "42",
            "3",
            "--by",
            "allocated",
            "-f",
            "0",
            "--thread",
            "2",
        ])
        .unwrap();
        let Command::Top(t) = cli.command else {
            panic!("not top")
        };
        assert_eq!((t.count(), t.by, t.thread), (3, By::Allocated, Some(2)));
        assert_eq!(t.stacks.frames, 0);
        assert!(Cli::try_parse_from(["mem-trace", "top", "42", "0"]).is_err());
        assert!(Cli::try_parse_from(["mem-trace", "top", "42", "--by", "size"]).is_err());
    }
}
