//! The answers of the `mem-trace` command (`mem_trace_read::answer`) against the gdb commands'
//! on the same process: `tests/fixtures/profile_sites.c` under the profiler build, asleep after
//! its sites, is read from outside with `process_vm_readv` (as `mem-trace why|history|info|
//! top|peaks|leaks PID` will), symbolized with `mem_trace_read::symbolize`, and must give the
//! fixture's functions, file:line, sizes and offsets, and the very lines `mtrace-why`,
//! `-history`, `-info`, `-top`, `-peaks` and `-leaks` print for it in gdb attached to it, but
//! for gdb's own thread numbers (`, gdb thread N`).
//!
//! gdb stops the process to attach, so its threads' stack pointers and registers are known
//! there; the leak scan here is given them (from gdb), as it is given them from a core's
//! notes, so that both scan the same roots. A running process's scan without them is tested
//! in `mem_trace_read`'s unit tests.

mod common;

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mtrace::{comparable_with_gdb, with_entry_script, without_gdb_thread};
use common::{
    c_fixture, mem_trace_binary, profiler_library, run_with_timeout, script, Fixture, GDB_TIMEOUT,
};
use mem_trace_read::answer::{
    self, frame, profile::By, HistoryOptions, LeakTarget, LeaksOptions, Lookups, PeaksOptions,
    TopOptions, WhyOptions,
};
use mem_trace_read::layout::Tables;
use mem_trace_read::target::{Source, Symbols, Target, ThreadState};

/// The fixture running under the profiler build; killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `profile_sites sleep 600000`: its sites done, it sleeps in `clock_nanosleep`.
fn start(fixture: &Fixture) -> Running {
    let child = Command::new(&fixture.bin)
        .args(["sleep", "600000"])
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_PROFILE_INTERVAL", "0")
        .env("MEM_TRACE_LEAKS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", fixture.bin.display()));
    let running = Running(child);
    // The main thread blocked in clock_nanosleep (system call 230) is past every site.
    let syscall = format!("/proc/{}/syscall", running.0.id());
    let start = Instant::now();
    while !fs::read_to_string(&syscall).is_ok_and(|s| s.starts_with("230 ")) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} did not reach its sleep",
            fixture.bin.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    running
}

/// The commands, each after a `=== NAME` line; then the header's address, two blocks'
/// addresses and every thread's stack pointer and general registers (as mtrace-leaks reads
/// them).
const SCRIPT: &str = r#"
source {dir}/mem_trace.py
echo === why-hold\n
mtrace-why (char *)held[5] + 16
echo === why-kept\n
mtrace-why kept[2]
echo === why-after\n
mtrace-why (char *)kept[2] + 5004
echo === history\n
mtrace-history kept[2]
echo === info\n
mtrace-info
echo === top\n
mtrace-top
echo === allocated\n
mtrace-top 3 --by allocated
echo === thread\n
mtrace-top 2 --thread 1 --by blocks -f 2
echo === peaks\n
mtrace-peaks -n 2
echo === leaks\n
mtrace-leaks -n 0
echo === end\n
set language c
printf "header %lx\n", (unsigned long)&MEM_TRACE_HEADER
printf "hold %lx\n", (unsigned long)held[5]
printf "kept %lx\n", (unsigned long)kept[2]
python
REGISTERS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
for t in gdb.selected_inferior().threads():
    t.switch()
    f = gdb.newest_frame()
    words = [int(f.read_register(r)) & (2**64 - 1) for r in REGISTERS]
    print("thread %d %s" % (t.ptid[1], " ".join("%x" % w for w in words)))
end
"#;

/// What gdb attached to the process printed.
struct FromGdb {
    sections: HashMap<String, Vec<String>>,
    header: u64,
    hold: u64,
    kept: u64,
    threads: Vec<ThreadState>,
    output: String,
}

fn hex(word: &str) -> u64 {
    u64::from_str_radix(word, 16).unwrap_or_else(|e| panic!("{word:?}: {e}"))
}

fn ask_gdb(fixture: &Fixture, pid: u32) -> FromGdb {
    gdb_on(fixture, "answers", &["-p", &pid.to_string()], "")
}

