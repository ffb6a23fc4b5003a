//! The front doors a user finds first, each through cargo as a user types it (a door that only
//! works from the test harness's own build is one the user meets closed):
//! - `cargo build --release` at the root, then `mem-trace run`, `mem-trace gdb` (`mtrace-why`)
//!   and `mem-trace top PID` on a process started under the library it built (the default
//!   build, no feature);
//! - a Rust crate depending on `mem-trace` with `features = ["global-alloc"]` and its default
//!   features on: it links with its own `#[global_allocator]`, runs, and `mtrace-why` names its
//!   allocating function;
//! - `cargo install --path crates/cli --features bundle` into a temporary root, then that
//!   `mem-trace run` with no library beside it.
//!
//! Slow (each runs cargo): they share target directories with the rest of the suite and build
//! offline from the workspace's lock file.

mod common;

use common::{manifest_dir, run_with_timeout, target_dir, Output, GDB_TIMEOUT, RUN_TIMEOUT};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// One cargo invocation of this file at a time (they share target directories).
static CARGO: Mutex<()> = Mutex::new(());

/// A cargo build is given this long (a first build of the workspace on two cores).
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("onebuild", name)
}

fn cargo() -> Command {
    let _ = &CARGO;
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs `cmd` (a build) with the build timeout, logs in `dir/label.*`; asserts success.
fn build(cmd: Command, dir: &Path, label: &str) -> Output {
    let out = run_with_timeout(cmd, &dir.join(label), false, None, BUILD_TIMEOUT, label);
    assert!(out.success(), "{}", out.describe());
    out
}

/// A C program that allocates 100 blocks from `grow`, calls `break_here`, prints `ready` and
/// sleeps when given an argument, and exits at once (leaking them) otherwise.
fn c_program(dir: &Path) -> PathBuf {
    let src = dir.join("held.c");
    fs::write(
        &src,
        r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
void *kept[100];
__attribute__((noinline)) void grow(int i) { kept[i] = malloc(1000); }
__attribute__((noinline)) void break_here(void) { __asm__ volatile(""); }
int main(int argc, char **argv) {
    for (int i = 0; i < 100; i++) grow(i);
    break_here();
    if (argc > 1) { printf("ready\n"); fflush(stdout); sleep(60); }
    return 0;
}
"#,
    )
    .unwrap();
    let bin = dir.join("held");
    let st = Command::new("gcc")
        .args(["-g", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    bin
}

/// `mem-trace run -o out PROGRAM` in `dir` with `binary`, `env` on top; asserts the exit
/// report's leak check names `grow`'s 100 blocks.
fn run_reports_grow(binary: &Path, dir: &Path, program: &Path, env: &[(&str, &Path)]) {
    let mut cmd = Command::new(binary);
    cmd.args(["run", "-o", "out"]).arg(program).current_dir(dir);
    cmd.env_remove("MEM_TRACE_LIB");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(
        cmd,
        &dir.join("run"),
        false,
        None,
        RUN_TIMEOUT,
        "mem-trace run",
    );
    assert!(out.success(), "{}", out.describe());
    let leaks: Vec<_> = fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".leaks.txt"))
        .collect();
    assert_eq!(leaks.len(), 1, "{}", out.describe());
    let text = fs::read_to_string(&leaks[0]).unwrap();
    assert!(
        text.contains("# 0: 100000 bytes in 100 blocks") && text.contains("grow"),
        "{text}"
    );
}

#[test]
fn cargo_build_then_run_and_top() {
    let dir = scratch("build");
    let _lock = CARGO.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--offline"])
        .current_dir(manifest_dir())
        .env("CARGO_TARGET_DIR", target_dir());
    build(cmd, &dir, "cargo-build");
    drop(_lock);
    let release = target_dir().join("release");
    let binary = release.join("mem-trace");
    let lib = release.join("libmem_trace.so");
    let program = c_program(&dir);
    run_reports_grow(&binary, &dir, &program, &[]);

    // `mem-trace gdb` with the same build: the program under the library, mtrace-why loaded.
    let mut cmd = Command::new(&binary);
    cmd.args([
        "gdb",
        "-nx",
        "-batch",
        "-ex",
        "break break_here",
        "-ex",
        "run",
    ])
    .args(["-ex", "mtrace-why kept[7]", "--"])
    .arg(&program);
    let out = run_with_timeout(
        cmd,
        &dir.join("gdb"),
        true,
        None,
        GDB_TIMEOUT,
        "mem-trace gdb",
    );
    assert!(
        out.stdout.contains("is at the start of a 1000-byte block")
            && out.stdout.contains("in grow at"),
        "{}",
        out.describe()
    );

    // `top` on a process started by hand under the library.
    let mut child = Command::new(&program)
        .arg("wait")
        .env("LD_PRELOAD", &lib)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let mut cmd = Command::new(&binary);
    cmd.args(["top", &child.id().to_string()]);
    let out = run_with_timeout(cmd, &dir.join("top"), false, None, RUN_TIMEOUT, "top");
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stdout.contains("100000 bytes in 100 blocks") && out.stdout.contains("in grow at"),
        "{}",
        out.describe()
    );
}

