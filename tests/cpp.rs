//! C++ programs under the tracer: objects made with `new`, a `std::vector`'s buffer and a
//! `std::string`'s buffer are each one block of the right size, explained by `mtrace-why` and
//! `print_trace` through libstdc++'s `operator new` down to the function that wrote `new`.
//! `operator new` and `delete` reach the tracer through libstdc++'s `malloc` and `free`, so
//! each block must be counted once, not once per layer. The gdb script, the direct run and
//! their checks are in `tests/fixtures/cpp_new.cpp`.

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{cpp_fixture, fixture_run};

#[test]
fn new_vector_and_string_are_one_block_each_explained_below_operator_new() {
    gdb(&with_entry_script(cpp_fixture("cpp_new.cpp")), "");
}

#[test]
fn cpp_program_output_is_unchanged_by_the_preload() {
    fixture_run(&cpp_fixture("cpp_new.cpp"), "output").run_same_as_plain();
}