/// gdb on `target` (`-p PID`, or the executable and a core) running [`SCRIPT`], then `more`.
fn gdb_on(fixture: &Fixture, label: &str, target: &[&str], more: &str) -> FromGdb {
    let path = fixture.dir.join(format!("{label}.gdb"));
    let script = format!(
        "set pagination off\nset width 0\nset height 0\nset confirm off\n\
         set debuginfod enabled off\n{}{more}\n",
        SCRIPT.replace("{dir}", &fixture.dir.display().to_string())
    );
    fs::write(&path, script).expect("write the gdb script");
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-x"])
        .arg(&path)
        .args(target)
        .current_dir(&fixture.dir)
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join(format!("{label}.gdb-output")),
        true,
        None,
        GDB_TIMEOUT,
        "gdb",
    );
    let output = out.stdout.clone();
    let mut sections: HashMap<String, Vec<String>> = HashMap::new();
    let mut current: Option<String> = None;
    let (mut header, mut hold, mut kept) = (0, 0, 0);
    let mut threads = Vec::new();
    for line in output.lines() {
        if let Some(name) = line.strip_prefix("=== ") {
            current = (name != "end").then(|| name.to_string());
            continue;
        }
        if let Some(name) = &current {
            sections
                .entry(name.clone())
                .or_default()
                .push(line.to_string());
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["header", a] => header = hex(a),
            ["hold", a] => hold = hex(a),
            ["kept", a] => kept = hex(a),
            ["thread", tid, regs @ ..] if regs.len() == 16 => {
                let registers: Vec<u64> = regs.iter().map(|w| hex(w)).collect();
                threads.push(ThreadState {
                    tid: tid.parse().expect("a tid"),
                    sp: Some(registers[7]),
                    registers,
                });
            }
            _ => {}
        }
    }
    assert!(
        header != 0 && hold != 0 && kept != 0 && !threads.is_empty(),
        "gdb did not print the header, the blocks and the threads\n{}",
        out.describe()
    );
    FromGdb {
        sections,
        header,
        hold,
        kept,
        threads,
        output,
    }
}

/// The same answers from outside, by section name, over the process opened as the `mem-trace`
/// command opens it (its modules, mappings and symbolizer; the header is gdb's).
fn answers(target: &Target, gdb: &FromGdb) -> HashMap<String, Vec<String>> {
    // As the command opens them: with the mappings, where small blocks are found by their tags.
    let tables = Tables::open(target.memory(), gdb.header)
        .expect("the tables")
        .with_regions(mem_trace_read::layout::tags::regions(target.mappings()));
    let (modules, mappings) = (target.modules(), target.mappings());
    let mut symbols = Symbols::new(target);
    let mut symbolize = |pc: u64| frame::target_frames(&mut symbols, pc);
    let mut lookups = Lookups::new(&tables, &mut symbolize);
    let l = &mut lookups;
    let t = &tables;
    let ok = |r: Result<Vec<String>, answer::AnswerError>| r.unwrap_or_else(|e| panic!("{e}"));
    let why = WhyOptions::default();
    let target = LeakTarget {
        header: gdb.header,
        modules,
        mappings,
        threads: &gdb.threads,
    };
    let top = |count, by, thread, frames| TopOptions {
        count,
        by,
        thread,
        frames,
    };
    HashMap::from([
        ("why-hold", ok(answer::why(t, l, gdb.hold + 16, &why))),
        ("why-kept", ok(answer::why(t, l, gdb.kept, &why))),
        ("why-after", ok(answer::why(t, l, gdb.kept + 5004, &why))),
        (
            "history",
            ok(answer::history(t, l, gdb.kept, &HistoryOptions::default())),
        ),
        ("info", ok(answer::info(t, gdb.header))),
        ("top", ok(answer::top(t, l, &TopOptions::default()))),
        (
            "allocated",
            ok(answer::top(t, l, &top(3, By::Allocated, None, Some(8)))),
        ),
        (
            "thread",
            ok(answer::top(t, l, &top(2, By::Blocks, Some(1), Some(2)))),
        ),
        (
            "peaks",
            ok(answer::peaks(
                t,
                l,
                &PeaksOptions {
                    count: 2,
                    ..PeaksOptions::default()
                },
            )),
        ),
        (
            "leaks",
            ok(answer::leaks(
                t,
                l,
                &target,
                &LeaksOptions {
                    count: None,
                    ..LeaksOptions::default()
                },
            )),
        ),
    ])
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain([("leaks-running".to_string(), {
        // As `mem-trace leaks PID` sees a process it does not stop: no stack pointers, no
        // registers.
        let running: Vec<ThreadState> = gdb
            .threads
            .iter()
            .map(|t| ThreadState {
                tid: t.tid,
                sp: None,
                registers: Vec::new(),
            })
            .collect();
        let target = LeakTarget {
            threads: &running,
            ..target
        };
        ok(answer::leaks(t, l, &target, &LeaksOptions::default()))
    })])
    .collect()
}

