//! C++ programs under the tracer: objects made with `new`, a `std::vector`'s buffer and a
//! `std::string`'s buffer are each one block of the right size, explained by `mtrace-why` and
//! `print_trace` through libstdc++'s `operator new` down to the function that wrote `new`
//! (issue 2: "C++ operator new/delete reach us through libstdc++'s malloc: count each block
//! once"). The gdb script and its checks are in `tests/fixtures/cpp_new.cpp`.

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{cpp_fixture, Job};

#[test]
fn new_vector_and_string_are_one_block_each_explained_below_operator_new() {
    gdb(&with_entry_script(cpp_fixture("cpp_new.cpp")), "");
}

#[test]
fn cpp_program_output_is_unchanged_by_the_preload() {
    let traced = Job::fixture(&cpp_fixture("cpp_new.cpp")).assert_same_with_preload();
    assert!(traced.stdout == "7 300 100 0 x\n", "{}", traced.describe());
    assert!(traced.stderr.is_empty(), "{}", traced.describe());
}
