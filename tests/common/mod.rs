//! Shared harness of the integration tests: builds the tracer once, compiles fixtures, runs
//! programs plain and under `LD_PRELOAD`, and runs what fixtures say about themselves in their
//! directive comments (see [`script`]): gdb sessions ([`run_gdb_script`]) and direct runs with
//! their exit code, stdout and stderr ([`fixture_run`]).
//!
//! Every child process runs in its own process group with a hard timeout: a hang fails the
//! test with the output so far instead of stalling the suite. Outputs go to files next to the
//! fixture binary (`target/mem-trace-tests/<fixture>/`), so a failure can be inspected and
//! rerun by hand; each failure message prints the exact command line.
//!
//! gdb missing is a failure, not a skip: `.ci/run` installs it.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod leaks;
pub mod mtrace;
pub mod pprof_sites;
pub mod script;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use script::{Check, Directive, Exit, FixtureSource, Substitutions};

/// Hard limit for one gdb session (start-up, symbol loading, the script, the kill at exit).
pub const GDB_TIMEOUT: Duration = Duration::from_secs(90);
/// Hard limit for one plain or preloaded run of a fixture or a real program.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// What `run_modes quiet-children` prints when the library's own children stay unseen by the
/// program: no SIGCHLD, nothing for its `waitpid(-1)` to reap, while a child of its own, the
/// control, is seen both ways.
pub const QUIET_CHILDREN_UNSEEN: &str = "sigchld 0 reaped 0\ncontrol: sigchld 1 reaped 1\n";

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the package) or `target/`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => manifest_dir().join(dir),
        _ => manifest_dir().join("target"),
    }
}

