//! Programs whose blocks come from another allocator than glibc's: one linked with tcmalloc,
//! the same with mimalloc preloaded after the tracer (tests/fixtures/other_allocators.c),
//! Debian's redis-server, which links jemalloc, under `mem-trace run`, and a program that
//! defines its own malloc (tests/fixtures/own_malloc.c). The allocator the program would have
//! used serves every block; the tracer still answers for them.

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, fixture_run, mem_trace_binary, scratch_dir, Fixture};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";
const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";

/// The fixture linked with tcmalloc (`--no-as-needed`: nothing in it names tcmalloc).
fn fixture() -> Fixture {
    for lib in [TCMALLOC, MIMALLOC] {
        assert!(
            Path::new(lib).is_file(),
            "{lib} is missing: install libtcmalloc-minimal4 and libmimalloc2.0 (.ci/run does)"
        );
    }
    with_entry_script(c_fixture(
        "other_allocators.c",
        &["-Wl,--no-as-needed", TCMALLOC],
    ))
}

#[test]
fn a_block_of_tcmalloc_is_explained_by_mtrace_why() {
    gdb(&fixture(), "");
}

#[test]
fn a_block_of_mimalloc_preloaded_after_the_tracer_is_explained_by_mtrace_why() {
    gdb(&fixture(), "mimalloc");
}

#[test]
fn each_allocator_keeps_the_output_and_its_leak_is_found_in_both_modes() {
    let f = fixture();
    for run in [
        "tcmalloc-debug",
        "tcmalloc-profile",
        "mimalloc-debug",
        "mimalloc-profile",
    ] {
        let r = fixture_run(&f, run);
        let out = match r.preload {
            true => r.run_same_as_plain(),
            // Preloads of its own (mimalloc after the tracer): compared with the same
            // program plain, and with mimalloc alone.
            false => {
                let traced = r.run();
                let plain = Command::new(&f.bin).output().expect("run plain");
                assert_eq!(
                    traced.stdout,
                    String::from_utf8_lossy(&plain.stdout),
                    "{run}"
                );
                traced
            }
        };
        r.check(&out);
    }
}

#[test]
fn a_program_with_its_own_malloc_runs_unchanged_and_is_told_apart() {
    let f = c_fixture("own_malloc.c", &[]);
    let r = fixture_run(&f, "");
    let out = r.run_same_as_plain();
    r.check(&out);
}