#[test]
fn answers_equal_the_gdb_commands_on_the_same_process() {
    let fixture = with_entry_script(c_fixture("profile_sites.c", &[]));
    let running = start(&fixture);
    let pid = running.0.id();
    let gdb = ask_gdb(&fixture, pid);
    let target = Target::open(&Source::Pid(pid as i32)).expect("the process as a target");
    let ours = answers(&target, &gdb);
    let modules = target.modules();
    drop(running);

    let src = fixture.src.display().to_string();
    let text = fs::read_to_string(&fixture.src).expect("the fixture's source");
    let markers = script::parse(&fixture.src, &text)
        .expect("the fixture's directives")
        .markers;
    let at = |name: &str| format!("at {src}:{}", markers[name]);
    let report = |name: &str| {
        format!(
            "----- ours ({name}) -----\n{}\n----- gdb -----\n{}",
            ours[name].join("\n"),
            gdb.output
        )
    };

    // What the answers say, from the fixture's own facts.
    let why = &ours["why-hold"];
    assert!(
        why[0].starts_with(&format!(
            "{:#x} is 16 bytes inside a 4096-byte block [{:#x}, {:#x}) allocated by thread 1 (#",
            gdb.hold + 16,
            gdb.hold,
            gdb.hold + 4096
        )),
        "{}",
        report("why-hold")
    );
    assert!(
        why[1].contains(&format!(" in hold_site {}", at("hold"))),
        "{}",
        report("why-hold")
    );
    let kept = &ours["why-kept"];
    assert!(
        kept[0].starts_with(&format!(
            "{:#x} is at the start of a 5000-byte block [{:#x}, {:#x}) allocated by thread 1 (#",
            gdb.kept,
            gdb.kept,
            gdb.kept + 5000
        )) && kept[1].contains(&format!(" in kept_site {}", at("kept"))),
        "{}",
        report("why-kept")
    );
    let top = &ours["top"];
    let biggest = top
        .iter()
        .position(|l| l == "# 0: 67108864 bytes in 16384 blocks")
        .unwrap_or_else(|| panic!("{}", report("top")));
    assert!(
        top[biggest + 1].contains(&format!(" in hold_site {}", at("hold"))),
        "{}",
        report("top")
    );
    let leaks = &ours["leaks"];
    let lost = leaks
        .iter()
        .position(|l| l == "definitely lost: 100000 bytes in 100 blocks, allocated from:")
        .unwrap_or_else(|| panic!("{}", report("leaks")));
    assert!(
        leaks[lost + 1].contains(&format!(" in leak_site {}", at("leak"))),
        "{}",
        report("leaks")
    );

    // A scan that does not stop the process scans its live threads' whole stacks instead
    // (found by their guard page and control block): here it finds them all, and classifies
    // alike.
    let running = &ours["leaks-running"];
    let stacks: usize = running[0]
        .split(" thread stack")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", report("leaks-running")));
    assert!(
        stacks >= gdb.threads.len() && running[0].contains(", 0 register sets)"),
        "{}",
        report("leaks-running")
    );
    assert_eq!(
        running.last(),
        ours["leaks"].last(),
        "{}",
        report("leaks-running")
    );

    // And the gdb commands' very lines.
    for bad in ["Traceback", "Python Exception", "internal error"] {
        assert!(
            !gdb.output.contains(bad),
            "`{bad}` in gdb's output\n{}",
            gdb.output
        );
    }
    assert!(
        modules.iter().any(|m| m.path == fixture.bin),
        "{} is not among the modules: its frames would not be compared whole",
        fixture.bin.display()
    );
    let same = |line: &str| comparable_with_gdb(line, &src);
    let mut names: Vec<&String> = ours.keys().filter(|k| *k != "leaks-running").collect();
    names.sort();
    for name in names {
        let theirs: Vec<String> = gdb
            .sections
            .get(name)
            .unwrap_or_else(|| panic!("no section {name} in gdb's output\n{}", gdb.output))
            .iter()
            .map(|l| same(l))
            .collect();
        let ours: Vec<String> = ours[name].iter().map(|l| same(l)).collect();
        assert_eq!(ours, theirs, "{name}\n{}", report(name));
    }
}