#[test]
fn a_rust_dependency_with_global_alloc_and_default_features() {
    let dir = scratch("dependency");
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            r#"[package]
name = "uses_mem_trace"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
mem-trace = {{ path = {:?}, features = ["global-alloc"] }}

[profile.release]
debug = 2

[workspace]
"#,
            manifest_dir().display().to_string()
        ),
    )
    .unwrap();
    fs::write(
        dir.join("src/main.rs"),
        r#"#[global_allocator]
static ALLOC: mem_trace::Traced<std::alloc::System> = mem_trace::Traced::new(std::alloc::System);

#[inline(never)]
fn allocating_function() -> Vec<u8> {
    std::hint::black_box(vec![7u8; 4321])
}

#[inline(never)]
#[no_mangle]
extern "C" fn break_here(p: *const u8) {
    std::hint::black_box(p);
}

fn main() {
    let v = allocating_function();
    break_here(v.as_ptr());
    println!("done {}", v.len());
}
"#,
    )
    .unwrap();
    // The workspace's versions, so that an offline build resolves.
    fs::copy(manifest_dir().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let _lock = CARGO.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--offline", "--target-dir"])
        .arg(target_dir().join("traced-fixtures"))
        .current_dir(&dir)
        .env_remove("CARGO_TARGET_DIR");
    build(cmd, &dir, "cargo-build");
    drop(_lock);
    let bin = target_dir().join("traced-fixtures/release/uses_mem_trace");

    let out = Command::new(&bin).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done 4321\n");

    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex"])
        .arg(format!(
            "source {}",
            manifest_dir().join("gdb/mem_trace.py").display()
        ))
        .args([
            "-ex",
            "break *uses_mem_trace::break_here",
            "-ex",
            "run",
            "-ex",
            "mtrace-why $rdi",
        ])
        .arg(&bin)
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(cmd, &dir.join("gdb"), true, None, GDB_TIMEOUT, "gdb");
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stdout.contains("4321-byte block") && out.stdout.contains("allocating_function"),
        "{}",
        out.describe()
    );
}

#[test]
fn cargo_install_then_run_from_there() {
    let dir = scratch("install");
    let root = dir.join("root");
    let _lock = CARGO.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = cargo();
    cmd.args([
        "install",
        "--offline",
        "--locked",
        "--features",
        "bundle",
        "--path",
    ])
    .arg(manifest_dir().join("crates/cli"))
    .arg("--root")
    .arg(&root)
    .env("CARGO_TARGET_DIR", target_dir().join("install"));
    build(cmd, &dir, "cargo-install");
    drop(_lock);
    let binary = root.join("bin/mem-trace");
    assert!(!root.join("bin/libmem_trace.so").exists());
    let program = c_program(&dir);
    let cache = dir.join("cache");
    run_reports_grow(&binary, &dir, &program, &[("XDG_CACHE_HOME", &cache)]);
    // The library was written to the cache, under a directory named by its hash.
    let written: Vec<_> = fs::read_dir(cache.join("mem-trace"))
        .unwrap()
        .map(|e| e.unwrap().path().join("libmem_trace.so"))
        .collect();
    assert_eq!(written.len(), 1);
    assert!(written[0].is_file());
}