/// A fresh, empty directory `target/mem-trace-tests/GROUP/NAME` for one test.
pub fn scratch_dir(group: &str, name: &str) -> PathBuf {
    let d = target_dir().join("mem-trace-tests").join(group).join(name);
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Files in `dir` whose names end with `suffix`, sorted.
pub fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// A file's text; a failure names the file.
pub fn read_text(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The fixtures' sources.
pub fn fixtures_dir() -> PathBuf {
    manifest_dir().join("tests").join("fixtures")
}

/// Builds `libmem_trace.so` (release, `tracer` feature) once per test process and returns it.
pub fn library() -> &'static Path {
    static LIBRARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match LIBRARY.get_or_init(build_library) {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// Builds the `profiler` build of `libmem_trace.so` once per test process, in its own target
/// directory (`target/profiler/`: one `target/release/libmem_trace.so` cannot be both builds
/// while test binaries run side by side), and returns it. Fixtures name it `{profiler_so}`.
pub fn profiler_library() -> &'static Path {
    static LIBRARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built =
        LIBRARY.get_or_init(|| build_library_in("profiler", Some(target_dir().join("profiler"))));
    match built {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

fn build_library() -> Result<PathBuf, String> {
    build_library_in("tracer", None)
}

/// `cargo build --release -p mem-trace-preload --features FEATURE --lib`, into `target_dir`
/// when given (the preload package alone: the workspace's other libraries are not the preload).
///
/// gdb's commands answer through the reader module, `libmem_trace_reader.so`, which they look
/// for beside the library: it is built there too.
fn build_library_in(feature: &str, target: Option<PathBuf>) -> Result<PathBuf, String> {
    let args = ["-p", "mem-trace-preload", "--features", feature, "--lib"];
    let library = cargo_build(&args, target.clone(), "libmem_trace.so")?;
    cargo_build(
        &["-p", "mem-trace-gdb", "--lib"],
        target,
        "libmem_trace_reader.so",
    )?;
    Ok(library)
}

/// `fixture` under `library`, for readers to read while it waits: no periodic report and no
/// exit report (`MEM_TRACE_LEAKS=0`), so the reads under test are the only ones; stdin and
/// stdout piped to drive it, stderr inherited. The caller adds its arguments and variables
/// (a later value of a variable wins), then spawns it with [`spawn_fixture`].
pub fn waiting_fixture(fixture: &Fixture, library: &Path) -> Command {
    let mut cmd = Command::new(&fixture.bin);
    cmd.env("LD_PRELOAD", library)
        .env("MEM_TRACE_PROFILE_INTERVAL", "0")
        .env("MEM_TRACE_LEAKS", "0")
        .current_dir(&fixture.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// Spawns `cmd`, a [`waiting_fixture`] of `fixture`.
pub fn spawn_fixture(cmd: &mut Command, fixture: &Fixture) -> std::process::Child {
    cmd.spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", fixture.bin.display()))
}

/// The `mem-trace` binary, built (release) beside the profiler build of the library in
/// `target/profiler/release/`, where `mem-trace run` finds the library and the library finds
/// the binary that draws its flame graphs. Built once per test process.
pub fn mem_trace_binary() -> &'static Path {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    profiler_library();
    let built = BINARY.get_or_init(|| {
        cargo_build(
            &["-p", "mem-trace-cli", "--bin", "mem-trace"],
            Some(target_dir().join("profiler")),
            "mem-trace",
        )
    });
    match built {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// `gcore` of `pid` into `path`, through gdb as `gcore` itself does (gdb's own output in
/// `log`); asserts the core was written.
pub fn gcore(pid: u32, path: &Path, log: &Path) {
    let _ = fs::remove_file(path);
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off", "-p"])
        .arg(pid.to_string())
        .arg("-ex")
        .arg(format!("gcore {}", path.display()))
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(cmd, log, true, None, GDB_TIMEOUT, "gcore");
    assert!(
        out.success() && path.is_file(),
        "gcore failed\n{}",
        out.describe()
    );
}

/// A core of `fixture` run with `args` under the profiler build (no exit report), taken by
/// gdb when the program calls `exit_group`: its memory as the kernel would end it.
pub fn gcore_at_exit_group(fixture: &Fixture, args: &[&str], path: &Path, log: &Path) {
    let _ = fs::remove_file(path);
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off"])
        .arg("-ex")
        .arg(format!(
            "set environment LD_PRELOAD={}",
            profiler_library().display()
        ))
        .args(["-ex", "set environment MEM_TRACE_LEAKS=0"])
        .args(["-ex", "catch syscall exit_group", "-ex", "run"])
        .arg("-ex")
        .arg(format!("gcore {}", path.display()))
        .args(["-ex", "kill", "--args"])
        .arg(&fixture.bin)
        .args(args)
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(cmd, log, true, None, GDB_TIMEOUT, "gcore");
    assert!(
        out.success() && path.is_file(),
        "gcore at exit_group failed\n{}",
        out.describe()
    );
}

/// `mem-trace ARGS` run in `fixture`'s directory, with a timeout, its logs beside the
/// fixture (`mem-trace.LABEL`).
pub fn mem_trace_run(fixture: &Fixture, label: &str, args: &[&str]) -> Output {
    mem_trace_within(fixture, label, args, Duration::from_secs(120))
}

/// [`mem_trace_run`] within `timeout`.
pub fn mem_trace_within(
    fixture: &Fixture,
    label: &str,
    args: &[&str],
    timeout: Duration,
) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args).current_dir(&fixture.dir);
    run_with_timeout(
        cmd,
        &fixture.dir.join(format!("mem-trace.{label}")),
        false,
        None,
        timeout,
        &format!("mem-trace {}", args.join(" ")),
    )
}

/// `cargo build --release ARGS` (into `target` when given); the path of `file` it built in
/// `release/`.
fn cargo_build(args: &[&str], target: Option<PathBuf>, file: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release"])
        .args(args)
        .current_dir(manifest_dir());
    if let Some(dir) = &target {
        cmd.arg("--target-dir").arg(dir);
    }
    let shown = render(&cmd);
    let out = cmd
        .output()
        .map_err(|e| format!("mem-trace tests: cannot run `{shown}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mem-trace tests: building {file} failed ({}):\n  {shown}\n----- cargo stderr -----\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let built = target.unwrap_or_else(target_dir).join("release").join(file);
    if !built.is_file() {
        return Err(format!(
            "mem-trace tests: `{shown}` succeeded but {} does not exist",
            built.display()
        ));
    }
    Ok(built)
}

/// A compiled fixture.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// File stem, e.g. `hooks` for `tests/fixtures/hooks.c`.
    pub name: String,
    /// Absolute path of the source (the path compiled into the debug info).
    pub src: PathBuf,
    /// `target/mem-trace-tests/<name>/`: binary, gdb scripts, logs.
    pub dir: PathBuf,
    /// The executable.
    pub bin: PathBuf,
}

/// Flags for C fixtures: debug info, optimised enough that frame pointers are gone (so the
/// tracer must unwind with CFI), small helpers not inlined behind our back.
pub const C_FLAGS: &[&str] = &[
    "-g",
    "-O1",
    "-fomit-frame-pointer",
    "-fno-inline-small-functions",
    "-Wall",
];

/// Compiles `tests/fixtures/<file>` once per test process into `<dir>/<output>`, where
/// `<dir>` is `target/mem-trace-tests/<stem>/`. `compile(src, out)` gives the command.
///
/// The compiler writes a temporary file that is then renamed, so a test process running the
/// previous binary (or a concurrent one, e.g. under `cargo nextest`) never sees a half-written
/// file.
fn compile_once(
    file: &str,
    output: impl FnOnce(&str) -> String,
    compile: impl FnOnce(&Path, &Path) -> Command,
) -> Fixture {
    static COMPILED: Mutex<Option<HashMap<String, Fixture>>> = Mutex::new(None);
    let mut compiled = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    let map = compiled.get_or_insert_with(HashMap::new);
    if let Some(f) = map.get(file) {
        return f.clone();
    }
    let src = fixtures_dir().join(file);
    assert!(src.is_file(), "no fixture {}", src.display());
    let name = Path::new(file)
        .file_stem()
        .and_then(OsStr::to_str)
        .expect("fixture file name")
        .to_string();
    let dir = target_dir().join("mem-trace-tests").join(&name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let output = output(&name);
    let bin = dir.join(&output);
    let tmp = dir.join(format!(".{output}.tmp{}", std::process::id()));
    let mut cmd = compile(&src, &tmp);
    let shown = render(&cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{shown}`: {e}"));
    assert!(
        out.status.success(),
        "compiling fixture failed ({}):\n  {shown}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(&tmp, &bin)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), bin.display()));
    let fixture = Fixture {
        name,
        src,
        dir,
        bin,
    };
    map.insert(file.to_string(), fixture.clone());
    fixture
}

/// Compiles `tests/fixtures/<file>` (C) with [`C_FLAGS`] plus `extra` (e.g. `-pthread`).
pub fn c_fixture(file: &str, extra: &[&str]) -> Fixture {
    compile_once(file, str::to_string, |src, out| {
        let mut cmd = Command::new("gcc");
        cmd.args(C_FLAGS).args(extra).arg("-o").arg(out).arg(src);
        cmd
    })
}

/// Compiles a C++ fixture with g++ and the same flags as C fixtures (no frame pointers).
pub fn cpp_fixture(file: &str) -> Fixture {
    compile_once(file, str::to_string, |src, out| {
        let mut cmd = Command::new("g++");
        cmd.args(C_FLAGS).arg("-o").arg(out).arg(src);
        cmd
    })
}

/// Compiles `tests/fixtures/<file>` (C) into a shared library; `bin` is `<dir>/lib<stem>.so`.
pub fn c_shared_library(file: &str) -> Fixture {
    compile_once(
        file,
        |stem| format!("lib{stem}.so"),
        |src, out| {
            let mut cmd = Command::new("gcc");
            cmd.args(C_FLAGS)
                .args(["-shared", "-fPIC", "-o"])
                .arg(out)
                .arg(src);
            cmd
        },
    )
}

/// Compiles `tests/fixtures/<file>` (Rust) with debug info and no optimisation.
pub fn rust_fixture(file: &str) -> Fixture {
    compile_once(file, str::to_string, |src, out| {
        let mut cmd = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
        cmd.args(["-g", "-C", "opt-level=0", "--edition", "2021", "-o"])
            .arg(out)
            .arg(src);
        cmd
    })
}

/// What a finished child did.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The command line, ready to paste into a shell.
    pub command: String,
    pub elapsed: Duration,
}

impl Output {
    /// The number after `key=` on the tracer's statistics line (`MEM_TRACE_STATS=1`), from
    /// the first process that wrote one.
    pub fn stat(&self, key: &str) -> u64 {
        let line = self
            .stderr
            .lines()
            .find(|l| l.starts_with("mem-trace: stats: "))
            .unwrap_or_else(|| panic!("no statistics line\n{}", self.describe()));
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key}= in {line}"))
    }

    /// A readable account of the run, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {} after {:.1?}\n----- stdout -----\n{}----- stderr -----\n{}------------------\n",
            self.command,
            describe_status(self.status),
            self.elapsed,
            self.stdout,
            self.stderr
        )
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }
}

pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => format!("{status}"),
    }
}

/// Runs `cmd` in its own process group, stdout and stderr to `<log_base>.stdout`/`.stderr`
/// (or both to `<log_base>.log` when `combined`), with stdin from `stdin` or `/dev/null`.
/// Past `timeout` the whole process group is killed and the test fails with the output so far.
pub fn run_with_timeout(
    mut cmd: Command,
    log_base: &Path,
    combined: bool,
    stdin: Option<&Path>,
    timeout: Duration,
    what: &str,
) -> Output {
    let command = render(&cmd);
    // Appended, not `with_extension`: `hooks.plain` and `hooks.preload` must not collide.
    let with_suffix = |suffix: &str| PathBuf::from(format!("{}.{suffix}", log_base.display()));
    let (out_path, err_path) = if combined {
        let p = with_suffix("log");
        (p.clone(), p)
    } else {
        (with_suffix("stdout"), with_suffix("stderr"))
    };
    let out_file =
        File::create(&out_path).unwrap_or_else(|e| panic!("create {}: {e}", out_path.display()));
    let err_file = if combined {
        out_file.try_clone().expect("dup log file")
    } else {
        File::create(&err_path).unwrap_or_else(|e| panic!("create {}: {e}", err_path.display()))
    };
    let stdin = match stdin {
        Some(p) => {
            Stdio::from(File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display())))
        }
        None => Stdio::null(),
    };
    cmd.stdin(stdin)
        .stdout(out_file)
        .stderr(err_file)
        .process_group(0);
    let start = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{what}: `{}` not found on PATH ({e}); install it (.ci/run does): the tests need it, they do not skip without it",
            cmd.get_program().to_string_lossy()
        ),
        Err(e) => panic!("{what}: cannot run `{command}`: {e}"),
    };
    let read = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            let stdout = read(&out_path);
            let stderr = if combined {
                String::new()
            } else {
                read(&err_path)
            };
            return Output {
                status,
                stdout,
                stderr,
                command,
                elapsed: start.elapsed(),
            };
        }
        if start.elapsed() > timeout {
            // SAFETY: plain syscall; the child leads its own process group (process_group(0)),
            // so -pid names exactly the group we created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            let mut msg = format!(
                "{what} did not return within {} s; killed its process group.\n  rerun: {command}\n",
                timeout.as_secs_f64()
            );
            let _ = write!(
                msg,
                "----- output so far ({}) -----\n{}",
                out_path.display(),
                read(&out_path)
            );
            if !combined {
                let _ = write!(msg, "----- stderr so far -----\n{}", read(&err_path));
            }
            panic!("{msg}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` with `RLIMIT_CORE` 0, so that a program that dies of a signal leaves no core file.
pub fn no_core_dump(cmd: &mut Command) {
    // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe and touches
    // no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &none) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// How to run a program for a plain-vs-preloaded comparison.
#[derive(Debug, Clone, Default)]
pub struct Job {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<PathBuf>,
    /// Directory for the logs; defaults to the program's directory.
    pub log_dir: Option<PathBuf>,
    /// Log file base name, e.g. `sqlite`.
    pub label: String,
    /// Working directory; the test's own when `None`.
    pub cwd: Option<PathBuf>,
    /// Run with `RLIMIT_CORE` 0, so a program that aborts leaves no core file anywhere.
    pub no_core_dump: bool,
}

impl Job {
    pub fn new(program: impl Into<PathBuf>, label: &str) -> Self {
        Job {
            program: program.into(),
            label: label.to_string(),
            ..Job::default()
        }
    }

    /// A fixture's binary, run in its build directory, without core dumps.
    pub fn fixture(f: &Fixture) -> Self {
        Job {
            cwd: Some(f.dir.clone()),
            no_core_dump: true,
            ..Job::new(&f.bin, &f.name)
        }
    }

    /// Runs the job, with `LD_PRELOAD` set to the tracer when `preload`.
    pub fn run(&self, preload: bool) -> Output {
        let dir = self
            .log_dir
            .clone()
            .or_else(|| self.program.parent().map(Path::to_path_buf))
            .expect("log dir");
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        cmd.env_remove("LD_PRELOAD");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if preload {
            cmd.env("LD_PRELOAD", library());
        }
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        if self.no_core_dump {
            no_core_dump(&mut cmd);
        }
        let suffix = if preload { "preload" } else { "plain" };
        let log_base = dir.join(format!("{}.{suffix}", self.label));
        let what = format!("{} ({suffix})", self.label);
        let mut out = run_with_timeout(
            cmd,
            &log_base,
            false,
            self.stdin.as_deref(),
            RUN_TIMEOUT,
            &what,
        );
        if self.no_core_dump {
            out.command = format!("ulimit -c 0 && {}", out.command);
        }
        out
    }

    /// Runs plain, then preloaded; asserts both succeed with identical stdout.
    /// Returns the preloaded run for further checks.
    pub fn assert_same_with_preload(&self) -> Output {
        let plain = self.run(false);
        assert!(
            plain.success(),
            "{}: the program fails even without the tracer:\n{}",
            self.label,
            plain.describe()
        );
        let traced = self.run(true);
        // ld.so only warns when it cannot preload, and the program then runs untraced: a
        // comparison would pass without testing anything.
        assert!(
            !traced.stderr.contains("cannot be preloaded"),
            "{}: the tracer was not preloaded\n{}",
            self.label,
            traced.describe()
        );
        assert!(
            traced.success(),
            "{}: fails under LD_PRELOAD={} but not without it\n{}\n----- plain run -----\n{}",
            self.label,
            library().display(),
            traced.describe(),
            plain.describe()
        );
        assert!(
            plain.stdout == traced.stdout,
            "{}: stdout differs under the tracer\n{}\n----- plain run -----\n{}",
            self.label,
            traced.describe(),
            plain.describe()
        );
        traced
    }
}

/// A fixture's direct run: its script's `run-args` and `run-env` made into a [`Job`], and its
/// `exit-code`, `stdout…` and `stderr…` directives to check the outcome against.
pub struct FixtureRun {
    source: FixtureSource,
    subs: Substitutions,
    name: String,
    /// The program, its arguments and environment; a test may add to them (e.g. the path of a
    /// library it built) before running.
    pub job: Job,
    /// Under the tracer: unless the script sets `LD_PRELOAD` itself.
    pub preload: bool,
}

/// The direct run called `name` of `fixture` (see [`script`]); panics if there is none.
pub fn fixture_run(fixture: &Fixture, name: &str) -> FixtureRun {
    let source = fixture_source(fixture);
    let s = source.run_script(name).unwrap_or_else(|e| panic!("{e}"));
    let subs = substitutions(fixture);
    let mut job = Job::fixture(fixture);
    if !name.is_empty() {
        job.label = name.to_string();
    }
    for words in expand(&source, &subs, &s.args) {
        job.args
            .extend(words.split_whitespace().map(str::to_string));
    }
    for words in expand(&source, &subs, &s.env) {
        for word in words.split_whitespace() {
            let (k, v) = word.split_once('=').expect("checked by the parser");
            job.env.push((k.to_string(), v.to_string()));
        }
    }
    let preload = !job.env.iter().any(|(k, _)| k == "LD_PRELOAD");
    FixtureRun {
        source,
        subs,
        name: name.to_string(),
        job,
        preload,
    }
}

impl FixtureRun {
    /// The same run with its output files named after `label`: tests run in parallel, and
    /// two of them running one fixture under one label wrote each other's files (a plain run
    /// read back empty while the other test's traced run wrote the same path).
    pub fn labelled(mut self, label: &str) -> Self {
        self.job.label = label.to_string();
        self
    }

    /// The same run with `vars` added to the program's environment (plain and traced runs
    /// alike).
    pub fn with_env(mut self, vars: &[(&str, &str)]) -> Self {
        self.job
            .env
            .extend(vars.iter().map(|&(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Runs the program once and checks the outcome; returns it for further checks.
    pub fn run(&self) -> Output {
        let out = self.job.run(self.preload);
        self.check(&out);
        out
    }

    /// Runs the program plain, then under the tracer, asserting both succeed with identical
    /// stdout ([`Job::assert_same_with_preload`]); then checks the traced run.
    pub fn run_same_as_plain(&self) -> Output {
        assert!(
            self.preload,
            "{}: script {:?} sets LD_PRELOAD itself: there is no traced run to compare",
            self.source.path.display(),
            self.name
        );
        let traced = self.job.assert_same_with_preload();
        self.check(&traced);
        traced
    }

    /// Checks `out` against the script's exit code, stdout and stderr directives; panics
    /// with the fixture's file:line of the first that fails, and the whole run.
    pub fn check(&self, out: &Output) {
        if let Err(message) = self.mismatch(out) {
            panic!("{message}----- the run -----\n{}", out.describe());
        }
    }

    fn mismatch(&self, out: &Output) -> Result<(), String> {
        let path = self.source.path.display();
        if self.preload && out.stderr.contains("cannot be preloaded") {
            return Err(format!(
                "{path}: script {:?}: the tracer was not preloaded\n",
                self.name
            ));
        }
        let s = self.source.run_script(&self.name)?;
        let (wanted, line) = match &s.exit {
            Some(d) => (script::parse_exit(&d.text)?, d.line),
            None => (vec![Exit::Code(0)], 0),
        };
        if !wanted.iter().any(|e| e.matches(out.status)) {
            let wanted: Vec<String> = wanted.iter().map(Exit::to_string).collect();
            let whence = match line {
                0 => format!("{path}: script {:?} (no exit-code: 0)", self.name),
                n => format!("{path}:{n}: exit-code"),
            };
            return Err(format!(
                "{whence}: expected {}, the run ended with: {}\n",
                wanted.join(" or "),
                describe_status(out.status)
            ));
        }
        for (stream, expected, output) in [
            ("stdout", &s.stdout, &out.stdout),
            ("stderr", &s.stderr, &out.stderr),
        ] {
            if !expected.lines.is_empty() {
                let lines = expand(&self.source, &self.subs, &expected.lines);
                if let Err(index) = script::match_lines(output, &lines) {
                    return Err(script::describe_lines_mismatch(
                        &self.source,
                        &expected.lines,
                        &lines,
                        index,
                        stream,
                        output,
                    ));
                }
            }
            match_directives(&self.source, &self.subs, &expected.checks, stream, output)?;
        }
        Ok(())
    }
}

/// Result of a gdb session.
#[derive(Debug)]
pub struct GdbRun {
    /// gdb's stdout and stderr interleaved (the inferior's output included).
    pub output: String,
    /// `cd <dir> && gdb -nx -batch -x <script> <bin>`.
    pub rerun: String,
    pub elapsed: Duration,
}

/// Written at the top of every generated script: output that does not depend on the terminal.
const GDB_PRELUDE: &str = "\
set pagination off
set width 0
set height 0
set confirm off
set debuginfod enabled off
";

/// Reads and parses a fixture's directives; panics with the parse error.
fn fixture_source(fixture: &Fixture) -> FixtureSource {
    let text = fs::read_to_string(&fixture.src)
        .unwrap_or_else(|e| panic!("read {}: {e}", fixture.src.display()));
    script::parse(&fixture.src, &text).unwrap_or_else(|e| panic!("{e}"))
}

fn substitutions(fixture: &Fixture) -> Substitutions {
    Substitutions {
        so: library().display().to_string(),
        src: fixture.src.display().to_string(),
        dir: fixture.dir.display().to_string(),
        bin: fixture.bin.display().to_string(),
    }
}

/// Expands the directives' substitutions; panics citing the directive when one is unknown.
fn expand(source: &FixtureSource, subs: &Substitutions, directives: &[Directive]) -> Vec<String> {
    directives
        .iter()
        .map(|d| source.substitute(d, subs).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// Matches `-check`/`-not` directives against `output`; on failure, the explanation.
fn match_directives(
    source: &FixtureSource,
    subs: &Substitutions,
    directives: &[Directive],
    stream: &str,
    output: &str,
) -> Result<(), String> {
    let expanded = expand(source, subs, directives);
    let checks: Vec<Check> = directives
        .iter()
        .zip(&expanded)
        .map(|(d, text)| Check {
            text: text.clone(),
            forbid: d.forbids(),
        })
        .collect();
    script::match_stream(output, &checks).map_err(|mismatch| {
        script::describe_mismatch(source, directives, &expanded, &mismatch, stream, output)
    })
}

/// Runs the fixture's gdb script `script` (see [`script`]) and matches its checks; panics
/// with the fixture's file:line of the first failed check and the whole output.
pub fn run_gdb_script(fixture: &Fixture, script: &str) -> GdbRun {
    let source = fixture_source(fixture);
    let s = source.gdb_script(script).unwrap_or_else(|e| panic!("{e}"));
    let subs = substitutions(fixture);
    let mut file = format!(
        "# generated by the mem-trace test harness from {} (script {script:?})\n{GDB_PRELUDE}",
        fixture.src.display()
    );
    for command in expand(&source, &subs, &s.commands) {
        file.push_str(&command);
        file.push('\n');
    }

    let stem = if script.is_empty() {
        fixture.name.clone()
    } else {
        format!("{}.{script}", fixture.name)
    };
    let script_path = fixture.dir.join(format!("{stem}.gdb"));
    fs::write(&script_path, file).expect("write gdb script");
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-x"])
        .arg(&script_path)
        .arg(&fixture.bin)
        .current_dir(&fixture.dir)
        // Scripts call into the inferior (`print_trace`), which gdb 13 cannot finish on CPUs
        // with AMX unless its register write is completed (tests/fixtures/gdb_xstate.c).
        .env("LD_PRELOAD", &c_shared_library("gdb_xstate.c").bin);
    let rerun = render(&cmd);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join(format!("{stem}.gdb-output")),
        true,
        None,
        GDB_TIMEOUT,
        &format!("gdb (rerun: {rerun})"),
    );
    let run = GdbRun {
        output: out.stdout,
        rerun,
        elapsed: out.elapsed,
    };
    if let Err(message) = match_directives(
        &source,
        &subs,
        &s.checks,
        "gdb output (stdout and stderr interleaved)",
        &run.output,
    ) {
        panic!("{message}rerun: {}\n", run.rerun);
    }
    run
}

impl GdbRun {
    /// The output between the lines `start` and `end` (exclusive), e.g. two `echo` markers.
    pub fn between(&self, start: &str, end: &str) -> &str {
        let from = self
            .output
            .find(start)
            .map(|i| i + start.len())
            .unwrap_or_else(|| panic!("no `{start}` in gdb output\n{}", self.report()));
        let to = self.output[from..]
            .find(end)
            .map(|i| from + i)
            .unwrap_or_else(|| {
                panic!(
                    "no `{end}` after `{start}` in gdb output\n{}",
                    self.report()
                )
            });
        &self.output[from..to]
    }

    /// The whole output and how to rerun, for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "rerun: {}\n----- gdb output -----\n{}----- end of gdb output -----",
            self.rerun, self.output
        )
    }
}

/// The line of `// @marker` in the fixture's source.
pub fn line_of(fixture: &Fixture, marker: &str) -> usize {
    let text = std::fs::read_to_string(&fixture.src).unwrap();
    text.lines()
        .position(|l| l.contains(&format!("// @{marker}")))
        .unwrap_or_else(|| panic!("no @{marker} in {}", fixture.src.display()))
        + 1
}

/// Shell-quotes one word if it needs it.
pub fn quote(word: impl AsRef<OsStr>) -> String {
    let s = word.as_ref().to_string_lossy();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@%".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A command as a shell line: `cd` to its working directory if it has one, explicit
/// environment, then program and arguments.
pub fn render(cmd: &Command) -> String {
    let mut words = Vec::new();
    if let Some(dir) = cmd.get_current_dir() {
        words.extend(["cd".to_string(), quote(dir), "&&".to_string()]);
    }
    let envs: Vec<_> = cmd.get_envs().collect();
    if !envs.is_empty() {
        words.push("env".to_string());
        for (k, v) in envs {
            match v {
                Some(v) => words.push(quote(format!(
                    "{}={}",
                    k.to_string_lossy(),
                    v.to_string_lossy()
                ))),
                None => {
                    words.push("-u".into());
                    words.push(quote(k));
                }
            }
        }
    }
    words.push(quote(cmd.get_program()));
    words.extend(cmd.get_args().map(quote));
    words.join(" ")
}
