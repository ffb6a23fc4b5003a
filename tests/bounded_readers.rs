//! Readers stay bounded when the traced program scribbles over its own tables.
//!
//! `tests/fixtures/scribble.c` runs under the profiler build with its history on, then
//! overwrites one field of the tables (docs/LAYOUT.md) at a time in its own memory: pointers
//! with zero, a kernel address, a non-canonical one, the header's own address and another
//! table's; counts and capacities with zero and huge values. Against each, running and from
//! its core, every `mem-trace` subcommand runs under a timeout and an address-space cap, and
//! must answer or refuse in one line: never hang, crash or run out of memory. The gdb commands
//! run against the same mutants and must never show a Python traceback.
//!
//! Numbers no process can hold (live bytes 2^64-1, a stack's count below zero, shard counts
//! that sum past 2^64) must also be flagged by the answers that print them, not only printed.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command};
use std::time::Duration;

use common::{
    c_fixture, gcore, mem_trace_binary, profiler_library, run_with_timeout, spawn_fixture,
    waiting_fixture, Fixture,
};
use mem_trace_read::format::{
    shard_of, CallTree, FreedHistory, Header, Profile, Shard, StackStore, ThreadRecord,
    ThreadTable, REGION_SHIFT,
};
use mem_trace_read::memory::read_plain;
use mem_trace_read::target::{Source, Target};

/// The most address space a reader may take: a fixed budget well above what the honest
/// tables of this small program need (the readers map debug information to symbolize).
const ADDRESS_SPACE: u64 = 1 << 30;
/// A reader's answer takes well under a second here; a hang is what this catches.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The fixture running, its stdin and stdout held to send commands; killed on drop.
struct Scribbler {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: u32,
    block: u64,
}

impl Scribbler {
    fn start(fixture: &Fixture) -> Scribbler {
        let mut cmd = waiting_fixture(fixture, profiler_library());
        // Every block in the table: the fields scribbled over are the table's (a tagged block
        // has no count or size a reader loops by; a scribbled tag key is refused, as the
        // readers' unit tests show).
        let mut child = spawn_fixture(
            cmd.env("MEM_TRACE_MODE", "debug")
                .env("MEM_TRACE_TAGS", "0"),
            fixture,
        );
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("the fixture's first line");
        let mut words = line.split_whitespace().skip(1);
        let (pid, block) = (words.next(), words.next());
        let pid = pid
            .and_then(|w| w.strip_prefix("pid="))
            .and_then(|p| p.parse().ok());
        let block = block
            .and_then(|w| w.strip_prefix("block=0x"))
            .and_then(|b| u64::from_str_radix(b, 16).ok());
        let (Some(pid), Some(block)) = (pid, block) else {
            panic!("no `ready pid=.. block=..` line: {line:?}");
        };
        Scribbler {
            child,
            stdin,
            stdout,
            pid,
            block,
        }
    }

    fn command(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the fixture");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("the fixture's answer");
        assert_eq!(answer.trim(), "ok", "the fixture refused {line:?}");
    }

    fn write(&mut self, addr: u64, value: u64) {
        self.command(&format!("w {addr:x} {value:x}"));
    }

    fn fill(&mut self, addr: u64, words: u64, value: u64) {
        self.command(&format!("f {addr:x} {words:x} {value:x}"));
    }

    fn restore(&mut self) {
        self.command("r");
    }
}

