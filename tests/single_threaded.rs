//! Programs that must be single-threaded for what they do: `unshare(CLONE_NEWUSER)` and
//! `setns` into a user namespace (refused by the kernel to a process with two threads), a
//! forked child that counts its threads first (as Chromium's zygote does), `clone` into a new
//! user namespace; then bubblewrap and headless Chromium under `mem-trace run`. Each does
//! under the tracer, with its profiler thread's work on (periodic reports, `run`'s requests),
//! what it does without it (tests/fixtures/single_threaded.c).

mod common;

use common::{
    c_fixture, mem_trace_binary, mem_trace_within, profiler_library, run_with_timeout, scratch_dir,
    Fixture, Job, Output,
};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn fixture() -> Fixture {
    c_fixture("single_threaded.c", &[])
}

/// The fixture in `mode`, plain then preloaded with reports every 0.1 s and run's requests
/// on: both succeed with the same output, which is returned.
fn same_with_the_thread(mode: &str) -> String {
    let f = fixture();
    let out = f.dir.join(format!("out-{mode}"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut job = Job::fixture(&f);
    job.label = format!("single_threaded-{mode}");
    job.args = vec![mode.to_string()];
    job.env = [
        ("MEM_TRACE_PROFILE", "1"),
        ("MEM_TRACE_PROFILE_INTERVAL", "0.1"),
        ("MEM_TRACE_LEAKS", "0"),
        ("MEM_TRACE_REQUESTS", "1"),
        ("MEM_TRACE_OUT", out.to_str().unwrap()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    job.assert_same_with_preload().stdout
}

/// `mem-trace run -o DIR PROGRAM ARGS` within `timeout`, in `fixture`'s directory.
fn under_run(f: &Fixture, label: &str, program: &[&str], timeout: Duration) -> Output {
    let out = format!("out-run-{label}");
    let _ = std::fs::remove_dir_all(f.dir.join(&out));
    let mut args = vec!["run", "-o", &out, "--"];
    args.extend_from_slice(program);
    mem_trace_within(f, &format!("run-{label}"), &args, timeout)
}

#[test]
fn unshare_into_a_user_namespace_succeeds_with_the_thread_there() {
    assert_eq!(same_with_the_thread("unshare"), "unshare ok\n");
}

#[test]
fn unshare_succeeds_under_run() {
    profiler_library();
    let f = fixture();
    let bin = f.bin.to_str().unwrap();
    let out = under_run(&f, "unshare", &[bin, "unshare"], Duration::from_secs(60));
    assert!(out.success(), "{}", out.describe());
    assert_eq!(out.stdout, "unshare ok\n", "{}", out.describe());
}

/// The child counts its threads before it allocates: one, ours not made yet; then it unshares.
#[test]
fn a_forked_child_finds_itself_alone() {
    assert_eq!(
        same_with_the_thread("fork-alone"),
        "child tasks 1 links 3 unshare ok\nparent ok\n"
    );
}

#[test]
fn a_forked_child_finds_itself_alone_under_run() {
    let f = fixture();
    let bin = f.bin.to_str().unwrap();
    let out = under_run(
        &f,
        "fork-alone",
        &[bin, "fork-alone"],
        Duration::from_secs(60),
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(
        out.stdout,
        "child tasks 1 links 3 unshare ok\nparent ok\n",
        "{}",
        out.describe()
    );
}

#[test]
fn setns_into_a_user_namespace_succeeds_with_the_thread_there() {
    assert_eq!(same_with_the_thread("setns"), "setns ok\n");
}

#[test]
fn clone_into_a_user_namespace_succeeds_with_the_thread_there() {
    assert_eq!(same_with_the_thread("clone"), "clone child ok\nclone ok\n");
}

/// `PROGRAM ARGS` plain, within `timeout`, its logs in `dir` as `LABEL.plain.*`.
fn plain(dir: &Path, label: &str, program: &[&str], timeout: Duration) -> Output {
    let mut cmd = Command::new(program[0]);
    cmd.args(&program[1..])
        .current_dir(dir)
        .env_remove("LD_PRELOAD");
    run_with_timeout(
        cmd,
        &dir.join(format!("{label}.plain")),
        false,
        None,
        timeout,
        label,
    )
}

/// The first of `names` found in `PATH`.
fn installed(names: &[&str]) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}

/// bubblewrap makes its sandbox in a new user namespace: under `run` it ends as it does
/// without.
#[test]
fn bubblewrap_under_run_ends_as_without() {
    let Some(bwrap) = installed(&["bwrap"]) else {
        eprintln!("skipped: bwrap is not installed (Debian's bubblewrap; .ci/run installs it)");
        return;
    };
    let f = fixture();
    let program = [
        bwrap.as_str(),
        "--unshare-user",
        "--ro-bind",
        "/",
        "/",
        "--",
        f.bin.to_str().unwrap(),
        "unshare",
    ];
    let timeout = Duration::from_secs(60);
    let without = plain(&f.dir, "bwrap", &program, timeout);
    let with = under_run(&f, "bwrap", &program, timeout);
    assert_eq!(
        with.status.code(),
        without.status.code(),
        "{}\n{}",
        without.describe(),
        with.describe()
    );
    assert_eq!(with.stdout, without.stdout, "{}", with.describe());
}

/// Headless Chromium, whose zygote (`exec`'d by the browser with the library inherited)
/// aborts unless `/proc/self/task` has one entry: under `run` it prints the same DOM.
#[test]
fn chromium_dumps_the_same_dom_under_run() {
    let Some(chromium) = installed(&["chromium", "chromium-browser"]) else {
        eprintln!("skipped: chromium is not installed (.ci/run installs it)");
        return;
    };
    mem_trace_binary();
    let d = scratch_dir("single_threaded", "chromium");
    let page = d.join("page.html");
    std::fs::write(
        &page,
        "<html><body><p id=x>static</p>\
         <script>document.getElementById('x').textContent = 'scripted'</script></body></html>",
    )
    .unwrap();
    let url = format!("file://{}", page.display());
    let timeout = Duration::from_secs(25);
    let dom = |label: &str, run: bool| {
        let profile = d.join(format!("profile-{label}"));
        let user_data = format!("--user-data-dir={}", profile.display());
        let program = [
            chromium.as_str(),
            "--headless",
            // As root, the sandbox refuses to start; the zygote is made all the same.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &user_data,
            "--dump-dom",
            &url,
        ];
        if !run {
            return plain(&d, label, &program, timeout);
        }
        let mut args = vec!["run", "-o", "out", "--"];
        args.extend_from_slice(&program);
        let mut cmd = Command::new(mem_trace_binary());
        cmd.args(&args).current_dir(&d);
        run_with_timeout(
            cmd,
            &d.join(format!("{label}.run")),
            false,
            None,
            timeout,
            label,
        )
    };
    let without = dom("plain", false);
    assert!(without.success(), "{}", without.describe());
    assert!(
        without.stdout.contains("scripted"),
        "{}",
        without.describe()
    );
    let with = dom("run", true);
    assert!(with.success(), "{}", with.describe());
    assert_eq!(with.stdout, without.stdout, "{}", with.describe());
}
