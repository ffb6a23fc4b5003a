//! `malloc` and `free` with little stack left (`tests/fixtures/small_stacks.c`): a thread on a
//! 16 KiB stack allocating with 8 KiB left, and a signal handler on an 8 KiB alternate stack,
//! in a thread whose first allocator call it is. Each runs as it does without the tracer, and
//! with 8 KiB left the block still gets its allocation stack. Also signal handlers that leave
//! the allocator with `siglongjmp`.

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, fixture_run, Fixture};

fn fixture() -> Fixture {
    c_fixture("small_stacks.c", &["-pthread"])
}

#[test]
fn a_thread_with_8_kib_of_stack_left_allocates_as_without_the_tracer() {
    fixture_run(&fixture(), "deep").run_same_as_plain();
}

#[test]
fn a_handler_on_an_8_kib_alternate_stack_allocates_as_without_the_tracer() {
    fixture_run(&fixture(), "altstack").run_same_as_plain();
}

#[test]
fn blocks_allocated_with_little_stack_are_recorded_with_their_stacks() {
    gdb(&with_entry_script(fixture()), "");
}

/// A block a signal handler allocated has the frames the signal interrupted in its stack,
/// past the kernel's signal frame (`tests/fixtures/signal_frames.c`).
#[test]
fn stacks_go_on_through_the_signal_frame() {
    gdb(&with_entry_script(c_fixture("signal_frames.c", &[])), "");
}

/// A handler that allocates and leaves with `siglongjmp`, delivered inside glibc's `malloc`
/// under the tracer's hook (`tests/fixtures/signal_longjmp.c`): its block comes from the
/// tracer, not from glibc's half-updated heap; the abandoned hook is noticed and the thread
/// goes on untraced, with one line on stderr, instead of hanging or losing track silently.
#[test]
fn a_handler_leaving_malloc_with_longjmp_is_noticed_and_breaks_nothing() {
    gdb(&with_entry_script(c_fixture("signal_longjmp.c", &[])), "");
}

/// The same handler under sampling, where the hooks' entries pass most calls straight to
/// glibc: one made while the thread is inside the tracer still goes to the tracer, even with
/// the thread's countdown far from its sample point.
#[test]
fn a_handler_inside_the_tracer_is_served_by_it_under_sampling() {
    gdb(&c_fixture("signal_longjmp.c", &[]), "sampled");
}
