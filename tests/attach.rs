//! `mem-trace attach PID` and `mem-trace detach PID` on real processes started without the
//! tracer: a busy multi-threaded program (lazy binding), an idle one blocked in `read`, a
//! full-RELRO BIND_NOW Rust program; the readers and gdb's `mtrace-why` on what they allocate
//! afterwards; detach and attach again; and each refusal that can be provoked here (stopped,
//! attached or preloaded already, another malloc, static, strict seccomp, another mount
//! namespace where the library is not the same file, not dumpable).

mod common;

use common::mtrace::with_entry_script;
use common::{
    c_fixture, c_shared_library, library, line_of, mem_trace_binary, run_with_timeout,
    rust_fixture, Fixture, Output, GDB_TIMEOUT,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// The attach tests take turns: each stops threads of its target for a moment, and the
/// busy fixture keeps a core busy.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fixture running without the tracer, its stdout read line by line.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    pid: u32,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the fixture");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut r = Running {
            stdin: child.stdin.take(),
            pid: child.id(),
            child,
            lines,
            seen: Vec::new(),
        };
        let ready = r.line();
        assert!(ready.starts_with("ready pid="), "{ready}");
        r
    }

    /// The next line of stdout, within 30 s.
    fn line(&mut self) -> String {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| {
                panic!("no output from the program ({e}); so far: {:?}", self.seen)
            });
        self.seen.push(line.clone());
        line
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to the program");
        stdin.flush().expect("flush");
    }

    /// Sends "alloc" and returns the address the program printed.
    fn alloc(&mut self) -> u64 {
        self.send("alloc");
        let line = self.line();
        let hex = line
            .strip_prefix("after=0x")
            .unwrap_or_else(|| panic!("not an address line: {line}"));
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// Closes stdin (after `last`, if any) and waits: the rest of stdout, stderr, the status.
    fn finish(mut self, last: Option<&str>) -> (Vec<String>, String, std::process::ExitStatus) {
        if let Some(l) = last {
            self.send(l);
        }
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the program did not exit: {:?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        (std::mem::take(&mut self.seen), stderr, status)
    }

    /// The process's state letter, from /proc/PID/stat.
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
        stat.rsplit_once(')')
            .unwrap()
            .1
            .trim_start()
            .chars()
            .next()
            .unwrap()
    }
}

