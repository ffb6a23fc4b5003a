//! `mem-trace pprof`: a heap profile that the real `go tool pprof` reads, from a running
//! process and from its core, agreeing with `mem-trace top` on bytes and functions; with its
//! sample types, thread labels and diffs working.
//!
//! The program is `tests/fixtures/pprof_sites.c` under the profiler build: 3 MiB live from
//! `site_live`, 1 MiB allocated and freed by `site_freed`, 2 MiB live from `site_worker` in a
//! thread named "worker", and 512 KiB more from `site_more` each time it is asked.

mod common;

use std::path::Path;
use std::time::Duration;

use common::pprof_sites::{flat, go_pprof, top, Sites};
use common::{c_fixture, gcore, mem_trace_within, Fixture};

/// Runs `cmd` as `common::run_with_timeout` does (stdout and stderr to `log`'s files, stdin
/// from `stdin`), and asserts that it exited 0.
fn succeeded(
    cmd: std::process::Command,
    log: &Path,
    stdin: Option<&Path>,
    timeout: Duration,
    what: &str,
) -> common::Output {
    let out = common::run_with_timeout(cmd, log, false, stdin, timeout, what);
    assert!(out.success(), "{}", out.describe());
    out
}

const MIB: u64 = 1 << 20;

/// `mem-trace pprof TARGET -o FILE`, which must succeed.
fn pprof(fixture: &Fixture, target: &str, file: &Path) {
    let out = mem_trace_within(
        fixture,
        &format!("pprof.{}", file.file_name().unwrap().to_string_lossy()),
        &["pprof", target, "-o", file.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert!(out.success(), "{}", out.describe());
}

/// The total on the `Showing nodes accounting for ..., 100% of NB total` line.
fn total(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let tail = l.split(" of ").nth(1)?;
            tail.strip_suffix("B total")?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no total in:\n{text}"))
}

/// `live: N bytes in ...` of `mem-trace top`.
fn live_bytes(fixture: &Fixture, target: &str) -> u64 {
    let out = mem_trace_within(fixture, "top", &["top", target], Duration::from_secs(120));
    assert!(out.success(), "{}", out.describe());
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("live: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no live line:\n{}", out.stdout))
}

/// `go tool pprof -top` of `file` by bytes, in use (the default sample) and allocated.
fn in_use_and_allocated(fixture: &Fixture, label: &str, file: &str) -> (String, String) {
    let inuse = go_pprof(
        fixture,
        &format!("{label}.inuse"),
        &["-top", "-unit=B", file],
    );
    let alloc = go_pprof(
        fixture,
        &format!("{label}.alloc"),
        &["-top", "-unit=B", "-sample_index=alloc_space", file],
    );
    (inuse, alloc)
}

fn check_sites(fixture: &Fixture, label: &str, profile: &Path, live: u64) {
    let file = profile.to_str().unwrap();
    let (inuse, alloc) = in_use_and_allocated(fixture, label, file);
    assert!(inuse.contains("Type: inuse_space"), "{inuse}");
    assert_eq!(total(&inuse), live, "{inuse}");
    let rows = top(&inuse);
    assert_eq!(flat(&rows, "site_live"), 3 * MIB, "{inuse}");
    assert_eq!(flat(&rows, "site_worker"), 2 * MIB, "{inuse}");
    assert_eq!(flat(&rows, "site_freed"), 0, "{inuse}");
    assert_eq!(flat(&top(&alloc), "site_freed"), MIB, "{alloc}");
    assert_eq!(flat(&top(&alloc), "site_live"), 3 * MIB, "{alloc}");
    let objects = go_pprof(
        fixture,
        &format!("{label}.objects"),
        &["-top", "-sample_index=inuse_objects", file],
    );
    assert!(objects.contains("Type: inuse_objects"), "{objects}");
    let worker = go_pprof(
        fixture,
        &format!("{label}.worker"),
        &["-top", "-unit=B", "-tagfocus=thread=worker", file],
    );
    let rows = top(&worker);
    assert_eq!(flat(&rows, "site_worker"), 2 * MIB, "{worker}");
    assert_eq!(flat(&rows, "site_live"), 0, "{worker}");
}

#[test]
fn go_tool_pprof_reads_a_running_process_and_its_core() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let mut sites = Sites::start(&fixture);
    let pid = sites.pid.to_string();

    let before = fixture.dir.join("before.pb.gz");
    pprof(&fixture, &pid, &before);
    check_sites(&fixture, "live", &before, live_bytes(&fixture, &pid));

    // A diff against the first profile shows only what was allocated since.
    sites.more();
    let after = fixture.dir.join("after.pb.gz");
    pprof(&fixture, &pid, &after);
    let diff = go_pprof(
        &fixture,
        "diff",
        &[
            "-top",
            "-unit=B",
            &format!("-diff_base={}", before.display()),
            after.to_str().unwrap(),
        ],
    );
    let rows = top(&diff);
    assert_eq!(flat(&rows, "site_more"), 512 << 10, "{diff}");
    assert_eq!(flat(&rows, "site_live"), 0, "{diff}");

    let core = fixture.dir.join("core.pprof");
    gcore(sites.pid, &core, &fixture.dir.join("gcore"));
    let core_text = core.to_str().unwrap();
    let from_core = fixture.dir.join("core.pb.gz");
    pprof(&fixture, core_text, &from_core);
    check_sites(
        &fixture,
        "core",
        &from_core,
        live_bytes(&fixture, core_text),
    );
    let _ = std::fs::remove_file(&core);
}