/// A TCP connection to 127.0.0.1:`port` once something listens there, within `limit`.
fn connect(port: u16, limit: Duration) -> TcpStream {
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            return s;
        }
        assert!(start.elapsed() < limit, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `INFO memory` from the redis server on `port`, raw.
fn info_memory(port: u16) -> String {
    let mut s = connect(port, Duration::from_secs(30));
    s.write_all(b"INFO memory\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 8192];
    while !text.contains("mem_allocator") || !text.ends_with("\r\n") {
        let n = s.read(&mut buf).expect("read INFO");
        assert!(n > 0, "redis closed the connection: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    text
}

/// Debian's redis-server (jemalloc) under `mem-trace run` in `mode` (`MEM_TRACE_SAMPLE` too
/// when `sample`): it starts, says it allocates with jemalloc, serves `redis-benchmark` on
/// loopback without an error, reports jemalloc in `INFO memory`, and on SIGTERM stops with
/// its exit report naming redis's allocating functions.
fn redis_under_run(mode: &str, sample: Option<&str>, port: u16) {
    let Some(server) = which("redis-server") else {
        panic!("redis-server is missing: install redis-server and redis-tools (.ci/run does)");
    };
    let dir = scratch_dir("other_allocators", &format!("redis-{mode}-{port}"));
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["run", "--mode", mode, "-o"])
        .arg(&dir)
        .arg("--")
        .arg(&server)
        .args(redis_args(port, &dir))
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(rate) = sample {
        cmd.env("MEM_TRACE_SAMPLE", rate);
    }
    let mut run = cmd.spawn().expect("start mem-trace run");
    let info = info_memory(port);
    assert!(
        info.contains("mem_allocator:jemalloc"),
        "{mode}: INFO memory:\n{info}"
    );
    let bench = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q", "-n", "100000"])
        .args(["-t", "set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,mset"])
        .output()
        .expect("run redis-benchmark");
    let said = String::from_utf8_lossy(&bench.stdout).replace('\r', "\n")
        + &String::from_utf8_lossy(&bench.stderr);
    assert!(bench.status.success(), "{mode}: redis-benchmark: {said}");
    let results: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("requests per second"))
        .collect();
    assert_eq!(results.len(), 10, "{mode}: redis-benchmark:\n{said}");
    assert!(
        !said.to_lowercase().contains("error"),
        "{mode}: redis-benchmark:\n{said}"
    );
    // SAFETY: kill with a valid pid of our own child and a signal number.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "{mode}: run did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let mut out = String::new();
    run.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let all = format!("{out}\n{err}");
    assert!(
        status.code().is_some(),
        "{mode}: run ended by a signal: {status:?}\n{all}"
    );
    assert!(
        all.contains("the program allocates with") && all.contains("libjemalloc.so.2"),
        "{mode}: no line naming jemalloc\n{all}"
    );
    assert!(
        !all.contains("crashed by signal"),
        "{mode}: redis crashed\n{all}"
    );
    // The report (the summary on stderr, the per-process files in DIR) names redis's own
    // allocating functions: zmalloc's, and the callers of it.
    let reports: String = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .collect();
    let text = format!("{all}\n{reports}");
    for name in ["zmalloc", "createClient"] {
        assert!(
            text.contains(name),
            "{mode}: no {name} in the reports\n{all}"
        );
    }
}

/// A redis-server's arguments: `port`, its files in `dir`, no persistence.
fn redis_args(port: u16, dir: &Path) -> Vec<std::ffi::OsString> {
    let port = port.to_string();
    let mut args: Vec<std::ffi::OsString> = ["--port", &port, "--save", "", "--appendonly", "no"]
        .iter()
        .map(Into::into)
        .collect();
    args.extend(["--dir".into(), dir.into()]);
    args
}

fn which(name: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!path.is_empty()).then_some(path)
}

#[test]
fn redis_with_jemalloc_serves_a_benchmark_under_run_in_profile_mode() {
    redis_under_run("profile", None, 16391);
}

#[test]
fn redis_with_jemalloc_serves_a_benchmark_under_run_in_debug_mode() {
    redis_under_run("debug", None, 16392);
}

#[test]
fn redis_with_jemalloc_serves_a_benchmark_under_run_sampled() {
    redis_under_run("profile", Some("512K"), 16393);
}

/// A plain redis-server (jemalloc) on `port`, stopped (SIGKILL) when dropped.
struct Redis(std::process::Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `mem-trace attach`, `top`, `pprof` and `detach` on a plain redis-server under
/// `redis-benchmark`, twenty times: every command succeeds, `top` names redis's functions, the
/// server never crashes and the benchmark finishes without an error.
#[test]
fn redis_with_jemalloc_is_attached_read_and_detached_twenty_times_under_load() {
    let server = which("redis-server").expect("redis-server is missing (.ci/run installs it)");
    let port = 16394;
    let dir = scratch_dir("other_allocators", "redis-attach");
    let redis = Redis(
        Command::new(&server)
            .args(redis_args(port, &dir))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    );
    drop(connect(port, Duration::from_secs(30)));
    let pid = redis.0.id().to_string();
    let bench = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q", "-n", "400000"])
        .args(["-t", "set,get,lpush,incr"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-benchmark");
    let mem_trace = |args: &[&str]| {
        let out = Command::new(mem_trace_binary())
            .args(args)
            .output()
            .expect("run mem-trace");
        let said = format!(
            "mem-trace {}: {:?}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{said}");
        said
    };
    let pprof = dir.join("redis.pb.gz");
    let pprof = pprof.to_str().unwrap();
    // A `top` right after the attach may come before the server allocated anything.
    let mut named = 0;
    for _ in 0..20 {
        mem_trace(&["attach", &pid]);
        let top = mem_trace(&["top", &pid]);
        named += usize::from(top.contains("zmalloc"));
        mem_trace(&["pprof", &pid, "-o", pprof]);
        assert!(std::fs::metadata(pprof).unwrap().len() > 0);
        mem_trace(&["detach", &pid]);
    }
    assert!(named >= 10, "only {named} of 20 tops named zmalloc");
    let out = bench.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).replace('\r', "\n")
        + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "redis-benchmark: {said}");
    let results = said
        .lines()
        .filter(|l| l.contains("requests per second"))
        .count();
    assert_eq!(results, 4, "redis-benchmark:\n{said}");
    assert!(
        !said.to_lowercase().contains("error"),
        "redis-benchmark:\n{said}"
    );
    drop(connect(port, Duration::from_secs(5)));
}
