//! The profiler build's in-process reports, from real runs of `tests/fixtures/profile_sites.c`
//! (and `rust_frames.rs`) under `{profiler_so}`: the periodic report, the exit report with its
//! peaks and leak check, the reset, the snapshot signal, `_exit`, `MEM_TRACE_OUT`, bad values.
//! The fixtures' scripts hold the line-by-line expectations; the numbers that may move a
//! little (peaks) are checked here, within 1%.

mod common;

use common::{
    c_fixture, fixture_run, library, profiler_library, run_with_timeout, rust_fixture, Job,
};
use std::fs;
use std::path::Path;
use std::process::Command;

fn sites() -> common::Fixture {
    c_fixture("profile_sites.c", &["-lpthread", "-ldl"])
}

/// The reports in `stderr`, split at their header lines, with their kind.
fn reports(stderr: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in stderr.lines() {
        if line.starts_with("mem-trace: report ") {
            let kind = line
                .split_once('(')
                .and_then(|(_, r)| r.split_once(')'))
                .map_or("", |(k, _)| k)
                .to_string();
            out.push((kind, String::new()));
        }
        if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// The number after `prefix` on the first line of `text` that starts with it.
fn number_after(text: &str, prefix: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"));
    line.trim_start()[prefix.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .expect("a number")
        .parse()
        .unwrap()
}

fn within_1_percent(got: u64, want: u64, what: &str, text: &str) {
    let diff = got.abs_diff(want) as f64 / want as f64;
    assert!(
        diff <= 0.01,
        "{what}: {got}, expected {want} within 1%\n{text}"
    );
}

/// The last periodic report, after the sites: the holding site last as `# 0:` with its bytes,
/// and the churn site nowhere (it holds nothing live).
#[test]
fn periodic_report_ranks_by_live_bytes() {
    let out = fixture_run(&sites(), "periodic").run();
    let all = reports(&out.stderr);
    let periodic: Vec<_> = all.iter().filter(|(k, _)| k == "periodic").collect();
    assert!(periodic.len() >= 2, "{}", out.describe());
    let last = &periodic.last().unwrap().1;
    within_1_percent(number_after(last, "# 0: "), 67108864, "# 0", last);
    let tail: Vec<&str> = last.lines().rev().take(12).collect();
    assert!(
        tail.iter().any(|l| l.trim() == "0: hold_site"),
        "hold_site is not the last stack:\n{last}"
    );
    assert!(
        !last.contains("churn_site"),
        "churn_site ranked by live:\n{last}"
    );
    assert!(
        !out.stderr.contains("(at exit)"),
        "MEM_TRACE_LEAKS=0 wrote an exit report"
    );
}

/// Reports are a run-time switch: the default build writes none unless `MEM_TRACE_PROFILE=1`,
/// and the profiler build none with `MEM_TRACE_PROFILE=0`.
#[test]
fn reports_are_switched_at_run_time() {
    fixture_run(&sites(), "default-quiet").run();
    fixture_run(&sites(), "default-switched-on").run();
    fixture_run(&sites(), "profiler-switched-off").run();
}

#[test]
fn allocated_ranks_the_churn_first() {
    fixture_run(&sites(), "allocated").run();
}

/// The exit report: global and per-thread peaks within 1%, and the leak check (the script:
/// leak_site's 100 blocks definitely lost, hold_site's and kept_site's still reachable).
#[test]
fn exit_report_peaks_and_leaks() {
    let out = fixture_run(&sites(), "leaks").run();
    let text = &reports(&out.stderr)[0].1;
    // The thread runs after the hold: 64 MiB held + its 128 KiB array + the thread's 8 MiB.
    within_1_percent(
        number_after(text, "mem-trace: global peak: "),
        67108864 + 131072 + 8388608,
        "global peak",
        text,
    );
    // The main thread's own: the hold and its array, and one churn block at a time.
    let main = text
        .lines()
        .find(|l| l.trim_start().starts_with("thread 1 (tid"))
        .expect("thread 1's line");
    within_1_percent(
        number_after(main.split_once("): ").unwrap().1, "peak "),
        67108864 + 131072 + (1 << 20),
        "thread 1's peak",
        text,
    );
    let worker = text
        .lines()
        .find(|l| l.trim_start().starts_with("thread 2 (tid"))
        .expect("thread 2's line");
    within_1_percent(
        number_after(worker.split_once("): ").unwrap().1, "peak "),
        8388608,
        "thread 2's peak",
        text,
    );
}

/// `mem_trace_reset_peaks()` between the phases: the peak at exit is phase 2's (8 MiB in
/// blocks and their 16 KiB array), not phase 1's 32 MiB.
#[test]
fn reset_makes_the_second_phase_peak_its_own() {
    let out = fixture_run(&sites(), "reset").run();
    let text = &reports(&out.stderr)[0].1;
    within_1_percent(
        number_after(text, "mem-trace: global peak: "),
        (8 << 20) + (8 << 20) / 4096 * 8,
        "global peak after the reset",
        text,
    );
}

/// 100 snapshot signals while four threads allocate: a full report, no hang nor crash, and the
/// program's own output the same as without the profiler.
#[test]
fn snapshot_signal_during_a_busy_loop() {
    let f = sites();
    let run = fixture_run(&f, "snapshot");
    let traced = run.run();
    let plain = Job {
        args: vec!["busy".into()],
        ..Job::fixture(&f)
    }
    .run(false);
    assert!(plain.success(), "{}", plain.describe());
    assert_eq!(plain.stdout, traced.stdout, "{}", traced.describe());
    let snapshots = reports(&traced.stderr);
    assert!(
        !snapshots.is_empty() && snapshots.iter().all(|(k, _)| k == "snapshot"),
        "{}",
        traced.describe()
    );
}

/// A program that installs its own handler for the snapshot signal keeps the signal.
#[test]
fn own_handler_keeps_the_signal() {
    fixture_run(&sites(), "own-handler").run();
}

/// A forked child gets its own profiler thread (the parent's is not inherited).
#[test]
fn forked_child_reports_on_its_own() {
    fixture_run(&sites(), "fork").run();
}

#[test]
fn underscore_exit_gives_no_report() {
    fixture_run(&sites(), "underscore-exit").run();
}

#[test]
fn bad_values_are_named_and_defaulted() {
    fixture_run(&sites(), "bad-values").run();
}

/// `MEM_TRACE_OUT=DIR`: one file per report, `mem-trace.<pid>.<n>.txt`, an existing file never
/// overwritten. The program runs through `sh -c 'touch ...; exec ...'`, so its pid is the
/// shell's and the file it must not clobber can be made first.
#[test]
fn out_dir_gets_numbered_files_and_never_clobbers() {
    let f = sites();
    let dir = f.dir.join("reports");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        // Two seconds for two periodic reports: each also makes its pprof profile (the binary
        // is beside the library), a read of the process that takes ~150 ms, more on a
        // loaded machine, before the reporter's next interval starts.
        .arg(r#"echo mine > "$1/mem-trace.$$.1.txt" && exec "$2" sleep 2000"#)
        .arg("sh")
        .arg(&dir)
        .arg(&f.bin)
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_PROFILE_INTERVAL", "0.5")
        .env("MEM_TRACE_OUT", &dir);
    let out = run_with_timeout(
        cmd,
        &f.dir.join("out-dir"),
        false,
        None,
        common::RUN_TIMEOUT,
        "profile_sites sleep under MEM_TRACE_OUT",
    );
    assert!(out.success(), "{}", out.describe());
    assert!(
        !out.stderr.contains("mem-trace: report"),
        "{}",
        out.describe()
    );
    // The reports only: the .folded and .svg beside each are checked by tests/cli_run.rs.
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    names.sort();
    let pid = names[0].split('.').nth(1).unwrap().to_string();
    let file = |n: u32| dir.join(format!("mem-trace.{pid}.{n}.txt"));
    assert_eq!(fs::read_to_string(file(1)).unwrap(), "mine\n", "{names:?}");
    // At least two periodic reports and the exit report, numbered from 2 on.
    assert!(names.len() >= 4, "{names:?}");
    for n in 2..names.len() as u32 + 1 {
        let text = fs::read_to_string(file(n)).unwrap_or_else(|e| panic!("{n}: {e} {names:?}"));
        assert!(text.starts_with("mem-trace: report "), "{n}: {text}");
    }
    let last = fs::read_to_string(file(names.len() as u32)).unwrap();
    assert!(
        last.contains("(at exit)") && last.contains("leak check"),
        "{last}"
    );
}

/// A Rust program's frames: Rust paths and file:line (the exit report ranked by bytes
/// allocated, since the program frees its blocks before exiting).
#[test]
fn rust_frames_are_named_with_rust_paths() {
    fixture_run(&rust_fixture("rust_frames.rs"), "profile").run();
}

/// A library and the settings it runs with, named for the logs.
type Setting = (
    &'static str,
    &'static Path,
    &'static [(&'static str, &'static str)],
);

/// The libraries and settings under which the library runs a thread of its own in the
/// program (its reporter): the profiler build as it starts; the default build with reports
/// switched on, as `mem-trace run` does; and that with sampling and a report every 50 ms.
fn with_our_thread() -> [Setting; 3] {
    [
        ("profiler", profiler_library(), &[]),
        ("profile-on", library(), &[("MEM_TRACE_PROFILE", "1")]),
        (
            "sampled",
            library(),
            &[
                ("MEM_TRACE_PROFILE", "1"),
                ("MEM_TRACE_SAMPLE", "4096"),
                ("MEM_TRACE_PROFILE_INTERVAL", "0.05"),
            ],
        ),
    ]
}

/// Runs `job` plain, then under each of [`with_our_thread`]; every run must succeed with the
/// plain run's stdout. Needs root: the programs drop root's privileges.
fn same_as_plain_with_our_thread(job: Job) -> Vec<common::Output> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "{}: the test drops root's privileges: run it as root, as .ci/run does",
        job.label
    );
    let plain = job.run(false);
    assert!(plain.success(), "fails even plain:\n{}", plain.describe());
    let mut outs = Vec::new();
    for (name, lib, settings) in with_our_thread() {
        let mut traced = job.clone();
        traced
            .env
            .push(("LD_PRELOAD".into(), lib.display().to_string()));
        traced.env.push(("MEM_TRACE_LEAKS".into(), "0".into()));
        traced
            .env
            .extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        traced.label = format!("{}.{name}", job.label);
        let out = traced.run(false);
        assert!(
            out.success() && out.stdout == plain.stdout,
            "not as plain under {name}:\n{}----- plain -----\n{}",
            out.describe(),
            plain.describe()
        );
        outs.push(out);
    }
    outs
}

/// `setpriv` keeps its capabilities across setresuid and raises them again in its own thread
/// only, then calls setresgid: our reporter thread, asked by glibc to change its gid too,
/// must not be left without them (glibc aborts the whole program when one thread fails), whichever
/// build or setting started it.
#[test]
fn setpriv_drops_privileges_under_the_profiler() {
    let f = c_fixture("credentials.c", &["-pthread"]);
    let mut job = Job::new("setpriv", "setpriv");
    job.args = ["--reuid=65534", "--regid=65534", "--clear-groups", "id"]
        .map(String::from)
        .to_vec();
    job.log_dir = Some(f.dir.clone());
    job.cwd = Some(f.dir.clone());
    job.no_core_dump = true;
    same_as_plain_with_our_thread(job);
}

/// The same sequence as setpriv's in a C program, and setgroups, setresgid and setresuid with
/// the program's threads running: every thread, ours too, ends with the new credentials, and
/// our thread is there again after the changes, under each of [`with_our_thread`].
#[test]
fn credential_changes_under_the_profiler() {
    let f = c_fixture("credentials.c", &["-pthread"]);
    for mode in ["keepcaps", "threads"] {
        let mut job = Job::fixture(&f);
        job.args = vec![mode.to_string()];
        job.label = format!("credentials-{mode}");
        for out in same_as_plain_with_our_thread(job) {
            assert!(
                out.stderr.contains("profiler thread: there"),
                "{}",
                out.describe()
            );
        }
    }
}