#[test]
fn bad_targets_and_outputs_are_one_line() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    for (label, args) in [
        ("nopid", vec!["pprof", "999999999", "-o", "x.pb.gz"]),
        (
            "nocore",
            vec!["pprof", "/nonexistent/core", "-o", "x.pb.gz"],
        ),
        ("nooutput", vec!["pprof", "1"]),
    ] {
        let out = mem_trace_within(&fixture, label, &args, Duration::from_secs(60));
        assert!(!out.success(), "{}", out.describe());
        assert!(!out.stderr.trim().is_empty(), "{}", out.describe());
        if label != "nooutput" {
            assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.describe());
        }
    }
}

/// What `go tool pprof` finds in pprof_sites' profile made as it exits (`file`): in use,
/// `site_live` 3 MiB, `site_worker` 2 MiB, `site_more` 1 MiB and nothing of `site_freed`,
/// which allocated 1 MiB.
fn exit_profile_sites(fixture: &Fixture, label: &str, file: &str) {
    let (inuse, alloc) = in_use_and_allocated(fixture, label, file);
    assert!(inuse.contains("Type: inuse_space"), "{inuse}");
    let rows = top(&inuse);
    assert_eq!(flat(&rows, "site_live"), 3 * MIB, "{inuse}");
    assert_eq!(flat(&rows, "site_worker"), 2 * MIB, "{inuse}");
    assert_eq!(flat(&rows, "site_more"), MIB, "{inuse}");
    assert_eq!(flat(&rows, "site_freed"), 0, "{inuse}");
    assert_eq!(flat(&top(&alloc), "site_freed"), MIB, "{alloc}");
}

/// `mem-trace run --pprof`: each process is read as it exits, while the library holds it at
/// the end of `exit`, and its profile (every stack's counts, not a report's top) lands beside
/// its report; the program's output and status are its own, and nothing is left waiting.
#[test]
fn run_writes_each_exiting_process_profile_beside_its_report() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let input = fixture.dir.join("two-lines");
    std::fs::write(&input, "a\nb\n").unwrap();
    let dir = fixture.dir.join("run-pprof");
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = std::process::Command::new(common::mem_trace_binary());
    cmd.args(["run", "--pprof", "-o"])
        .arg(&dir)
        .arg(&fixture.bin)
        .current_dir(&fixture.dir);
    let out = succeeded(
        cmd,
        &fixture.dir.join("run-pprof"),
        Some(&input),
        Duration::from_secs(120),
        "mem-trace run --pprof",
    );
    assert_eq!(out.stdout.matches("ok").count(), 2, "{}", out.describe());
    let profiles = common::files_ending(&dir, ".pb.gz");
    assert_eq!(profiles.len(), 1, "{profiles:?}\n{}", out.stderr);
    let file = profiles[0].to_str().unwrap();
    assert!(
        out.stderr
            .contains(&format!("pprof profile: {file} (go tool pprof -top FILE)")),
        "{}",
        out.stderr
    );
    // The profile's process wrote the report beside it.
    let pid = file.rsplit('.').nth(2).unwrap();
    assert!(dir.join(format!("mem-trace.{pid}.1.txt")).exists());
    exit_profile_sites(&fixture, "run", file);
    let worker = go_pprof(
        &fixture,
        "run.worker",
        &["-top", "-unit=B", "-tagfocus=thread=worker", file],
    );
    assert_eq!(flat(&top(&worker), "site_worker"), 2 * MIB, "{worker}");
    assert_eq!(flat(&top(&worker), "site_live"), 0, "{worker}");
    // No FIFO left behind: run's and the process's.
    let mut left = common::files_ending(&dir, ".exits");
    left.extend(common::files_ending(&dir, ".held"));
    assert!(left.is_empty(), "{left:?}");
}

