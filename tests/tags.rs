//! Profile mode's block tags against the real tracer: every path a tagged block takes through
//! the malloc family keeps glibc's semantics (the program's output equals a plain run's),
//! with tags and with `MEM_TRACE_TAGS=0`; a bad free inside a tagged block is reported and
//! withheld; `print_trace` finds a tagged block from any of its bytes and nothing from its
//! tag. The expectations are the directives of tests/fixtures/tags.c.

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
fn every_block_in_the_table_keeps_them_too() {
    fixture_run(&fixture(), "table").run_same_as_plain();
}

#[test]
fn a_free_inside_a_tagged_block_is_reported_and_withheld() {
    fixture_run(&fixture(), "invalid").run();
    fixture_run(&fixture(), "invalid-table").run();
}

#[test]
fn print_trace_finds_a_tagged_block_from_any_of_its_bytes() {
    run_gdb_script(&fixture(), "gdb");
}
