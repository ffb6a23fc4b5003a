//! Block tags against the real tracer: every path a tagged block takes through the malloc
//! family keeps glibc's semantics (the program's output equals a plain run's), with profile
//! mode's short tags, debug mode's long ones (quarantine and history) and `MEM_TRACE_TAGS=0`;
//! a bad free inside a tagged block and a double free of one are reported and withheld;
//! `print_trace` finds a tagged block from any of its bytes and nothing from its tag, and in
//! debug mode a freed one's free and allocation. The expectations are the directives of
//! tests/fixtures/tags.c.

mod common;

use common::{c_fixture, fixture_run, run_gdb_script};

fn fixture() -> common::Fixture {
    c_fixture("tags.c", &["-pthread"])
}

#[test]
fn tagged_blocks_keep_glibc_semantics() {
    fixture_run(&fixture(), "").run_same_as_plain();
}

#[test]
fn debug_modes_long_tags_with_quarantine_and_history_keep_them() {
    fixture_run(&fixture(), "debug").run_same_as_plain();
}

#[test]
fn every_block_in_the_table_keeps_them_too() {
    fixture_run(&fixture(), "table").run_same_as_plain();
}

#[test]
fn a_free_inside_a_tagged_block_is_reported_and_withheld() {
    fixture_run(&fixture(), "invalid").run();
    fixture_run(&fixture(), "invalid-table").run();
    fixture_run(&fixture(), "invalid-debug").run();
}

#[test]
fn a_tagged_block_freed_twice_from_the_quarantine_is_reported_and_withheld() {
    fixture_run(&fixture(), "double-debug").run();
}

#[test]
fn print_trace_finds_a_tagged_block_from_any_of_its_bytes() {
    run_gdb_script(&fixture(), "gdb");
}

/// Debug mode: a tagged block's sequence number, and a freed one's free and allocation
/// stacks, from the history.
#[test]
fn debug_mode_answers_for_live_and_freed_tagged_blocks() {
    run_gdb_script(&common::mtrace::with_entry_script(fixture()), "gdb-debug");
}