/// Told to hold at exit with no `run` listening (the variable set by hand), a process does not
/// wait: the FIFO it would name itself on is missing, so it exits at once.
#[test]
fn a_hold_with_nobody_listening_does_not_wait() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let input = fixture.dir.join("no-lines");
    std::fs::write(&input, "").unwrap();
    let dir = fixture.dir.join("hold-alone");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = std::process::Command::new(&fixture.bin);
    cmd.env("LD_PRELOAD", common::library())
        .env("MEM_TRACE_PROFILE", "1")
        .env("MEM_TRACE_OUT", &dir)
        .env("MEM_TRACE_HOLD_AT_EXIT", "1")
        .current_dir(&fixture.dir);
    let started = std::time::Instant::now();
    succeeded(
        cmd,
        &fixture.dir.join("hold-alone"),
        Some(&input),
        Duration::from_secs(60),
        "pprof_sites held with nobody listening",
    );
    // The hold's own deadline is 10 s: far below it, the process did not wait at all.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let held = common::files_ending(&dir, ".held");
    assert!(held.is_empty(), "{held:?}");
}

/// `program` preloaded with `library` (the profiler build), in an empty environment but for
/// its reports in `dir` (`MEM_TRACE_OUT` alone, without `run`), made afresh.
fn beside_reports(program: &Path, dir: &Path, library: &Path) -> std::process::Command {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .env("LD_PRELOAD", library)
        .env("MEM_TRACE_OUT", dir)
        .current_dir(dir);
    cmd
}

/// The reports in `dir` whose text contains `kind` (`(periodic)`, `(at exit)`).
fn reports_of(dir: &Path, kind: &str) -> Vec<std::path::PathBuf> {
    common::files_ending(dir, ".txt")
        .into_iter()
        .filter(|t| common::read_text(t).contains(kind))
        .collect()
}

/// A program writing reports into `dir` (its stderr in `stderr`), started at `started`, that
/// a test waits on.
struct Awaited<'a> {
    child: &'a mut std::process::Child,
    started: std::time::Instant,
    dir: &'a Path,
    stderr: &'a Path,
}