impl Drop for Scribbler {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One field to scribble over: where it is, and the values to try.
struct Field {
    name: String,
    addr: u64,
    values: Vec<(&'static str, u64)>,
}

fn word(target: &Target, addr: u64) -> u64 {
    read_plain::<u64>(target.memory(), addr).unwrap_or_else(|e| panic!("read {addr:#x}: {e}"))
}

/// Every table field the readers size a loop or a read by, located in the running process.
fn fields(target: &Target, block: u64) -> Vec<Field> {
    use core::mem::{offset_of, size_of};
    let h = target.header();
    let header: Header = read_plain(target.memory(), h).expect("the header");
    let shards = header.shards as u64;
    let pointer_values = vec![
        ("zero", 0),
        ("kernel", 0xffff_ffff_ff60_0000),
        ("non-canonical", 0x0008_0000_0000_0000),
        ("the header", h),
        ("the shard array", shards),
    ];
    let count_values = vec![
        ("zero", 0),
        ("2^24-1", (1 << 24) - 1),
        ("2^32", 1 << 32),
        ("2^64-1", u64::MAX),
    ];
    let mut out = Vec::new();
    let mut pointer = |name: &str, addr: u64| {
        out.push(Field {
            name: name.to_string(),
            addr,
            values: pointer_values.clone(),
        })
    };
    pointer("header.shards", h + offset_of!(Header, shards) as u64);
    pointer("header.stacks", h + offset_of!(Header, stacks) as u64);
    pointer("header.threads", h + offset_of!(Header, threads) as u64);
    pointer("header.freed", h + offset_of!(Header, freed) as u64);
    pointer("header.profile", h + offset_of!(Header, profile) as u64);
    pointer("header.tree", h + offset_of!(Header, tree) as u64);
    let shard = shards + (shard_of(block >> REGION_SHIFT) * size_of::<Shard>()) as u64;
    pointer("shard.array", shard + offset_of!(Shard, array) as u64);
    let stacks = header.stacks as u64;
    pointer("stacks.dir[0]", stacks + offset_of!(StackStore, dir) as u64);
    let threads = header.threads as u64;
    let thread_dir = threads + offset_of!(ThreadTable, dir) as u64;
    pointer("threads.dir[0]", thread_dir);
    let freed = header.freed as u64;
    pointer(
        "freed.records",
        freed + offset_of!(FreedHistory, records) as u64,
    );
    pointer(
        "freed.index",
        freed + offset_of!(FreedHistory, index) as u64,
    );
    let profile = header.profile as u64;
    pointer("profile.dir[0]", profile + offset_of!(Profile, dir) as u64);
    let tree = header.tree as u64;
    pointer("tree.dir[0]", tree + offset_of!(CallTree, dir) as u64);
    let first_thread = word(target, thread_dir) + size_of::<ThreadRecord>() as u64;
    pointer(
        "thread 1's counters",
        first_thread + offset_of!(ThreadRecord, counters) as u64,
    );

    let mut count = |name: &str, addr: u64| {
        out.push(Field {
            name: name.to_string(),
            addr,
            values: count_values.clone(),
        })
    };
    count("shard.live", shard + offset_of!(Shard, live) as u64);
    let array = word(target, shard + offset_of!(Shard, array) as u64);
    count("the slot array's capacity", array);
    count(
        "stacks.count",
        stacks + offset_of!(StackStore, count) as u64,
    );
    count(
        "threads.count",
        threads + offset_of!(ThreadTable, count) as u64,
    );
    count("tree.count", tree + offset_of!(CallTree, count) as u64);
    count(
        "freed.capacity",
        freed + offset_of!(FreedHistory, capacity) as u64,
    );
    count(
        "freed.written",
        freed + offset_of!(FreedHistory, written) as u64,
    );

    // The block's own slot: its size set to the largest the layout holds.
    let capacity = word(target, array);
    let slots = array + 16;
    let slot = (0..capacity)
        .map(|i| slots + 24 * i)
        .find(|&s| word(target, s) == block)
        .expect("the fixture's block in its shard");
    let size_thread = word(target, slot + 8);
    out.push(Field {
        name: "the block's size".into(),
        addr: slot + 8,
        values: vec![("2^40-1", size_thread | ((1 << 40) - 1))],
    });
    out
}

/// `mem-trace ARGS` under the time and address-space limits; what it did.
fn read(fixture: &Fixture, label: &str, args: &[String]) -> common::Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args).current_dir(&fixture.dir);
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: ADDRESS_SPACE,
                rlim_max: ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    };
    run_with_timeout(
        cmd,
        &fixture.dir.join(format!("read.{label}")),
        false,
        None,
        READ_TIMEOUT,
        &format!("mem-trace {}", args.join(" ")),
    )
}

