//! `print_trace` from gdb against the real tracer: every hooked function's block
//! shows its size, its allocating function and file:line; interior addresses name the block
//! and the offset; untracked addresses get one line. The expectations are the `gdb-check`
//! comments in the fixtures, with line numbers taken from their `// @name` markers.

mod common;

use common::{c_fixture, run_gdb_script, rust_fixture};

/// `call mem_trace::print_trace(p)` from a C frame, one block per hooked function.
#[test]
fn each_hooked_function_is_traced_from_a_c_frame() {
    run_gdb_script(&c_fixture("hooks.c", &[]), "");
}

/// The fallback spelling `call (void)print_trace(p)`, through the plain exported symbol.
#[test]
fn the_plain_symbol_spelling_works_from_a_c_frame() {
    run_gdb_script(&c_fixture("hooks.c", &[]), "void");
}

/// `call mem_trace::print_trace(addr)` from a Rust frame. gdb resolves that path only while
/// the exported function's body has no closure or nested item: rustc would emit a debug-info
/// namespace of the same name, and gdb would fail with "Type mem_trace::print_trace is not a
/// tuple struct".
#[test]
fn rust_blocks_are_traced_from_a_rust_frame() {
    run_gdb_script(&rust_fixture("rust_frames.rs"), "print-trace");
}

/// The documented fallback for Rust frames: `set language c` and `call (void)print_trace(p)`.
#[test]
fn the_c_language_fallback_works_from_a_rust_frame() {
    run_gdb_script(&rust_fixture("rust_frames.rs"), "print-trace-c");
}

/// A `print_trace` that gdb stopped inside (a breakpoint on its `write`) is abandoned; the
/// next one on the same thread answers in full instead of saying another thread is busy.
#[test]
fn a_call_abandoned_at_a_breakpoint_does_not_block_the_next() {
    run_gdb_script(&c_fixture("print_limits.c", &[]), "abandoned");
}

/// Under an address-space limit that refuses the 1 GiB scratch reservation, a smaller one
/// serves: frames are still symbolized.
#[test]
fn symbolizes_under_an_address_space_limit() {
    run_gdb_script(&c_fixture("print_limits.c", &[]), "limited");
}