impl Awaited<'_> {
    /// Polls `found` every 50 ms until it gives a file; past `limit` seconds from the start,
    /// kills the program and fails with `what`, the files in `dir` and its stderr.
    fn until(
        &mut self,
        what: &str,
        limit: u64,
        mut found: impl FnMut() -> Option<std::path::PathBuf>,
    ) -> std::path::PathBuf {
        loop {
            if let Some(p) = found() {
                return p;
            }
            if self.started.elapsed() > Duration::from_secs(limit) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{what}: {:?}\n{}",
                    common::files_ending(self.dir, ""),
                    common::read_text(self.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// With `MEM_TRACE_OUT` alone, each report the library writes gets the process's pprof
/// profile beside it (`X.pb.gz`), made by the `mem-trace` binary beside the library reading the
/// process: the periodic and snapshot ones while the program goes on, the exit report's
/// before the process is gone. `go tool pprof` finds the fixture's sites and sizes in them; the program's
/// output is its own and nothing is said on stderr.
#[test]
fn out_dir_alone_gets_a_profile_beside_each_report() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    common::mem_trace_binary();
    let dir = fixture.dir.join("beside");
    let stderr_path = fixture.dir.join("beside.stderr");
    let mut cmd = beside_reports(&fixture.bin, &dir, common::profiler_library());
    cmd.env("MEM_TRACE_PROFILE_INTERVAL", "0.2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready pid="), "{line:?}");
    let started = std::time::Instant::now();
    let mut program = Awaited {
        child: &mut child,
        started,
        dir: &dir,
        stderr: &stderr_path,
    };
    // Periodic profiles of the program as it waits: two, so that one began after `ready`.
    program.until("no periodic profiles in 60 s", 60, || {
        common::files_ending(&dir, ".pb.gz").into_iter().nth(1)
    });
    // A snapshot report (the default signal, SIGUSR2) gets its profile too.
    // SAFETY: a signal to our own child, by its pid.
    unsafe { libc::kill(program.child.id() as i32, libc::SIGUSR2) };
    let snapshot = program.until("no snapshot profile", 90, || {
        reports_of(&dir, "(snapshot)")
            .into_iter()
            .map(|t| t.with_extension("pb.gz"))
            .find(|p| p.exists())
    });
    for _ in 0..2 {
        writeln!(stdin).unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "ok\n");
    }
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let stderr = common::read_text(&stderr_path);
    assert!(status.success(), "{status:?}\n{stderr}");
    assert_eq!(rest, "", "{stderr}");
    assert!(!stderr.contains("mem-trace: no "), "{stderr}");

    let exit = reports_of(&dir, "(at exit)");
    assert_eq!(exit.len(), 1, "{:?}", common::files_ending(&dir, ""));
    let profile = exit[0].with_extension("pb.gz");
    let file = profile.to_str().unwrap();
    exit_profile_sites(&fixture, "beside.exit", file);

    // Every periodic report but one cut short by the exit has its profile; the last before
    // the answers holds what `ready` said was there, and no `site_more` yet.
    let periodic = reports_of(&dir, "(periodic)");
    let with_profile: Vec<_> = periodic
        .iter()
        .map(|t| t.with_extension("pb.gz"))
        .filter(|p| p.exists())
        .collect();
    assert!(
        with_profile.len() >= 2 && with_profile.len() + 1 >= periodic.len(),
        "{periodic:?}\n{with_profile:?}"
    );
    let sites_seen = with_profile.iter().any(|p| {
        let text = go_pprof(
            &fixture,
            &format!(
                "beside.{}",
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .replace(".pb.gz", "")
            ),
            &["-top", "-unit=B", p.to_str().unwrap()],
        );
        let rows = top(&text);
        flat(&rows, "site_live") == 3 * MIB
            && flat(&rows, "site_worker") == 2 * MIB
            && flat(&rows, "site_more") == 0
    });
    assert!(sites_seen, "{with_profile:?}");
    let text = go_pprof(
        &fixture,
        "beside.snapshot",
        &["-top", "-unit=B", snapshot.to_str().unwrap()],
    );
    assert_eq!(flat(&top(&text), "site_live"), 3 * MIB, "{text}");
    // No temporary file of the command's left behind.
    let tmp = common::files_ending(&dir, ".tmp");
    assert!(tmp.is_empty(), "{tmp:?}");
}

/// A library whose directory has no `mem-trace` binary: the program's output and status are
/// its own, and one note on stderr says that the flame graphs can still be drawn and that the
/// profiles are lost.
#[test]
fn without_the_binary_the_profiles_are_lost_with_one_note() {
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    let lib_dir = fixture.dir.join("lib-alone");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libmem_trace.so");
    let _ = std::fs::remove_file(&lib);
    std::fs::copy(common::profiler_library(), &lib).unwrap();
    let input = fixture.dir.join("one-line");
    std::fs::write(&input, "a\n").unwrap();
    let dir = fixture.dir.join("alone");
    let mut cmd = beside_reports(&fixture.bin, &dir, &lib);
    cmd.env("MEM_TRACE_PROFILE_INTERVAL", "0.2");
    let out = succeeded(
        cmd,
        &fixture.dir.join("alone"),
        Some(&input),
        Duration::from_secs(120),
        "pprof_sites without the binary",
    );
    let pid = out
        .stdout
        .strip_prefix("ready pid=")
        .and_then(|s| s.strip_suffix("\nok\n"))
        .unwrap_or_else(|| panic!("{}", out.describe()));
    assert!(pid.parse::<u32>().is_ok(), "{}", out.describe());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    assert!(
        out.stderr.starts_with(&format!(
            "mem-trace: no flame graphs and no pprof profiles: {}/mem-trace is not there",
            lib_dir.display()
        )) && out.stderr.contains(
            "the pprof profiles are lost: `mem-trace pprof PID` reads only a running process"
        ),
        "{}",
        out.describe()
    );
    assert!(common::files_ending(&dir, ".pb.gz").is_empty());
    assert!(!common::files_ending(&dir, ".folded").is_empty());
}