/// Every reading subcommand against `target` (a pid or a core path).
fn subcommands(target: &str, block: u64, out: &Path) -> Vec<Vec<String>> {
    let svg = out.join("flame.svg").display().to_string();
    let json = out.join("dhat.json").display().to_string();
    let at = format!("{block:#x}");
    [
        vec!["info", target],
        vec!["top", target],
        vec!["peaks", target],
        vec!["leaks", target],
        vec!["why", target, &at],
        vec!["history", target, &at],
        vec!["flamegraph", target, "-o", &svg],
        vec!["dhat", target, "-o", &json],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(str::to_string).collect())
    .collect()
}

/// Runs every subcommand on `target`; the problems found, one line each.
fn check_readers(fixture: &Fixture, mutant: &str, target: &str, block: u64) -> Vec<String> {
    let mut problems = Vec::new();
    for (k, args) in subcommands(target, block, &fixture.dir).iter().enumerate() {
        let label = format!(
            "{}.{k}",
            mutant.replace(|c: char| !c.is_alphanumeric(), "_")
        );
        let out = read(fixture, &label, args);
        let shown = format!("{mutant}: mem-trace {}", args.join(" "));
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
            problems.push(format!(
                "{shown}: killed by signal {signal} after {:.1?} (stderr: {})",
                out.elapsed,
                out.stderr.trim()
            ));
        } else if !out.success() && out.stderr.trim().lines().count() != 1 {
            problems.push(format!(
                "{shown}: failed without one line:\n{}",
                out.stderr.trim()
            ));
        }
    }
    problems
}

/// gdb attached to the running process `pid` runs `commands` (the gdb side's mtrace
/// commands loaded); its output.
fn gdb_commands(fixture: &Fixture, label: &str, pid: u32, commands: &[String]) -> common::Output {
    let script = common::manifest_dir().join("gdb").join("mem_trace.py");
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off", "-p"])
        .arg(pid.to_string())
        .arg("-ex")
        .arg(format!("source {}", script.display()));
    for c in commands {
        cmd.arg("-ex").arg(c);
    }
    cmd.env_remove("LD_PRELOAD").current_dir(&fixture.dir);
    let label = label.replace(|c: char| !c.is_alphanumeric(), "_");
    run_with_timeout(
        cmd,
        &fixture.dir.join(format!("gdb.{label}")),
        true,
        None,
        Duration::from_secs(60),
        "gdb",
    )
}

/// gdb attached to the running mutant runs every mtrace command: no traceback, no hang.
fn check_gdb(fixture: &Fixture, mutant: &str, pid: u32, block: u64) -> Vec<String> {
    let at = format!("{block:#x}");
    let commands = [
        "mtrace-info".to_string(),
        format!("mtrace-why {at}"),
        format!("mtrace-history {at}"),
        "mtrace-top".to_string(),
        "mtrace-peaks".to_string(),
        "mtrace-leaks".to_string(),
    ];
    let out = gdb_commands(fixture, mutant, pid, &commands);
    let text = &out.stdout;
    if text.contains("Traceback") || text.contains("Python Exception") {
        vec![format!("{mutant}: gdb showed a Python error:\n{text}")]
    } else {
        Vec::new()
    }
}