/// The `mem-trace` twin of each section of [`SCRIPT`], on `target` (a PID or a core file).
fn twins(fixture: &Fixture, target: &str, gdb: &FromGdb) -> HashMap<String, Vec<String>> {
    let (hold, kept) = (format!("{:#x}", gdb.hold + 16), format!("{:#x}", gdb.kept));
    let after = format!("{:#x}", gdb.kept + 5004);
    let commands: [(&str, Vec<&str>); 10] = [
        ("why-hold", vec!["why", target, &hold]),
        ("why-kept", vec!["why", target, &kept]),
        ("why-after", vec!["why", target, &after]),
        ("history", vec!["history", target, &kept]),
        ("info", vec!["info", target]),
        ("top", vec!["top", target]),
        (
            "allocated",
            vec!["top", target, "-n", "3", "--by", "allocated"],
        ),
        (
            "thread",
            vec![
                "top", target, "-n", "2", "--thread", "1", "--by", "blocks", "-f", "2",
            ],
        ),
        ("peaks", vec!["peaks", target, "-n", "2"]),
        ("leaks", vec!["leaks", target, "-n", "0"]),
    ];
    commands
        .into_iter()
        .map(|(name, args)| {
            let mut cmd = Command::new(mem_trace_binary());
            cmd.args(&args)
                .current_dir(&fixture.dir)
                .env_remove("LD_PRELOAD");
            let out = run_with_timeout(
                cmd,
                &fixture
                    .dir
                    .join(format!("twin-{name}-{}", target.replace('/', "_"))),
                false,
                None,
                GDB_TIMEOUT,
                &format!("mem-trace {}", args.join(" ")),
            );
            assert!(out.success(), "{}", out.describe());
            (
                name.to_string(),
                out.stdout.lines().map(str::to_string).collect(),
            )
        })
        .collect()
}

/// gdb's commands and the `mem-trace` command answer through one reader: on the same process,
/// live (gdb holds it stopped; `mem-trace leaks` stops it itself) and from its core, each
/// command prints the very lines of its twin, frames, file:line and figures alike, but for
/// gdb's own thread numbers.
#[test]
fn the_gdb_commands_and_their_mem_trace_twins_print_the_same_live_and_from_a_core() {
    let fixture = with_entry_script(c_fixture("profile_sites.c", &[]));
    let running = start(&fixture);
    let pid = running.0.id().to_string();
    let core = fixture.dir.join("sites.core");
    let live = gdb_on(
        &fixture,
        "live",
        &["-p", &pid],
        &format!("generate-core-file {}", core.display()),
    );
    assert!(core.is_file(), "gdb wrote no core\n{}", live.output);
    let live_twins = twins(&fixture, &pid, &live);
    drop(running);
    let bin = fixture.bin.display().to_string();
    let core_name = core.display().to_string();
    let from_core = gdb_on(&fixture, "core", &[&bin, &core_name], "");
    let core_twins = twins(&fixture, &core_name, &from_core);

    for (what, gdb, ours) in [
        ("live", &live, &live_twins),
        ("core", &from_core, &core_twins),
    ] {
        for bad in ["Traceback", "Python Exception", "internal error"] {
            assert!(
                !gdb.output.contains(bad),
                "{what}: `{bad}` in gdb's output\n{}",
                gdb.output
            );
        }
        // A command that failed says so on a line of its own, `mtrace-why: ...`.
        assert!(
            !gdb.output.lines().any(|l| l.starts_with("mtrace-")),
            "{what}: a command failed\n{}",
            gdb.output
        );
        let mut names: Vec<&String> = ours.keys().collect();
        names.sort();
        for name in names {
            let theirs: Vec<String> = gdb
                .sections
                .get(name)
                .unwrap_or_else(|| {
                    panic!("{what}: no section {name} in gdb's output\n{}", gdb.output)
                })
                .iter()
                .map(|l| without_gdb_thread(l))
                .collect();
            assert_eq!(ours[name], theirs, "{what}: {name}\n{}", gdb.output);
        }
    }
    // The answers name the fixture's own lines: the same text is a right text.
    let src = fixture.src.display().to_string();
    assert!(
        core_twins["why-kept"][1].contains(&format!(" in kept_site at {src}:")),
        "{:?}",
        core_twins["why-kept"]
    );
}
