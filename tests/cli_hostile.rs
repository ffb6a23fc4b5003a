//! The `mem-trace` command against what a hostile or unusual machine holds: a process that
//! maps a file only past its start (a memfd pool), read running and from its core; a core
//! whose mapped files have become FIFOs since; outputs whose path is a symlink.
//!
//! The program is `tests/fixtures/memfd_pool.c`, run under a copy of the profiler build of the
//! library (so that the copy can be replaced after the core is written).

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;

use common::{
    c_fixture, gcore, mem_trace_within, profiler_library, spawn_fixture, waiting_fixture, Fixture,
    Output,
};

fn memfd_pool() -> Fixture {
    c_fixture("memfd_pool.c", &[])
}

/// The fixture running, killed on drop.
struct Running {
    child: Child,
    pid: u32,
}

impl Running {
    /// Starts `fixture` under `library` with `args`, once it says `ready pid=PID`.
    fn start(fixture: &Fixture, library: &Path, args: &[&Path]) -> Running {
        let mut child = spawn_fixture(waiting_fixture(fixture, library).args(args), fixture);
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no `ready` line from {}: {line:?}", fixture.bin.display()));
        Running { child, pid }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mem-trace ARGS`, within `timeout`, logs next to the fixture.
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str], timeout: Duration) -> Output {
    mem_trace_within(fixture, label, args, timeout)
}

/// `mem-trace ARGS` succeeded: its stdout.
fn answer(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let out = mem_trace(fixture, label, args, Duration::from_secs(120));
    assert!(out.success(), "{}", out.describe());
    out.stdout
}

/// Every reading subcommand answers on `target` (a pid or a core); `top` names the fixture's
/// allocation site.
fn every_reader(fixture: &Fixture, label: &str, target: &str) {
    let top = answer(fixture, &format!("top-{label}"), &["top", target]);
    assert!(top.contains(" in hold_site at "), "{top}");
    for sub in ["info", "peaks", "leaks"] {
        answer(fixture, &format!("{sub}-{label}"), &[sub, target]);
    }
    for (sub, file) in [
        ("flamegraph", "flame.svg"),
        ("dhat", "dhat.json"),
        ("pprof", "heap.pb.gz"),
    ] {
        let out = fixture.dir.join(format!("{label}.{file}"));
        answer(
            fixture,
            &format!("{sub}-{label}"),
            &[sub, target, "-o", text(&out)],
        );
        assert!(
            fs::metadata(&out).is_ok_and(|m| m.len() > 0),
            "{sub}: no {}",
            out.display()
        );
    }
}

/// Replaces the file at `path` by a FIFO.
fn make_fifo(path: &Path) {
    let _ = fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A memfd pool mapped from its second half (the file at no offset 0, which readers that
/// assume a file maps from its start get wrong): every
/// reading subcommand reads the process, and its core, as any other; then the core, once the data file
/// it maps (left out of the core) and then the library have become FIFOs, answers or refuses
/// in one line within a second instead of waiting for a writer.
#[test]
fn a_memfd_pool_read_live_and_from_its_core_then_fifos() {
    let f = memfd_pool();
    let library = f.dir.join("libmem_trace.so");
    let data = f.dir.join("mapped.dat");
    // The FIFOs of an earlier run: writing to them would wait for a reader.
    let _ = fs::remove_file(&library);
    let _ = fs::remove_file(&data);
    fs::copy(profiler_library(), &library).expect("copy the library");
    fs::write(&data, vec![7u8; 8192]).expect("write the data file");
    let core = f.dir.join("memfd_pool.core");
    {
        let running = Running::start(&f, &library, &[&data]);
        let pid = running.pid.to_string();
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.lines()
                .any(|l| l.ends_with("/memfd:pool (deleted)") && l.contains(" 00008000 ")),
            "{maps}"
        );
        every_reader(&f, "live", &pid);
        gcore(running.pid, &core, &f.dir.join("gcore"));
    }
    every_reader(&f, "core", text(&core));
    let info = answer(&f, "info-core", &["info", text(&core)]);

    make_fifo(&data);
    let out = mem_trace(
        &f,
        "info-fifo-data",
        &["info", text(&core)],
        Duration::from_secs(10),
    );
    assert!(
        out.success() && out.stdout == info && out.elapsed < Duration::from_secs(1),
        "{}",
        out.describe()
    );

    make_fifo(&library);
    let out = mem_trace(
        &f,
        "info-fifo-lib",
        &["info", text(&core)],
        Duration::from_secs(10),
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        !out.success()
            && out.stdout.is_empty()
            && lines.len() == 1
            && lines[0].starts_with("mem-trace: ")
            && lines[0].contains(text(&library))
            && lines[0].contains("not a regular")
            && out.elapsed < Duration::from_secs(1),
        "{}",
        out.describe()
    );
    let _ = fs::remove_file(&core);
}

/// A symlink at the victim's expense: `victim` holds text, `link` points at it.
fn symlink_to_victim(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let victim = dir.join(format!("{name}.victim"));
    let link = dir.join(name);
    let _ = fs::remove_file(&link);
    fs::write(&victim, "not yours\n").unwrap();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    (victim, link)
}

/// `-o` naming a symlink (writing through it would let a link planted in a shared directory
/// overwrite any file of the user's): refused in one line, the link and its target untouched;
/// an existing regular file is replaced, and no temporary file is left beside it.
#[test]
fn output_onto_a_symlink_is_refused() {
    let f = memfd_pool();
    let dir = f.dir.join("outputs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let folded = dir.join("stacks.folded");
    fs::write(&folded, "main;hold_site 4096\nmain;other 100\n").unwrap();
    let (victim, link) = symlink_to_victim(&dir, "out.svg");
    let out = mem_trace(
        &f,
        "flamegraph-onto-link",
        &[
            "flamegraph",
            "--from-folded",
            text(&folded),
            "-o",
            text(&link),
        ],
        Duration::from_secs(60),
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        !out.success()
            && lines.len() == 1
            && lines[0].starts_with("mem-trace: cannot write ")
            && lines[0].contains("symbolic link"),
        "{}",
        out.describe()
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "not yours\n");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    let plain = dir.join("plain.svg");
    fs::write(&plain, "old\n").unwrap();
    answer(
        &f,
        "flamegraph-over-file",
        &[
            "flamegraph",
            "--from-folded",
            text(&folded),
            "-o",
            text(&plain),
        ],
    );
    assert!(fs::read_to_string(&plain).unwrap().contains("hold_site"));
    let left: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `MEM_TRACE_OUT` and `mem-trace run -o` with symlinks where their files go (a planted link
/// must not make the library or the command write elsewhere): the
/// library passes a report name taken by a symlink over (dangling or not), the command writes
/// no leak section through one, and no target is touched or made.
#[test]
fn run_outputs_never_go_through_a_symlink() {
    let f = memfd_pool();
    let dir = f.dir.join("run-outputs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    fs::write(&victim, "not yours\n").unwrap();
    let missing = dir.join("missing");
    // The program is a shell that plants the links under its own pid, which the exec'd
    // fixture keeps, then becomes the fixture (end of input at once: it exits, with a report).
    let plant = r#"d="$1"; shift
ln -s "$d/victim" "$d/mem-trace.$$.1.txt"
ln -s "$d/missing" "$d/mem-trace.$$.2.txt"
ln -s "$d/missing" "$d/mem-trace.$$.3.leaks.txt"
exec "$@" </dev/null"#;
    let out = mem_trace(
        &f,
        "run-onto-links",
        &[
            "run",
            "-o",
            text(&dir),
            "--",
            "sh",
            "-c",
            plant,
            "sh",
            text(&dir),
            text(&f.bin),
        ],
        Duration::from_secs(120),
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "not yours\n");
    assert!(!missing.exists(), "{}", out.describe());
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let report = names
        .iter()
        .find(|n| n.ends_with(".3.txt"))
        .unwrap_or_else(|| {
            panic!(
                "no report 3 beside the links: {names:?}\n{}",
                out.describe()
            )
        });
    let text = fs::read_to_string(dir.join(report)).unwrap();
    assert!(
        text.contains("(at exit)") && text.contains("leak check"),
        "{text}"
    );
}