/// A process its reader may not read (a program its user cannot read is not dumpable, so
/// `process_vm_readv` is refused to that user): one note on stderr with the reader's reason,
/// no profile, no more tries, and the program's output, status and time its own. The flame
/// graphs, drawn from files, are still drawn.
#[test]
fn a_process_that_may_not_be_read_gets_one_note() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let fixture = c_fixture("pprof_sites.c", &["-pthread"]);
    common::mem_trace_binary();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs the program as another user: run the tests as root (.ci/run does)"
    );
    let nobody = 65534;
    let unreadable = fixture.dir.join("pprof_sites_unreadable");
    let _ = std::fs::remove_file(&unreadable);
    std::fs::copy(&fixture.bin, &unreadable).unwrap();
    std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o711)).unwrap();
    let input = fixture.dir.join("one-line");
    std::fs::write(&input, "a\n").unwrap();
    let dir = fixture.dir.join("unreadable");
    let mut cmd = beside_reports(&unreadable, &dir, common::profiler_library());
    std::os::unix::fs::chown(&dir, Some(nobody), Some(nobody)).unwrap();
    cmd.uid(nobody).gid(nobody);
    let logs = fixture.dir.join("unreadable-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let out = succeeded(
        cmd,
        &logs.join("run"),
        Some(&input),
        Duration::from_secs(120),
        "pprof_sites as nobody",
    );
    assert!(
        out.stdout.starts_with("ready pid=") && out.stdout.ends_with("\nok\n"),
        "{}",
        out.describe()
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    assert!(
        out.stderr.starts_with("mem-trace: no pprof profile ")
            && out.stderr.contains("not allowed to read process")
            && out
                .stderr
                .trim_end()
                .ends_with("; no more pprof profiles from this process"),
        "{}",
        out.describe()
    );
    assert!(common::files_ending(&dir, ".pb.gz").is_empty());
    assert_eq!(common::files_ending(&dir, ".svg").len(), 1);
    // Far below the command's 10 s limit: refused at once, not waited out.
    assert!(out.elapsed < Duration::from_secs(8), "{:?}", out.elapsed);
}

/// The profiles' readers are children the program cannot see, as the flame graphs' renderers
/// are: `run_modes quiet-children` counts `SIGCHLD` and polls `waitpid(-1)` while periodic
/// reports every 0.2 s get their profiles (and graphs), and sees nothing; a child of its own,
/// the control, is seen both ways.
#[test]
fn the_profiles_readers_are_unseen_by_the_program() {
    let fixture = c_fixture("run_modes.c", &[]);
    common::mem_trace_binary();
    let dir = fixture.dir.join("unseen-readers");
    let mut cmd = beside_reports(&fixture.bin, &dir, common::profiler_library());
    // 3 s for at least three reports 0.2 s apart: the first one symbolizes every module and
    // starts the profile's reader, which took 0.7 s on a loaded 2-core machine.
    cmd.args(["quiet-children", "3000"])
        .env("MEM_TRACE_PROFILE_INTERVAL", "0.2");
    let out = succeeded(
        cmd,
        &fixture.dir.join("unseen-readers"),
        None,
        Duration::from_secs(120),
        "run_modes quiet-children under MEM_TRACE_OUT",
    );
    assert_eq!(
        out.stdout,
        common::QUIET_CHILDREN_UNSEEN,
        "{}",
        out.describe()
    );
    assert!(!out.stderr.contains("mem-trace: no "), "{}", out.describe());
    let periodic = reports_of(&dir, "(periodic)");
    let profiles = periodic
        .iter()
        .filter(|t| t.with_extension("pb.gz").exists())
        .count();
    assert!(profiles >= 3, "{periodic:?}\n{}", out.describe());
}
