//! With the `bundle` feature: builds the preload library (crates/preload) and the reader gdb's
//! commands answer through (crates/gdb), and leaves them in `$OUT_DIR/libmem_trace.so` and
//! `$OUT_DIR/libmem_trace_reader.so` for `src/run/bundled.rs` to carry, with a hash of both in
//! `MEM_TRACE_BUNDLE_ID`. Without the feature: nothing.
//!
//! The library is built by a nested `cargo build --release` into a target directory of its
//! own under `$OUT_DIR`: the outer build holds the lock of its own target directory for as
//! long as it runs, so a nested build there would wait for it forever.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_BUNDLE");
    if env::var_os("CARGO_FEATURE_BUNDLE").is_none() {
        return;
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    // Rebuilt when the library's sources change: every crate it is made of, and the gdb
    // commands it embeds, named file by file (a named directory is scanned recursively, and
    // Python writes `__pycache__` there on every import).
    for dir in [
        "src",
        "build.rs",
        "crates/core",
        "crates/format",
        "crates/read",
        "crates/preload",
        "crates/gdb",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    python_sources(&root.join("python/mem_trace_gdb"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target = out.join("preload-target");
    let library = build(
        &root.join("crates/preload/Cargo.toml"),
        &target,
        "libmem_trace.so",
    );
    let reader = build(
        &root.join("crates/gdb/Cargo.toml"),
        &target,
        "libmem_trace_reader.so",
    );
    for (name, bytes) in [
        ("libmem_trace.so", &library),
        ("libmem_trace_reader.so", &reader),
    ] {
        std::fs::write(out.join(name), bytes)
            .unwrap_or_else(|e| panic!("cannot write {name} to {}: {e}", out.display()));
    }
    let id = fnv1a(&library) ^ fnv1a(&reader).rotate_left(1);
    println!("cargo:rustc-env=MEM_TRACE_BUNDLE_ID={id:016x}");
}

/// `cargo build --release --lib` of the package `manifest` into `target`; the bytes of the
/// library `file` it built.
fn build(manifest: &std::path::Path, target: &std::path::Path, file: &str) -> Vec<u8> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--lib", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target);
    if env::var_os("CARGO_NET_OFFLINE").is_some_and(|v| v == "true") {
        cmd.arg("--offline");
    }
    // The outer build's target directory is not ours to use.
    cmd.env_remove("CARGO_TARGET_DIR");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the bundled {file}: {e}"));
    assert!(
        status.success(),
        "building the bundled {file} failed ({status})"
    );
    let built = target.join("release").join(file);
    std::fs::read(&built).unwrap_or_else(|e| panic!("cannot read {}: {e}", built.display()))
}

/// `rerun-if-changed` for every `.py` file under `dir`.
fn python_sources(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "__pycache__") {
                python_sources(&path);
            }
        } else if path.extension().is_some_and(|e| e == "py") {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// FNV-1a, 64 bits: enough to tell two builds apart, with no dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