/// `bin` started without the tracer.
fn plain(bin: &std::path::Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_remove("LD_PRELOAD");
    cmd
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mem-trace ARGS` within 60 s (the attach's own limits are shorter).
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str]) -> Output {
    mem_trace_env(fixture, label, args, &[])
}

/// [`mem_trace`] with variables set.
fn mem_trace_env(fixture: &Fixture, label: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.envs(vars.iter().copied());
    cmd.args(args)
        .current_dir(&fixture.dir)
        .env("MEM_TRACE_LIB", library())
        .env_remove("LD_PRELOAD");
    run_with_timeout(
        cmd,
        &fixture.dir.join(format!("mem-trace.{label}")),
        false,
        None,
        Duration::from_secs(60),
        &format!("mem-trace {}", args.join(" ")),
    )
}

/// How the answers name `function` at the fixture's line marked `@marker`.
fn site_at(f: &Fixture, function: &str, marker: &str) -> String {
    format!("{function} at {}:{}", f.src.display(), line_of(f, marker))
}

/// `mem-trace attach PID`, which must succeed with one line.
fn attach(fixture: &Fixture, pid: u32, label: &str) -> Output {
    attach_with(fixture, pid, label, &[])
}

/// `mem-trace attach PID OPTIONS...`, which must succeed with one line.
fn attach_with(fixture: &Fixture, pid: u32, label: &str, options: &[&str]) -> Output {
    let pid_arg = pid.to_string();
    let args: Vec<&str> = ["attach", pid_arg.as_str()]
        .into_iter()
        .chain(options.iter().copied())
        .collect();
    let out = mem_trace(fixture, label, &args);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.describe());
    assert!(
        out.stdout
            .starts_with(&format!("mem-trace: attached to process {pid} (")),
        "{}",
        out.describe()
    );
    out
}

fn detach(fixture: &Fixture, pid: u32, label: &str) -> Output {
    let out = mem_trace(fixture, label, &["detach", &pid.to_string()]);
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stdout
            .starts_with(&format!("mem-trace: detached from process {pid}:")),
        "{}",
        out.describe()
    );
    out
}

/// Hex addresses replaced, for comparing two runs' output.
fn masked(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !l.starts_with("ready pid="))
        .map(|l| match l.split_once("=0x") {
            Some((k, _)) => format!("{k}=ADDR"),
            None => l.clone(),
        })
        .collect()
}

/// gdb attached to `pid`, `mtrace-why ADDR`: its output.
fn gdb_why(fixture: &Fixture, pid: u32, addr: u64) -> String {
    let script = fixture.dir.join("attach-why.gdb");
    std::fs::write(
        &script,
        format!(
            "set pagination off\nset width 0\nset confirm off\nset debuginfod enabled off\n\
             source {}/mem_trace.py\nmtrace-why {addr:#x}\n",
            fixture.dir.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-p", &pid.to_string(), "-x"])
        .arg(&script)
        .current_dir(&fixture.dir)
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join("attach-why.gdb-output"),
        true,
        None,
        GDB_TIMEOUT,
        "gdb",
    );
    out.stdout
}

fn idle_fixture() -> Fixture {
    // The RUNPATH is where the "plugin" command's library is found, and only there.
    c_fixture(
        "attach_idle.c",
        &["-pthread", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/plugins"],
    )
}

fn busy_fixture() -> Fixture {
    // Lazy binding, deliberately: the GOT's JUMP_SLOTs still point at the PLT for functions
    // not called yet.
    with_entry_script(c_fixture("attach_busy.c", &["-pthread", "-Wl,-z,lazy"]))
}

#[test]
fn a_busy_program_attached_detached_and_attached_again_runs_on_unchanged() {
    let _turn = one_at_a_time();
    let f = busy_fixture();
    let mut unattached = Running::start(plain(&f.bin));
    unattached.alloc();
    unattached.send("free-before");
    unattached.line();
    unattached.line();
    unattached.alloc();
    let (plain_out, plain_err, plain_status) = unattached.finish(Some("quit"));
    assert!(plain_status.success(), "{plain_status}: {plain_err}");

    let mut p = Running::start(plain(&f.bin));
    std::thread::sleep(Duration::from_millis(200));
    let a = attach(&f, p.pid, "attach1");
    assert!(
        a.stdout.contains("GOT entries now call the tracer"),
        "{}",
        a.describe()
    );
    let after = p.alloc();
    std::thread::sleep(Duration::from_millis(100));

    // The sites that allocate after the attach are named, by the command and by gdb.
    let top = mem_trace(&f, "top", &["top", &p.pid.to_string()]);
    assert!(top.success(), "{}", top.describe());
    let site = site_at(&f, "attach_site", "attach-site");
    assert!(
        top.stdout.contains(&site),
        "no {site:?} in\n{}",
        top.describe()
    );
    let why = gdb_why(&f, p.pid, after + 10);
    let site = site_at(&f, "after_site", "after-site");
    assert!(why.contains("4242"), "{why}");
    assert!(why.contains(&site), "no {site:?} in\n{why}");
    let info = mem_trace(&f, "info", &["info", &p.pid.to_string()]);
    assert!(
        info.stdout
            .contains("attached (blocks from before the attach are unknown)"),
        "{}",
        info.describe()
    );

    // The block allocated before the attach is freed by glibc, with no report.
    p.send("free-before");
    assert_eq!(p.line(), "before held \"allocated before any attach\"");
    assert_eq!(p.line(), "freed before");

    detach(&f, p.pid, "detach1");
    std::thread::sleep(Duration::from_millis(100));
    let a2 = attach(&f, p.pid, "attach2");
    assert!(
        a2.stdout.contains("with the first attach's settings"),
        "{}",
        a2.describe()
    );
    p.alloc();
    detach(&f, p.pid, "detach2");
    let (out, err, status) = p.finish(Some("quit"));
    assert!(status.success(), "{status}: {err}");
    assert_eq!(masked(&out), masked(&plain_out), "stderr: {err}");
    assert!(
        out.iter().any(|l| l == "threads=4 corrupted_bytes=0"),
        "{out:?}"
    );
    assert_eq!(err, plain_err, "the program's stderr changed");
}

/// Sampling in a process attached to (`--sample 64K`, a size as `MEM_TRACE_SAMPLE` takes it):
/// the library was `dlopen`ed, so its hooks reach their thread's state through the TLS
/// descriptor rather than a static offset. Four threads allocate on: the sites are named, as
/// estimates at that rate, and the program ends as without the attach.
#[test]
fn a_busy_program_attached_with_sampling_is_estimated_and_runs_on() {
    let _turn = one_at_a_time();
    let f = busy_fixture();
    let p = Running::start(plain(&f.bin));
    std::thread::sleep(Duration::from_millis(200));
    let pid = p.pid.to_string();
    attach_with(
        &f,
        p.pid,
        "sampled-attach",
        &["--mode", "profile", "--sample", "64K"],
    );
    std::thread::sleep(Duration::from_millis(500));
    // By bytes allocated: the threads keep few blocks live, often none sampled.
    let top = mem_trace(&f, "sampled-top", &["top", &pid, "--by", "allocated"]);
    assert!(top.success(), "{}", top.describe());
    for want in [
        "this process samples one allocation per ~64 KiB".to_string(),
        site_at(&f, "attach_site", "attach-site"),
    ] {
        assert!(
            top.stdout.contains(&want),
            "no {want:?} in\n{}",
            top.describe()
        );
    }
    detach(&f, p.pid, "sampled-detach");
    let (out, err, status) = p.finish(Some("quit"));
    assert!(status.success(), "{status}: {err}");
    assert!(
        out.iter().any(|l| l == "threads=4 corrupted_bytes=0"),
        "{out:?}"
    );
    assert!(err.is_empty(), "the program's stderr: {err}");
}

/// Found by this test: re-attached, the quarantine recycled a block by the size a detach
/// had left recorded, while glibc had reused the address for a smaller one (heap corruption,
/// false invalid-free reports): attached tracers now hold no quarantine, and an attach
/// forgets what hooks still in flight recorded during the last detach. Then: a thread's
/// breakpoint hit collected while the injector waited for another thread's stop was never
/// rewound, and its `SIGTRAP` was delivered (the target died of it, 3 runs in 3).
#[test]
fn twenty_attach_detach_cycles_on_a_busy_program_change_nothing_it_prints() {
    cycles(20);
}

/// The soak. Measured: 200 cycles in 94 s on this 2-core machine (load average 4),
/// 557 s at load average 7.5; the target's RSS 5824 kB after the first cycle and after the
/// 200th (about 1.8 MB before any attach).
#[test]
#[ignore = "200 attach/detach cycles take 94 s on this 2-core machine (557 s when it is loaded); \
            twenty_attach_detach_cycles runs the same checks in the suite"]
fn two_hundred_attach_detach_cycles_on_a_busy_program_leak_nothing() {
    cycles(200);
}

/// What the busy target's resident memory may grow by between the end of the first cycle
/// (the library mapped, its tables made) and the end of the last: a cycle must not keep
/// anything of the target's. Measured growth: 0 kB over 200 cycles.
const CYCLES_RSS_SLACK_KB: u64 = 512;

/// The target's VmRSS, kB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// `n` attach/detach cycles on the busy 4-thread program: it prints what it prints
/// unattached, exits 0, its blocks are intact, and its RSS after the last cycle is within
/// [`CYCLES_RSS_SLACK_KB`] of what it was after the first.
fn cycles(n: usize) {
    let _turn = one_at_a_time();
    let f = busy_fixture();
    let mut unattached = Running::start(plain(&f.bin));
    unattached.send("free-before");
    unattached.line();
    unattached.line();
    let (plain_out, _, plain_status) = unattached.finish(Some("quit"));
    assert!(plain_status.success(), "{plain_status}");

    let mut p = Running::start(plain(&f.bin));
    let mut after_first = 0;
    let started = Instant::now();
    for i in 0..n {
        // Every other attach without waiting for a thread at malloc's entry: a busy program
        // then gets its main thread, blocked in read, which once found libc in the wrong
        // mapping (the unwinder's copy of libc.so.6).
        let wait = if i % 2 == 0 { "200" } else { "0" };
        let pid = p.pid.to_string();
        let vars = [("MEM_TRACE_ATTACH_WAIT_MS", wait)];
        // Not waiting, the main thread is sometimes caught back on its `syscall`
        // instruction, about to restart the `read` the attach's own first stop interrupted
        // (about one attach in 300 was refused for it, "no thread was at a safe point").
        let a = mem_trace_env(&f, &format!("cycle{i}-attach"), &["attach", &pid], &vars);
        assert!(a.success(), "cycle {i}: {}", a.describe());
        if i < 20 {
            live_figures_agree(&f, p.pid, i);
        }
        detach(&f, p.pid, &format!("cycle{i}-detach"));
        if i == 0 {
            after_first = rss_kb(p.pid);
        }
    }
    let last = rss_kb(p.pid);
    eprintln!(
        "{n} cycles in {:.1} s; RSS after the first {after_first} kB, after the last {last} kB",
        started.elapsed().as_secs_f64()
    );
    assert!(
        last <= after_first + CYCLES_RSS_SLACK_KB,
        "RSS grew from {after_first} kB after the first cycle to {last} kB after {n}"
    );
    p.send("free-before");
    assert_eq!(p.line(), "before held \"allocated before any attach\"");
    assert_eq!(p.line(), "freed before");
    let (out, err, status) = p.finish(Some("quit"));
    assert!(status.success(), "{status}: {err}");
    assert_eq!(masked(&out), masked(&plain_out), "stderr: {err}");
    assert!(
        out.iter().any(|l| l == "threads=4 corrupted_bytes=0"),
        "{out:?}"
    );
    assert!(err.is_empty(), "{err}");
}

/// With the attached program stopped (SIGSTOP), `top`, `peaks` and `info` give the same
/// live bytes and blocks: the blocks of earlier attaches, forgotten at their detach, are in
/// none of them.
fn live_figures_agree(f: &Fixture, pid: u32, cycle: usize) {
    let ask = |what: &str| {
        let out = mem_trace(
            f,
            &format!("cycle{cycle}-{what}"),
            &[what, &pid.to_string()],
        );
        assert!(out.success(), "cycle {cycle}: {}", out.describe());
        out.stdout
    };
    // SAFETY: kill with the pid of the test's own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    wait_stopped(pid);
    let (top, peaks, info) = (ask("top"), ask("peaks"), ask("info"));
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    // "live: 9192 bytes in 3 blocks; peak: ...", "live now: 9192 bytes in 3 blocks",
    // "  live blocks:     3 (9192 bytes)".
    let numbers = |text: &str, prefix: &str| -> (u64, u64) {
        let line = text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("cycle {cycle}: no `{prefix}` in\n{text}"));
        let n: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .take(2)
            .collect();
        (n[0], n[1])
    };
    let from_top = numbers(&top, "live: ");
    let from_peaks = numbers(&peaks, "live now: ");
    let (blocks, bytes) = numbers(&info, "live blocks:");
    assert_eq!(from_top, from_peaks, "cycle {cycle}:\n{top}\n{peaks}");
    // SIGSTOP may stop each of the 4 threads inside a hook, its block counted and not yet in
    // the table (or the reverse): at most one block of the busy loop's (up to 331 bytes)
    // each. An attach that kept the last one's bytes is off by a cycle's worth (~50 KB).
    let close = from_top.0.abs_diff(bytes) <= 4 * 331 && from_top.1.abs_diff(blocks) <= 4;
    assert!(
        close,
        "cycle {cycle}: live figures disagree\n{top}\n{peaks}\n{info}"
    );
}

/// Waits until every thread of `pid` is stopped. A `SIGSTOP` takes effect late: the thread
/// that takes it, here the main one asleep in `read`, must first be scheduled to stop the
/// others, and with the four busy threads on two processors that took long enough for
/// thousands of allocations to happen between `top` and `peaks`.
fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command name, which is in parentheses.
                let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
                matches!(state, Some("T") | Some("t") | None)
            })
    };
    while !stopped() {
        assert!(Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `mem-trace attach` on the idle target with a long wait for a thread at malloc's entry
/// (none comes), its stderr piped; returns once the target is traced, with the command and
/// the tracing process (the command's child).
fn attach_waiting(p: &Running) -> (Child, i32) {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["attach", &p.pid.to_string()])
        .env("MEM_TRACE_LIB", library())
        .env("MEM_TRACE_ATTACH_WAIT_MS", "5000")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let attacher = cmd.spawn().expect("start mem-trace attach");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tracer_of(p.pid) == 0 {
        assert!(Instant::now() < deadline, "the target was never traced");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The breakpoints go in right after every thread is seized.
    std::thread::sleep(Duration::from_millis(100));
    let tracer = tracer_of(p.pid);
    (attacher, tracer)
}

/// Waits until `pid` is traced by nobody.
fn untraced(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tracer_of(pid) != 0 {
        assert!(Instant::now() < deadline, "left traced");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_attacher_killed_with_sigkill_while_waiting_leaves_no_breakpoint_behind() {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    let mut p = Running::start(plain(&f.bin));
    let (mut attacher, tracer) = attach_waiting(&p);
    assert_ne!(
        tracer,
        attacher.id() as i32,
        "the command traces the target itself"
    );
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(attacher.id() as i32, libc::SIGKILL) };
    attacher.wait().expect("wait for mem-trace");
    // The tracing half saw its parent die and let the target go.
    untraced(p.pid);
    // It allocates, on two threads: a breakpoint left in malloc would kill it with SIGTRAP.
    p.alloc();
    p.send("thread");
    assert_eq!(p.line(), "thread=ok");
    // Nothing of the killed attach is left: attached and detached again.
    attach(&f, p.pid, "after-sigkill");
    p.alloc();
    detach(&f, p.pid, "after-sigkill-detach");
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

#[test]
fn the_tracing_half_killed_with_sigkill_has_its_breakpoints_put_back() {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    let mut p = Running::start(plain(&f.bin));
    let (mut attacher, tracer) = attach_waiting(&p);
    // SAFETY: kill of the command's child, the tracer of our own child.
    unsafe { libc::kill(tracer, libc::SIGKILL) };
    let status = attacher.wait().expect("wait for mem-trace");
    let mut err = String::new();
    std::io::Read::read_to_string(attacher.stderr.as_mut().unwrap(), &mut err).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}: {err}");
    assert!(
        err.contains("killed by signal 9 with 2 breakpoint(s)")
            && err.contains("their bytes were put back"),
        "{err}"
    );
    untraced(p.pid);
    p.alloc();
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

/// Both halves of the command killed at once while they wait for a safe point (the command
/// stopped first, so that it cannot put the bytes back, then its tracing child killed): the
/// idle target is let go by the kernel with the `int3`s in its allocator. The next attach
/// recognises them as its own (an `int3` in place of the first byte, the rest as in libc's
/// file), puts libc's bytes back, says so, and attaches; the program allocates on, is
/// detached and exits as usual.
#[test]
fn breakpoints_left_by_both_halves_killed_at_once_are_taken_out_by_the_next_attach() {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    let mut p = Running::start(plain(&f.bin));
    let (mut attacher, tracer) = attach_waiting(&p);
    let command = attacher.id() as i32;
    // SAFETY: signals to our own child and to its child.
    unsafe {
        libc::kill(command, libc::SIGSTOP);
        libc::kill(tracer, libc::SIGKILL);
    }
    untraced(p.pid);
    // SAFETY: as above.
    unsafe { libc::kill(command, libc::SIGKILL) };
    attacher.wait().expect("wait for mem-trace");
    let left = allocator_entries(p.pid)
        .iter()
        .filter(|&&(theirs, _)| theirs == 0xcc)
        .count();
    assert_eq!(left, 2, "no int3 left behind to take out");

    let out = attach(&f, p.pid, "after-both-killed");
    let pid = p.pid;
    for name in ["malloc", "free"] {
        let line = format!(
            "mem-trace: process {pid} had an int3 at the entry of {name}, left by an attach \
             killed with its parent: taken out, the byte of libc's file put back"
        );
        assert!(out.stderr.lines().any(|l| l == line), "{}", out.describe());
    }
    assert_eq!(out.stderr.lines().count(), 2, "{}", out.describe());
    no_breakpoint_left(p.pid);
    p.alloc();
    p.send("thread");
    assert_eq!(p.line(), "thread=ok");
    detach(&f, p.pid, "after-both-killed-detach");
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

#[test]
fn an_idle_program_blocked_in_read_is_attached_promptly_and_runs_on() {
    // The interrupted read was restarted by the kernel, or returned EINTR, which the
    // program retries: either way it read on.
    idle_attach(None, "read", &["read: EINTR, retried"]);
}

/// An event loop idle in `epoll_wait`: attached through the thread blocked there, and the
/// interrupted call is restarted or seen as EINTR, which the program retries.
#[test]
fn an_idle_program_blocked_in_epoll_wait_is_attached_promptly_and_runs_on() {
    idle_attach(
        Some("epoll"),
        "epoll_wait",
        &["epoll_wait: EINTR, retried", "read: EINTR, retried"],
    );
}

/// The idle fixture (given `mode`, if any) attached while blocked in `call`, within 3 s:
/// `mem-trace why` names the site of a block allocated after the attach; detached, the
/// program ends as a plain run does, its stderr holding only lines of `retried`.
fn idle_attach(mode: Option<&str>, call: &str, retried: &[&str]) {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    let mut cmd = plain(&f.bin);
    cmd.args(mode);
    let mut p = Running::start(cmd);
    std::thread::sleep(Duration::from_millis(100));
    let label = mode.unwrap_or("idle");
    let a = attach(&f, p.pid, &format!("{label}-attach"));
    assert!(
        a.stdout.contains(&format!("blocked in {call}")),
        "{}",
        a.describe()
    );
    assert!(a.elapsed < Duration::from_secs(3), "took {:?}", a.elapsed);
    let after = p.alloc();
    let why = mem_trace(
        &f,
        &format!("{label}-why"),
        &["why", &p.pid.to_string(), &format!("{after:#x}")],
    );
    let site = site_at(&f, "idle_site", "idle-site");
    assert!(
        why.stdout.contains(&site),
        "no {site:?} in\n{}",
        why.describe()
    );
    detach(&f, p.pid, &format!("{label}-detach"));
    p.alloc();
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
    assert!(err.lines().all(|l| retried.contains(&l)), "{err}");
}

/// The tracer of `pid` (0: none), from /proc/PID/status.
fn tracer_of(pid: u32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn ctrl_c_while_waiting_for_a_safe_point_leaves_no_breakpoint_behind() {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    let mut p = Running::start(plain(&f.bin));
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["attach", &p.pid.to_string()])
        .env("MEM_TRACE_LIB", library())
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut attacher = cmd.spawn().expect("start mem-trace attach");
    // Once the target is traced, the command is waiting for a thread at malloc's entry, with
    // int3 there: an idle target never comes, so the wait lasts 200 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tracer_of(p.pid) == 0 {
        assert!(Instant::now() < deadline, "the target was never traced");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(attacher.id() as i32, libc::SIGINT) };
    let status = attacher.wait().expect("wait for mem-trace");
    let mut err = String::new();
    std::io::Read::read_to_string(attacher.stderr.as_mut().unwrap(), &mut err).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status}: {err}");
    assert_eq!(tracer_of(p.pid), 0, "left traced");
    // It allocates: a breakpoint left in malloc would kill it with SIGTRAP.
    p.alloc();
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

#[test]
fn a_library_dlopened_after_the_attach_through_origin_runpath_is_found_and_traced() {
    let _turn = one_at_a_time();
    let f = with_entry_script(idle_fixture());
    let plugin = c_shared_library("attach_plugin.c");
    let dir = f.bin.parent().unwrap().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&plugin.bin, dir.join("libattach_plugin.so")).unwrap();
    let mut p = Running::start(plain(&f.bin));
    attach(&f, p.pid, "attach-plugin");
    // The bare name is found through the program's RUNPATH, as without the tracer: a dlopen
    // hook that called glibc's itself would search the tracer's path instead.
    p.send("plugin");
    let line = p.line();
    let addr = line
        .strip_prefix("plugin=0x")
        .unwrap_or_else(|| panic!("the plugin did not load: {line}"));
    let addr = u64::from_str_radix(addr, 16).unwrap();
    // Its allocation was recorded: its GOT was patched after the load.
    let why = gdb_why(&f, p.pid, addr + 100);
    let site = site_at(&plugin, "plugin_site", "plugin-site");
    assert!(why.contains("2929"), "{why}");
    assert!(why.contains(&site), "no {site:?} in\n{why}");
    // A name with $ORIGIN is the caller's directory too, not the tracer's.
    p.send("plugin-origin");
    let line = p.line();
    assert!(line.starts_with("plugin=0x"), "{line}");
    detach(&f, p.pid, "detach-plugin");
    // Loaded again by name (already there): the same library, still working.
    p.send("plugin");
    assert!(p.line().starts_with("plugin=0x"));
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

#[test]
fn fork_after_the_attach_with_allocating_atfork_handlers_runs_parent_and_child_normally() {
    let _turn = one_at_a_time();
    let f = with_entry_script(idle_fixture());
    let mut p = Running::start(plain(&f.bin));
    attach(&f, p.pid, "attach-fork");
    for _ in 0..3 {
        p.send("fork");
        assert_eq!(p.line(), "child=ok");
        assert_eq!(p.line(), "child_status=0");
    }
    // The parent still allocates through the tracer, which names the site.
    let after = p.alloc();
    let why = gdb_why(&f, p.pid, after + 10);
    let site = site_at(&f, "idle_site", "idle-site");
    assert!(why.contains("3131"), "{why}");
    assert!(why.contains(&site), "no {site:?} in\n{why}");
    detach(&f, p.pid, "detach-fork");
    p.send("fork");
    assert_eq!(p.line(), "child=ok");
    assert_eq!(p.line(), "child_status=0");
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert!(err.is_empty(), "{err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

/// `call mem_trace::print_trace(ADDR)` in `pid` through gdb (its answer goes to the
/// process's stderr).
fn gdb_print_trace(fixture: &Fixture, pid: u32, addr: u64) {
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-p", &pid.to_string()])
        .args(["-ex", "set debuginfod enabled off"])
        .args(["-ex", &format!("call mem_trace::print_trace({addr:#x})")])
        .current_dir(&fixture.dir)
        // gdb 13 cannot finish an inferior call on this CPU without it (tests/common).
        .env("LD_PRELOAD", &c_shared_library("gdb_xstate.c").bin);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join("attach-print-trace.gdb-output"),
        true,
        None,
        GDB_TIMEOUT,
        "gdb",
    );
    assert!(out.success(), "{}", out.describe());
}

/// The event number in an answer's "attached to this process at event #N".
fn attached_event(text: &str) -> u64 {
    let at = text
        .find("attached to this process at event #")
        .unwrap_or_else(|| panic!("no attach event in\n{text}"));
    let digits: String = text[at + "attached to this process at event #".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[test]
fn an_address_from_before_the_attach_is_answered_with_the_attach_event() {
    let _turn = one_at_a_time();
    let f = with_entry_script(idle_fixture());
    let mut p = Running::start(plain(&f.bin));
    let before = p.alloc();
    attach(&f, p.pid, "attach-event");
    let after = p.alloc();
    // gdb: the block from before is unknown, and the answer says since when.
    let why = gdb_why(&f, p.pid, before + 8);
    assert!(
        why.contains(&format!(
            "{:#x} is not inside any block tracked by mem-trace",
            before + 8
        )),
        "{why}"
    );
    let first = attached_event(&why);
    // And print_trace, called in the process.
    gdb_print_trace(&f, p.pid, before + 8);
    // The command says the same.
    let pid = p.pid.to_string();
    let cmd = mem_trace(
        &f,
        "why-before",
        &["why", &pid, &format!("{:#x}", before + 8)],
    );
    assert!(cmd.success(), "{}", cmd.describe());
    assert_eq!(attached_event(&cmd.stdout), first, "{}", cmd.describe());
    // The block allocated after is known, with a sequence number past the attach's.
    let known = gdb_why(&f, p.pid, after + 8);
    let seq: u64 = known
        .split("(#")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no sequence number in\n{known}"));
    assert!(
        seq >= first,
        "#{seq} allocated after the attach at #{first}\n{known}"
    );
    // A second attach moves the event on.
    detach(&f, p.pid, "detach-event");
    p.alloc();
    attach(&f, p.pid, "attach-event-2");
    let cmd = mem_trace(
        &f,
        "why-before-2",
        &["why", &pid, &format!("{:#x}", before + 8)],
    );
    assert!(attached_event(&cmd.stdout) > seq, "{}", cmd.describe());
    detach(&f, p.pid, "detach-event-2");
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
    assert!(
        err.contains(&format!(
            "mem-trace: {:#x} is not inside any block tracked by mem-trace",
            before + 8
        )),
        "{err}"
    );
    assert_eq!(attached_event(&err), first, "{err}");
}

/// The mappings' permissions of `pid`, in order.
fn permissions(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains('/'))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn a_full_relro_bind_now_rust_program_is_patched_and_its_pages_stay_read_only() {
    let _turn = one_at_a_time();
    let f = rust_fixture("attach_rust.rs");
    let mut p = Running::start(plain(&f.bin));
    let before = permissions(p.pid);
    // Each mapping there before the attach keeps its range and permissions (RELRO pages made
    // writable for the patch are read-only again); the library and its dependencies come new.
    let kept = |pid| -> Vec<String> {
        let now = permissions(pid);
        before.iter().filter(|m| now.contains(m)).cloned().collect()
    };
    let a = attach(&f, p.pid, "rust-attach");
    assert_eq!(kept(p.pid), before, "{}", a.describe());
    let after = p.alloc();
    let why = mem_trace(
        &f,
        "rust-why",
        &["why", &p.pid.to_string(), &format!("{after:#x}")],
    );
    assert!(why.stdout.contains("rust_site"), "{}", why.describe());
    detach(&f, p.pid, "rust-detach");
    assert_eq!(kept(p.pid), before);
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"));
}

/// `mem-trace attach PID` refused with one line containing `says`; the target unharmed.
fn refused(f: &Fixture, pid: u32, label: &str, says: &str) {
    let out = mem_trace(f, label, &["attach", &pid.to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    assert!(
        out.stderr.contains(says),
        "no {says:?} in\n{}",
        out.describe()
    );
}

#[test]
fn refusals_are_one_line_and_leave_the_target_running() {
    let _turn = one_at_a_time();
    let f = idle_fixture();

    // Stopped (as by Ctrl-Z): refused, and left stopped. SIGSTOP rather than SIGTSTP: the
    // kernel discards SIGTSTP sent to an orphaned process group, which the test's is when
    // the suite runs in the background of a shell that has exited (seen: "not stopped").
    let mut p = Running::start(plain(&f.bin));
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(p.pid as i32, libc::SIGSTOP) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.state() != 'T' {
        assert!(Instant::now() < deadline, "not stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    refused(&f, p.pid, "stopped", "is stopped (state T");
    assert_eq!(p.state(), 'T', "the refusal resumed it");
    // SAFETY: as above.
    unsafe { libc::kill(p.pid as i32, libc::SIGCONT) };

    // Already attached, then detached twice.
    attach(&f, p.pid, "first");
    refused(
        &f,
        p.pid,
        "twice",
        "mem-trace attach loaded the tracer into it earlier",
    );
    detach(&f, p.pid, "detach");
    let again = mem_trace(&f, "detach-again", &["detach", &p.pid.to_string()]);
    assert_eq!(again.status.code(), Some(1), "{}", again.describe());
    assert!(
        again.stderr.contains("is not attached"),
        "{}",
        again.describe()
    );
    p.alloc();
    let (out, err, status) = p.finish(None);
    assert!(
        status.success() && out.last().map(String::as_str) == Some("bye"),
        "{status} {out:?} {err}"
    );

    // Preloaded.
    let mut cmd = plain(&f.bin);
    cmd.env("LD_PRELOAD", library())
        .env("MEM_TRACE_PROFILE", "0");
    let mut p = Running::start(cmd);
    refused(
        &f,
        p.pid,
        "preloaded",
        "libmem_trace.so was preloaded into it",
    );
    p.alloc();
    let (_, _, status) = p.finish(None);
    assert!(status.success());

    // Two libraries defining malloc: which serves the blocks cannot be told from outside.
    // (One alone, jemalloc's say, is attached to: tests/other_allocators.rs.)
    let fake = c_shared_library("fake_malloc.c");
    let mut cmd = plain(&f.bin);
    cmd.env(
        "LD_PRELOAD",
        format!(
            "{}:/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
            fake.bin.display()
        ),
    );
    let mut p = Running::start(cmd);
    refused(&f, p.pid, "fake-malloc", "two libraries defining malloc");
    p.alloc();
    assert!(p.finish(None).2.success());

    // A static binary.
    let s = c_fixture("attach_static.c", &["-static"]);
    let p = Running::start(plain(&s.bin));
    refused(&s, p.pid, "static", "a statically linked program");
    assert!(p.finish(None).2.success());

    // Strict seccomp: no system call but read, write and exit could run the tracer.
    let mut cmd = plain(&f.bin);
    cmd.arg("seccomp");
    let p = Running::start(cmd);
    refused(
        &f,
        p.pid,
        "seccomp",
        "runs under strict seccomp (Seccomp: 1)",
    );
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.last().map(String::as_str), Some("bye"), "{out:?}");

    // Another mount namespace (root may make one; `unshare` and `sh -c exec` exec the program
    // in their own process, so the pid is the program's). Where the library's path names the
    // same file there, it is attached to; where a tmpfs hides the library's directory, refused.
    let can = Command::new("unshare").args(["--mount", "true"]).status();
    assert!(
        can.as_ref().is_ok_and(|s| s.success()),
        "`unshare --mount true`: {can:?}: this test runs as root with CAP_SYS_ADMIN"
    );
    let in_namespace = |hide: Option<&std::path::Path>| {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(match hide {
                Some(dir) => format!("mount -t tmpfs none '{}' && exec \"$0\"", dir.display()),
                None => "exec \"$0\"".to_string(),
            })
            .arg(&f.bin)
            .env_remove("LD_PRELOAD");
        Running::start(cmd)
    };
    let mut p = in_namespace(None);
    attach(&f, p.pid, "mount-ns-same-library");
    p.alloc();
    detach(&f, p.pid, "mount-ns-detach");
    assert!(p.finish(None).2.success());
    let lib = library();
    let mut p = in_namespace(lib.parent());
    refused(
        &f,
        p.pid,
        "mount-ns-hidden",
        "runs in another mount namespace",
    );
    p.alloc();
    assert!(p.finish(None).2.success());
}

/// `bin ARGS` as user and group 65534 (nobody), started without the tracer.
fn as_nobody(bin: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin)
        .args(args)
        .env_remove("LD_PRELOAD");
    cmd
}

#[test]
fn another_users_process_is_attached_by_root_unless_it_is_not_dumpable() {
    let _turn = one_at_a_time();
    let f = idle_fixture();
    // Root may attach to another user's process, as a debugger may.
    let mut p = Running::start(as_nobody(&f.bin, &[]));
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap();
    assert!(status.contains("Uid:\t65534"), "{status}");
    attach(&f, p.pid, "nobody");
    let after = p.alloc();
    let why = mem_trace(
        &f,
        "nobody-why",
        &["why", &p.pid.to_string(), &format!("{after:#x}")],
    );
    assert!(why.stdout.contains("idle_site"), "{}", why.describe());
    detach(&f, p.pid, "nobody-detach");
    assert!(p.finish(None).2.success());

    // One that asked not to be inspected is refused, and runs on.
    let mut p = Running::start(as_nobody(&f.bin, &["undumpable"]));
    refused(&f, p.pid, "undumpable", "is not dumpable");
    assert_eq!(tracer_of(p.pid), 0);
    p.alloc();
    assert!(p.finish(None).2.success());
}

#[test]
fn the_command_line_refuses_a_pid_that_is_not_there() {
    let f = idle_fixture();
    let out = mem_trace(&f, "nopid", &["attach", "999999999"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("no process 999999999"),
        "{}",
        out.describe()
    );
}

fn locked_fixture() -> Fixture {
    c_fixture("attach_locked.c", &["-pthread"])
}

/// Waits until the main thread of `pid` is blocked in `write(2, ...)`: inside
/// `malloc_stats`, the main arena's mutex held, once it said "stats: stderr full".
fn blocked_writing_stderr(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let syscall =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).unwrap_or_default();
        if syscall.starts_with("1 0x2 ") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not blocked writing to stderr: {syscall}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the rest of the program's stderr on a thread: its text at the end.
fn drain_stderr(p: &mut Running) -> std::thread::JoinHandle<String> {
    let mut stderr = p.child.stderr.take().expect("piped stderr");
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Whether the tracer's library is mapped in `pid`.
fn library_mapped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libmem_trace")
}

/// Where libc.so.6's first mapping starts in `maps`.
fn libc_base(maps: &str) -> u64 {
    maps.lines()
        .find(|l| l.ends_with("/libc.so.6") && l.split_whitespace().nth(2) == Some("00000000"))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .expect("libc.so.6 mapped")
}

/// The first bytes of libc's `malloc` and `free` in `pid`, with this process's (the same
/// file, never patched here): equal unless an `int3` was left there.
fn allocator_entries(pid: u32) -> Vec<(u8, u8)> {
    use std::os::unix::fs::FileExt;
    let own_base = libc_base(&std::fs::read_to_string("/proc/self/maps").unwrap());
    let base = libc_base(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap());
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    [c"malloc", c"free"]
        .iter()
        .map(|name| {
            // SAFETY: dlsym with a NUL-terminated name.
            let own = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
            // SAFETY: the first byte of a function of libc's, mapped.
            let own_byte = unsafe { *(own as *const u8) };
            let mut b = [0u8];
            mem.read_exact_at(&mut b, own - own_base + base).unwrap();
            (b[0], own_byte)
        })
        .collect()
}

/// No `int3` left at libc's `malloc` or `free` in `pid`.
fn no_breakpoint_left(pid: u32) {
    for (theirs, ours) in allocator_entries(pid) {
        assert_ne!(
            theirs, 0xcc,
            "an int3 was left in process {pid}'s allocator"
        );
        assert_eq!(theirs, ours, "process {pid}'s allocator code changed");
    }
}

/// The locked fixture (given `mode`, if any) through "stats": `blocked` runs while
/// malloc_stats is blocked on the full stderr, then stderr is drained and `after` runs once
/// malloc_stats has returned; then the end: stdout and status.
fn locked_run<T>(
    f: &Fixture,
    mode: Option<&str>,
    blocked: impl FnOnce(&mut Running) -> T,
    after: impl FnOnce(&mut Running, T),
) -> (Vec<String>, std::process::ExitStatus) {
    let mut cmd = plain(&f.bin);
    cmd.args(mode);
    let mut p = Running::start(cmd);
    p.send("stats");
    assert_eq!(p.line(), "stats: stderr full");
    blocked_writing_stderr(p.pid);
    let state = blocked(&mut p);
    let stderr = drain_stderr(&mut p);
    assert_eq!(p.line(), "stats: done");
    after(&mut p, state);
    let (out, _, status) = p.finish(None);
    let err = stderr.join().unwrap();
    assert!(
        err.contains("Arena 0:\n") && err.contains("Total (incl. mmap):\n"),
        "malloc_stats did not finish: {}",
        err.trim_start_matches('.')
    );
    (out, status)
}

/// The fixture's modes: the thread the attach chooses has its own arena, or allocates from
/// the main arena, whose mutex malloc_stats holds (its dlopen would wait for it).
const LOCKED_MODES: [Option<&str>; 2] = [None, Some("one-arena")];

/// [`locked_run`] in each of [`LOCKED_MODES`] (labelled), checked against the same run
/// without `blocked` and `after` (one allocation after the lock, as they make): the program
/// prints the same and exits successfully. Returns each mode's output.
fn locked_like_plain<T>(
    f: &Fixture,
    blocked: impl Fn(&mut Running, &str) -> T,
    after: impl Fn(&mut Running, T, &str),
) -> Vec<Vec<String>> {
    LOCKED_MODES
        .iter()
        .map(|&mode| {
            let label = mode.unwrap_or("arenas");
            let (plain_out, plain_status) = locked_run(
                f,
                mode,
                |_| {},
                |p, ()| {
                    p.alloc();
                },
            );
            assert!(plain_status.success(), "{plain_status}");
            let (out, status) =
                locked_run(f, mode, |p| blocked(p, label), |p, t| after(p, t, label));
            assert!(status.success(), "{label}: {status}");
            assert_eq!(masked(&out), masked(&plain_out), "{label}");
            out
        })
        .collect()
}

/// `mem-trace attach PID` started with a minute to wait for the allocator's lock, and the
/// first line it wrote to stderr (that it waits): the command, its stderr, that line.
fn waiting_attacher(pid: u32) -> (Child, BufReader<ChildStderr>, String) {
    waiting_attacher_with(pid, &[])
}

/// [`waiting_attacher`] with variables set.
fn waiting_attacher_with(
    pid: u32,
    vars: &[(&str, &str)],
) -> (Child, BufReader<ChildStderr>, String) {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["attach", &pid.to_string()])
        .envs(vars.iter().copied())
        .env("MEM_TRACE_LIB", library())
        .env("MEM_TRACE_ATTACH_LOCK_WAIT_MS", "60000")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut attacher = cmd.spawn().expect("start mem-trace attach");
    let mut err = BufReader::new(attacher.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    (attacher, err, line)
}

/// Half a second of a [`waiting_attacher`] still waiting on `pid`, the tracer not loaded
/// meanwhile: whatever holds the lock holds it still.
fn keeps_waiting(pid: u32, attacher: &mut Child, label: &str) {
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !library_mapped(pid),
            "{label}: loaded while the lock was held"
        );
        assert!(attacher.try_wait().unwrap().is_none(), "{label}: gave up");
    }
}

/// A [`waiting_attacher`] on `p`, once the lock it waited for is free: it attached, said so
/// and nothing else; a block `p` allocates after is named by `mem-trace top` at `f`'s
/// `main-site`; then detached. Its line.
fn attach_completed(
    f: &Fixture,
    p: &mut Running,
    (mut attacher, mut err): (Child, BufReader<ChildStderr>),
    label: &str,
) -> String {
    let status = attacher.wait().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(attacher.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{label}: {status}: {stdout}{rest}");
    assert!(
        stdout.starts_with(&format!("mem-trace: attached to process {} (", p.pid)),
        "{stdout}"
    );
    assert!(rest.is_empty(), "{rest}");
    p.alloc();
    let top = mem_trace(f, &format!("{label}-top"), &["top", &p.pid.to_string()]);
    let site = site_at(f, "main_site", "main-site");
    assert!(
        top.stdout.contains(&site),
        "{label}: no {site:?} in\n{}",
        top.describe()
    );
    detach(f, p.pid, &format!("{label}-detach"));
    stdout
}

/// `mem-trace attach PID` with a 1 s wait for a lock `pid` keeps held: refused within 10 s,
/// with two lines on stderr (the wait, the refusal), returned; the process left untraced,
/// with no breakpoint and nothing loaded.
fn refused_after_waiting(f: &Fixture, pid: u32, label: &str) -> Vec<String> {
    let vars = [("MEM_TRACE_ATTACH_LOCK_WAIT_MS", "1000")];
    let out = mem_trace_env(f, label, &["attach", &pid.to_string()], &vars);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    let lines: Vec<String> = out.stderr.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{}", out.describe());
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    assert_eq!(tracer_of(pid), 0, "{label}: left traced");
    no_breakpoint_left(pid);
    assert!(!library_mapped(pid));
    lines
}

/// `line` says that thread `pid` is inside malloc_stats, in a write function, and then `rest`.
fn names_malloc_stats(line: &str, head: &str, rest: &str) {
    // glibc 2.36's malloc_stats writes with cancellation off: __write_nocancel.
    let (who, after) = line.split_once(" (in ").unwrap_or_else(|| panic!("{line}"));
    assert_eq!(who, head, "{line}");
    assert!(
        after
            .split_once(')')
            .is_some_and(|(f, after)| f.contains("write") && after.starts_with(rest)),
        "{line}"
    );
}

/// A thread inside `malloc_stats`, blocked writing to a full stderr with the main arena's
/// mutex held, for as long as the test keeps the pipe full: the attach loads nothing while
/// it waits (the library is not mapped), says whom it waits for, and completes once the
/// test reads the pipe; a block allocated after is named by `mem-trace top`, and the program
/// prints and exits as without the attach. Both modes of the fixture.
#[test]
fn a_thread_held_inside_malloc_stats_is_waited_for_and_the_attach_completes_after() {
    let _turn = one_at_a_time();
    let f = locked_fixture();
    let waiting = |p: &mut Running, label: &str| {
        let (mut attacher, err, line) = waiting_attacher(p.pid);
        names_malloc_stats(
            &line,
            &format!("mem-trace: thread {} is inside malloc_stats", p.pid),
            ", holding a lock of glibc's allocator that loading the tracer needs: waiting \
             up to 60 s",
        );
        // Held there as long as the pipe stays full: nothing is loaded meanwhile.
        keeps_waiting(p.pid, &mut attacher, label);
        blocked_writing_stderr(p.pid);
        (attacher, err)
    };
    let attached = |p: &mut Running, attacher, label: &str| {
        attach_completed(&f, p, attacher, label);
    };
    for out in locked_like_plain(&f, waiting, attached) {
        assert_eq!(out[out.len() - 2..], ["worker=ok", "bye"], "{out:?}");
    }
}

/// The same thread held inside malloc_stats past the attach's wait: refused with one line
/// naming it and where it is, the process let go untouched (no breakpoint left in its
/// allocator, nothing loaded, still blocked where it was); once the pipe is read it goes
/// on, and can be attached to then (the mutex the abandoned wait was queued on works).
#[test]
fn a_thread_held_inside_malloc_stats_past_the_wait_is_refused_and_left_untouched() {
    let _turn = one_at_a_time();
    let f = locked_fixture();
    let refused = |p: &mut Running, label: &str| {
        let lines = refused_after_waiting(&f, p.pid, &format!("{label}-refused"));
        assert!(lines[0].contains("waiting up to 1 s"), "{lines:?}");
        let pid = p.pid;
        names_malloc_stats(
            &lines[1],
            &format!("mem-trace: process {pid}: thread {pid} stayed inside malloc_stats"),
            " for 1 s, holding a lock of glibc's allocator that loading the tracer needs: \
             nothing was loaded and the process runs on as it was",
        );
        // Still where it was, the mutex held.
        blocked_writing_stderr(p.pid);
    };
    let attached_later = |p: &mut Running, (), label: &str| {
        attach(&f, p.pid, &format!("{label}-later"));
        p.alloc();
        detach(&f, p.pid, &format!("{label}-later-detach"));
    };
    for out in locked_like_plain(&f, refused, attached_later) {
        assert_eq!(out[out.len() - 2..], ["worker=ok", "bye"], "{out:?}");
    }
}

/// Ctrl-C while the attach waits for the thread inside malloc_stats: the command ends by its
/// SIGINT, the process is let go untouched, and runs on as without the attach.
#[test]
fn ctrl_c_while_waiting_for_the_allocators_lock_leaves_the_process_untouched() {
    let _turn = one_at_a_time();
    let f = locked_fixture();
    let interrupted = |p: &mut Running, label: &str| {
        let (mut attacher, mut err, line) = waiting_attacher(p.pid);
        assert!(line.contains("waiting up to 60 s"), "{label}: {line}");
        // SAFETY: kill with a pid of our own child.
        unsafe { libc::kill(attacher.id() as i32, libc::SIGINT) };
        let status = attacher.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGINT),
            "{label}: {status}: {rest}"
        );
        untraced(p.pid);
        no_breakpoint_left(p.pid);
        assert!(!library_mapped(p.pid));
        blocked_writing_stderr(p.pid);
    };
    locked_like_plain(&f, interrupted, |p, (), _| {
        p.alloc();
    });
}

/// A process of root's that made itself non-dumpable, attached to by root (whom the kernel
/// lets trace it, and whose /proc files it owns anyway): the process itself is asked, and
/// the attach refused with one line; it runs on as it would have, nothing left in it.
#[test]
fn a_root_process_that_made_itself_undumpable_is_refused_and_runs_on() {
    let _turn = one_at_a_time();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root");
    let f = idle_fixture();
    let mut unattached = Running::start(plain(&f.bin));
    unattached.alloc();
    let (plain_out, _, plain_status) = unattached.finish(None);
    assert!(plain_status.success());

    let mut cmd = plain(&f.bin);
    cmd.arg("undumpable");
    let mut p = Running::start(cmd);
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap();
    assert!(status.contains("Uid:\t0\t0\t0\t0"), "{status}");
    refused(&f, p.pid, "root-undumpable", "is not dumpable");
    assert_eq!(tracer_of(p.pid), 0, "left traced");
    no_breakpoint_left(p.pid);
    assert!(!library_mapped(p.pid));
    p.alloc();
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(masked(&out), masked(&plain_out));
    // Its read, interrupted for the question, was restarted or retried.
    assert!(err.lines().all(|l| l == "read: EINTR, retried"), "{err}");
}

/// The loader fixture and the library it loads, whose constructor blocks.
fn loader_fixture() -> (Fixture, Fixture) {
    (
        c_fixture("attach_loader.c", &["-pthread"]),
        c_shared_library("attach_loader_lib.c"),
    )
}

/// Waits until the main thread of `pid` is blocked in `read(0, ...)`: in the library's
/// constructor, inside `dlopen` with the loader's lock held, once it said "ctor: waiting"
/// (or in the callback of `dl_iterate_phdr`, once it said "phdr: waiting").
fn blocked_reading_stdin(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let syscall =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).unwrap_or_default();
        if syscall.starts_with("0 0x0 ") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not blocked reading stdin: {syscall}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How the loader fixture holds a lock of the loader: the command, the line it prints once
/// blocked, the lines after it is given its line.
type Hold = (&'static str, &'static str, &'static [&'static str]);

/// Inside `dlopen`, in a constructor: `dl_load_lock` held.
const IN_DLOPEN: Hold = ("load", "ctor: waiting", &["ctor: done", "loaded"]);
/// Inside `dl_iterate_phdr`, in its callback: `dl_load_write_lock` held.
const IN_PHDR: Hold = ("phdr", "phdr: waiting", &["phdr: done"]);

/// The loader fixture through `hold`: `blocked` runs while it is blocked, then it is given
/// its line and `after` runs once it has returned; then the end: stdout, with the program's
/// success checked.
fn loader_run<T>(
    (f, lib): &(Fixture, Fixture),
    args: &[&str],
    (command, waiting, done): Hold,
    blocked: impl FnOnce(&mut Running) -> T,
    after: impl FnOnce(&mut Running, T),
) -> Vec<String> {
    let mut cmd = plain(&f.bin);
    cmd.arg(&lib.bin).args(args);
    let mut p = Running::start(cmd);
    p.send(command);
    assert_eq!(p.line(), waiting);
    // "busy": the constructor allocates until stdin has a line.
    let reading = !args.contains(&"busy");
    if reading {
        blocked_reading_stdin(p.pid);
    }
    let state = blocked(&mut p);
    // Still there, the lock held, whatever `blocked` did.
    if reading {
        blocked_reading_stdin(p.pid);
    }
    p.send("go");
    for &line in done {
        assert_eq!(p.line(), line);
    }
    after(&mut p, state);
    let (out, err, status) = p.finish(None);
    assert!(status.success(), "{status}: {err}");
    assert!(err.is_empty(), "{err}");
    out
}

/// [`loader_run`] checked against the same run without `blocked` and `after` (one
/// allocation after the load, as they make): the program prints the same.
fn loader_like_plain<T>(
    f: &(Fixture, Fixture),
    hold: Hold,
    blocked: impl FnOnce(&mut Running) -> T,
    after: impl FnOnce(&mut Running, T),
) {
    loader_like_plain_with(f, &[], hold, blocked, after);
}

/// [`loader_like_plain`] with the fixture's `args` ("alone": single-threaded).
fn loader_like_plain_with<T>(
    f: &(Fixture, Fixture),
    args: &[&str],
    hold: Hold,
    blocked: impl FnOnce(&mut Running) -> T,
    after: impl FnOnce(&mut Running, T),
) {
    let plain_out = loader_run(
        f,
        args,
        hold,
        |_| {},
        |p, ()| {
            p.alloc();
        },
    );
    let out = loader_run(f, args, hold, blocked, after);
    assert_eq!(masked(&out), masked(&plain_out));
    let worker = if args.contains(&"alone") || args.contains(&"busy") {
        "worker=none"
    } else {
        "worker=ok"
    };
    assert_eq!(out[out.len() - 2..], [worker, "bye"], "{out:?}");
}

/// A thread inside `dlopen`, its library's constructor blocked reading stdin with the
/// loader's lock held, for as long as the test sends nothing: the attach loads nothing while
/// it waits (the library is not mapped), says whom it waits for, and completes once the
/// constructor has its line; a block allocated after is named by `mem-trace top`, and the
/// program prints and exits as without the attach.
#[test]
fn a_thread_held_inside_dlopen_is_waited_for_and_the_attach_completes_after() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let waiting = |p: &mut Running| {
        let (mut attacher, err, line) = waiting_attacher(p.pid);
        assert_eq!(line.trim_end(), holding_the_lock(p.pid));
        // Held there as long as the constructor reads nothing: nothing is loaded meanwhile.
        keeps_waiting(p.pid, &mut attacher, "loader");
        (attacher, err)
    };
    let attached = |p: &mut Running, attacher| {
        attach_completed(&f.0, p, attacher, "loader");
    };
    loader_like_plain(&f, IN_DLOPEN, waiting, attached);
}

/// The same thread held inside dlopen past the attach's wait: refused with one line naming
/// it and where it is, the process let go untouched (no breakpoint left in its allocator,
/// nothing loaded, still blocked where it was); once the constructor has its line, the
/// program goes on, and can be attached to then (the lock the abandoned wait was queued on
/// works).
#[test]
fn a_thread_held_inside_dlopen_past_the_wait_is_refused_and_left_untouched() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let refused = |p: &mut Running| {
        let lines = refused_after_waiting(&f.0, p.pid, "loader-refused");
        let pid = p.pid;
        assert!(
            lines[0].contains("inside dlopen (in read), holding the loader's lock")
                && lines[0].contains("waiting up to 1 s"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(&format!(
                "mem-trace: process {pid}: thread {pid} stayed inside dlopen (in read) for 1 \
                 s, holding the loader's lock that loading the tracer needs: nothing was \
                 loaded and the process runs on as it was"
            )),
            "{lines:?}"
        );
    };
    let attached_later = |p: &mut Running, ()| {
        attach(&f.0, p.pid, "loader-later");
        p.alloc();
        detach(&f.0, p.pid, "loader-later-detach");
    };
    loader_like_plain(&f, IN_DLOPEN, refused, attached_later);
}

/// A thread inside a `dl_iterate_phdr` callback, blocked reading stdin with the loader's list
/// lock held (which `dlopen` takes with the loader's lock held, and `dladdr` does not):
/// waited for the same way, nothing loaded meanwhile, and the attach completes once the
/// callback has its line; the program prints and exits as without the attach.
#[test]
fn a_thread_held_inside_dl_iterate_phdr_is_waited_for_and_the_attach_completes_after() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let waiting = |p: &mut Running| {
        let (mut attacher, err, line) = waiting_attacher(p.pid);
        assert_eq!(
            line.trim_end(),
            format!(
                "mem-trace: thread {} is inside dl_iterate_phdr (in read), holding the \
                 loader's list lock that loading the tracer needs: waiting up to 60 s for it \
                 to leave",
                p.pid
            )
        );
        keeps_waiting(p.pid, &mut attacher, "phdr");
        (attacher, err)
    };
    let attached = |p: &mut Running, (mut attacher, mut err): (Child, BufReader<_>)| {
        let status = attacher.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        assert!(status.success(), "{status}: {rest}");
        assert!(rest.is_empty(), "{rest}");
        assert!(library_mapped(p.pid));
        p.alloc();
        detach(&f.0, p.pid, "phdr-detach");
    };
    loader_like_plain(&f, IN_PHDR, waiting, attached);
}

/// The only thread inside `dlopen`, its library's constructor blocked reading stdin with the
/// loader's lock held: the safe point's probes pass on it (the lock is recursive, and its
/// own), but the tracer's `dlopen` would nest inside the constructor. The attach says so,
/// loads nothing while it waits, and completes once the constructor has its line and has
/// returned; the program prints and exits as without the attach.
#[test]
fn a_single_thread_inside_a_constructor_is_waited_for_and_the_attach_completes_after() {
    waited_for_inside_a_constructor("alone", |pid, line| {
        assert_eq!(line, alone_inside(pid, "dlopen", "lock"));
    });
}

/// The fixture in `mode`, its only thread inside the constructor (see
/// [`waited_for_inside`]).
fn waited_for_inside_a_constructor(mode: &str, check: impl Fn(u32, &str)) {
    waited_for_inside((mode, mode), IN_DLOPEN, check);
}

/// The fixture in mode `mode` (the logs named `label`), its only thread held in the loader
/// as `hold` says: the attach's first line (passed to `check` with the pid) says whom it
/// waits for, nothing is loaded while it waits, and it completes once the thread has left;
/// the program prints and exits as without the attach.
fn waited_for_inside((mode, label): (&str, &str), hold: Hold, check: impl Fn(u32, &str)) {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let waiting = |p: &mut Running| {
        let (mut attacher, err, line) = waiting_attacher(p.pid);
        check(p.pid, line.trim_end());
        keeps_waiting(p.pid, &mut attacher, label);
        (attacher, err)
    };
    let attached = |p: &mut Running, attacher| {
        attach_completed(&f.0, p, attacher, label);
    };
    loader_like_plain_with(&f, &[mode], hold, waiting, attached);
}

/// The only thread inside the constructor, which allocates and sleeps while it waits: it
/// comes to `malloc`'s entry from the library's code, a safe point but for the loader's lock
/// it holds. Waited for the same way, nothing loaded meanwhile, and the attach completes
/// once the constructor has returned.
#[test]
fn a_single_thread_allocating_inside_a_constructor_is_waited_for() {
    waited_for_inside_a_constructor("busy", |pid, line| {
        let (head, tail) = alone_inside(pid, "dlopen", "lock")
            .split_once(" (in read)")
            .map(|(h, t)| (h.to_string(), t.to_string()))
            .unwrap();
        let inner = line
            .strip_prefix(&head)
            .and_then(|rest| rest.strip_suffix(&tail))
            .unwrap_or_else(|| panic!("{line}"));
        assert!(
            [" (in malloc)", " (in free)"].contains(&inner),
            "not stopped at the allocator's entry: {line}"
        );
    });
}

/// Ctrl-C while the attach waits for the only thread to leave the constructor (choosing a
/// safe point again and again, breakpoints in and out of the allocator): the command ends
/// by its SIGINT, the process is let go untouched, and runs on as without the attach.
#[test]
fn ctrl_c_while_waiting_for_a_thread_to_leave_the_loader_leaves_the_process_untouched() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let interrupted = |p: &mut Running| {
        let (mut attacher, mut err, line) = waiting_attacher(p.pid);
        assert_eq!(line.trim_end(), alone_inside(p.pid, "dlopen", "lock"));
        // A few rounds of choosing, so that the signal may come during any of their steps.
        std::thread::sleep(Duration::from_millis(700));
        // SAFETY: kill with a pid of our own child.
        unsafe { libc::kill(attacher.id() as i32, libc::SIGINT) };
        let status = attacher.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGINT), "{status}: {rest}");
        untraced(p.pid);
        no_breakpoint_left(p.pid);
        assert!(!library_mapped(p.pid));
    };
    loader_like_plain_with(&f, &["alone"], IN_DLOPEN, interrupted, |p, ()| {
        p.alloc();
    });
}

/// What the attach says while another thread, `pid`'s main one, holds the loader's lock
/// inside `dlopen`, blocked in `read`.
fn holding_the_lock(pid: u32) -> String {
    format!(
        "mem-trace: thread {pid} is inside dlopen (in read), holding the loader's lock that \
         loading the tracer needs: waiting up to 60 s for it to leave"
    )
}

/// The waiting line for the only thread, `pid`, inside `function` (in read) with the
/// loader's `lock` ("lock", "list lock") held.
fn alone_inside(pid: u32, function: &str, lock: &str) -> String {
    format!(
        "mem-trace: thread {pid} is inside {function} (in read), holding the loader's {lock}, \
         and no other thread is at a safe point: the tracer cannot be loaded from inside the \
         loader; waiting up to 60 s for it to leave"
    )
}

/// The same single thread inside the constructor past the attach's wait: refused with one
/// line naming it and where it is, the process let go untouched (nothing loaded, no
/// breakpoint left, still in the constructor); once the constructor has its line the
/// program goes on, and can be attached to then.
#[test]
fn a_single_thread_inside_a_constructor_past_the_wait_is_refused_and_left_untouched() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let refused = |p: &mut Running| {
        let lines = refused_after_waiting(&f.0, p.pid, "alone-refused");
        let pid = p.pid;
        assert_eq!(
            lines[0],
            alone_inside(pid, "dlopen", "lock").replace("60 s", "1 s")
        );
        assert!(
            lines[1].starts_with(&format!(
                "mem-trace: process {pid}: thread {pid} stayed inside dlopen (in read) for 1 \
                 s, holding the loader's lock, and no other thread came to a safe point: the \
                 tracer cannot be loaded from inside the loader; nothing was loaded and the \
                 process runs on as it was"
            )),
            "{lines:?}"
        );
    };
    let attached_later = |p: &mut Running, ()| {
        attach(&f.0, p.pid, "alone-later");
        p.alloc();
        detach(&f.0, p.pid, "alone-later-detach");
    };
    loader_like_plain_with(&f, &["alone"], IN_DLOPEN, refused, attached_later);
}

/// The only thread inside a `dl_iterate_phdr` callback, blocked reading stdin with the
/// loader's list lock held (which `dlopen` takes again, recursively, to add the tracer to
/// the list the callback walks): waited for, nothing loaded meanwhile, and the attach
/// completes once the callback has returned.
#[test]
fn a_single_thread_inside_a_dl_iterate_phdr_callback_is_waited_for() {
    waited_for_inside(("alone", "alone-phdr"), IN_PHDR, |pid, line| {
        assert_eq!(line, alone_inside(pid, "dl_iterate_phdr", "list lock"));
    });
}

/// Two threads: the main one inside the constructor, blocked reading stdin with the
/// loader's lock held, the worker allocating and sleeping. With no wait at the allocator's
/// entry, the main thread (blocked in `read` of a pipe, first in the list) is found at a
/// safe point first: it is skipped for the worker, whose probe then waits for the loader's
/// lock that the main thread holds (its `dlopen` would wait for it), saying so; nothing is
/// loaded meanwhile, and once the constructor has returned the attach completes on the
/// worker. The program prints and exits as without the attach.
#[test]
fn the_thread_inside_a_constructor_is_skipped_for_another_that_waits_for_the_lock() {
    let _turn = one_at_a_time();
    let f = loader_fixture();
    let waiting = |p: &mut Running| {
        let (mut attacher, mut err, mut line) =
            waiting_attacher_with(p.pid, &[("MEM_TRACE_ATTACH_WAIT_MS", "0")]);
        // The worker, between two sleeps when the threads were stopped, was no safe point:
        // the main thread is waited for until it is.
        if line.trim_end() == alone_inside(p.pid, "dlopen", "lock") {
            line.clear();
            err.read_line(&mut line).unwrap();
        }
        assert_eq!(line.trim_end(), holding_the_lock(p.pid));
        keeps_waiting(p.pid, &mut attacher, "skipped");
        (attacher, err)
    };
    let attached = |p: &mut Running, attacher| {
        let line = attach_completed(&f.0, p, attacher, "skipped");
        let head = format!("mem-trace: attached to process {} (thread ", p.pid);
        let tid = line
            .strip_prefix(&head)
            .and_then(|rest| rest.split_once(' '))
            .map(|(tid, _)| tid.to_string())
            .unwrap_or_else(|| panic!("{line}"));
        assert_ne!(
            tid,
            p.pid.to_string(),
            "attached on the constructor's thread: {line}"
        );
    };
    loader_like_plain(&f, IN_DLOPEN, waiting, attached);
}