#[test]
fn scribbled_tables_give_answers_or_one_line_running_and_in_a_core() {
    let fixture = c_fixture("scribble.c", &["-pthread"]);
    let mut s = Scribbler::start(&fixture);
    let pid = s.pid.to_string();
    let target = Target::open(&Source::Pid(s.pid as i32)).expect("the fixture as a target");
    let fields = fields(&target, s.block);

    // Honest tables: every subcommand answers.
    for args in subcommands(&pid, s.block, &fixture.dir) {
        let out = read(&fixture, "honest", &args);
        assert!(out.success(), "{}", out.describe());
    }

    let mut problems = Vec::new();
    let mut mutants = 0;
    let cores = fixture.dir.join("cores");
    std::fs::create_dir_all(&cores).expect("a directory for the cores");
    for field in &fields {
        for (i, (what, value)) in field.values.iter().enumerate() {
            let mutant = format!("{} = {what}", field.name);
            s.write(field.addr, *value);
            mutants += 1;
            problems.extend(check_readers(&fixture, &mutant, &pid, s.block));
            // gdb and a core for the last value of each field: enough to cover each field's
            // path, at a second or two each.
            if i + 1 == field.values.len() {
                problems.extend(check_gdb(&fixture, &mutant, s.pid, s.block));
                let core: PathBuf = cores.join(format!("core.{mutants}"));
                gcore(s.pid, &core, &fixture.dir.join("gcore.log"));
                let core_text = core.display().to_string();
                problems.extend(check_readers(
                    &fixture,
                    &format!("{mutant} (core)"),
                    &core_text,
                    s.block,
                ));
                let _ = std::fs::remove_file(&core);
            }
            s.restore();
        }
    }
    // Scribbles over several fields at once, as the probes that once hung or blew up did.
    let h = target.header();
    let header: Header = read_plain(target.memory(), h).expect("the header");
    let at = |base: u64, offset: usize| base + offset as u64;
    let (stacks, threads, freed) = (
        header.stacks as u64,
        header.threads as u64,
        header.freed as u64,
    );
    let profile_dir = at(header.profile as u64, core::mem::offset_of!(Profile, dir));
    let thread_dir = at(threads, core::mem::offset_of!(ThreadTable, dir));
    let first_chunk = word(&target, thread_dir);
    let counter_chunk = word(&target, profile_dir);
    type Scribble = fn(&mut Scribbler, u64, u64, u64, u64, u64, u64);
    let combined: [(&str, Scribble); 3] = [
        (
            "every counter of chunk 0 at its maximum, 2^24-1 stacks",
            |s, stacks, _, _, _, counters, _| {
                s.write(stacks, (1 << 24) - 1);
                s.fill(counters, 8 << 12, u64::MAX);
            },
        ),
        (
            "2^24-1 threads, every directory entry the first chunk",
            |s, _, threads, dir, first, _, _| {
                s.write(threads, (1 << 24) - 1);
                s.fill(dir + 8, 4095, first);
            },
        ),
        (
            "a history of 2^26 records without its index",
            |s, _, _, _, _, _, freed| {
                use core::mem::offset_of;
                s.write(freed + offset_of!(FreedHistory, capacity) as u64, 1 << 26);
                s.write(freed + offset_of!(FreedHistory, written) as u64, 1 << 26);
                s.write(freed + offset_of!(FreedHistory, index) as u64, 0);
            },
        ),
    ];
    for (mutant, scribble) in combined {
        scribble(
            &mut s,
            stacks,
            threads,
            thread_dir,
            first_chunk,
            counter_chunk,
            freed,
        );
        mutants += 1;
        problems.extend(check_readers(&fixture, mutant, &pid, s.block));
        problems.extend(check_gdb(&fixture, mutant, s.pid, s.block));
        s.restore();
    }
    assert!(mutants >= 100, "only {mutants} mutants");
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// What the inconsistent-tables test expects of one mutant: the lines the answers of
/// `mem-trace SUBCOMMAND` (and of gdb's `mtrace-SUBCOMMAND`) must hold, running and in a core.
struct Flagged {
    name: &'static str,
    expected: Vec<(&'static str, Vec<String>)>,
}

/// Impossible numbers are flagged, not only printed: a reader that shows a count gone below
/// zero as if it were real sends the user after a leak that is not there. The scribbler sets the
/// global live bytes to 2^64-1 (a count gone below zero), one stack's live bytes below zero,
/// and three shards' live bytes to a sum past 2^64. Each time `mem-trace peaks`, `top` or
/// `info` says `inconsistent tables:` for it below the numbers, running, in a core, and gdb's
/// commands say the same; honest tables have no such line.
#[test]
fn impossible_numbers_are_flagged_running_in_a_core_and_in_gdb() {
    use core::mem::{offset_of, size_of};
    let fixture = c_fixture("scribble.c", &["-pthread"]);
    let mut s = Scribbler::start(&fixture);
    let pid = s.pid.to_string();
    let target = Target::open(&Source::Pid(s.pid as i32)).expect("the fixture as a target");
    let h = target.header();
    let header: Header = read_plain(target.memory(), h).expect("the header");
    let answer = |label: &str, sub: &str, on: &str| {
        let out = read(&fixture, label, &[sub.to_string(), on.to_string()]);
        assert!(out.success(), "{}", out.describe());
        out.stdout
    };
    for sub in ["info", "top", "peaks"] {
        let text = answer("flag-honest", sub, &pid);
        assert!(!text.contains("inconsistent"), "{sub}: {text}");
    }

    // A stack the counters know, with live bytes: its shared record in chunk 0.
    let chunk = word(
        &target,
        header.profile as u64 + offset_of!(Profile, dir) as u64,
    );
    let record = (1..1u64 << 12)
        .map(|id| chunk + id * 64)
        .find(|&r| word(&target, r + 48) != 0 && word(&target, r) != 0)
        .expect("a counted stack with live bytes");
    let id = (record - chunk) / 64;
    let shard_bytes = |k: u64| {
        header.shards as u64 + k * size_of::<Shard>() as u64 + offset_of!(Shard, live_bytes) as u64
    };
    let sum_line = "inconsistent tables: live counts sum past 2^64 or below zero";
    let mutants: Vec<(Flagged, Vec<(u64, u64)>)> = vec![
        (
            Flagged {
                name: "global live bytes 2^64-1",
                expected: vec![
                    (
                        "peaks",
                        vec![
                            "live now: 18446744073709551615 bytes".to_string(),
                            "inconsistent tables: live bytes 18446744073709551615 above the peak"
                                .to_string(),
                        ],
                    ),
                    (
                        "top",
                        vec![
                            "inconsistent tables: live bytes 18446744073709551615 above the peak"
                                .to_string(),
                        ],
                    ),
                ],
            },
            vec![(h + offset_of!(Header, live_bytes) as u64, u64::MAX)],
        ),
        (
            Flagged {
                name: "a stack's live bytes below zero",
                expected: vec![(
                    "top",
                    vec![format!(
                        "inconsistent tables: the counters of 1 stack sum below zero or to more \
                         live than ever allocated (stack {id} first)"
                    )],
                )],
            },
            vec![(record, 1 << 63)],
        ),
        (
            Flagged {
                name: "shards' live bytes past 2^64",
                expected: vec![
                    (
                        "info",
                        vec![
                            "(18446744073709551615 bytes)".to_string(),
                            format!("  {sum_line}"),
                        ],
                    ),
                    ("top", vec![sum_line.to_string()]),
                    ("peaks", vec![sum_line.to_string()]),
                ],
            },
            (0..3).map(|k| (shard_bytes(k), 3 << 61)).collect(),
        ),
    ];
    let cores = fixture.dir.join("cores");
    std::fs::create_dir_all(&cores).expect("a directory for the cores");
    for (k, (flagged, writes)) in mutants.iter().enumerate() {
        for &(addr, value) in writes {
            s.write(addr, value);
        }
        let core = cores.join(format!("flagged.{k}"));
        gcore(s.pid, &core, &fixture.dir.join("gcore.log"));
        let core_text = core.display().to_string();
        let commands: Vec<String> = flagged
            .expected
            .iter()
            .map(|(sub, _)| format!("mtrace-{sub}"))
            .collect();
        let gdb = gdb_commands(&fixture, flagged.name, s.pid, &commands);
        for (sub, lines) in &flagged.expected {
            for (on, text) in [
                ("running", answer(flagged.name, sub, &pid)),
                ("core", answer(flagged.name, sub, &core_text)),
                ("gdb", gdb.stdout.clone()),
            ] {
                for line in lines {
                    assert!(
                        text.contains(line.as_str()),
                        "{}: {sub} ({on}) lacks {line:?}:\n{text}",
                        flagged.name
                    );
                }
            }
        }
        let _ = std::fs::remove_file(&core);
        s.restore();
    }
}
