//! Under the preload, the malloc family keeps glibc's semantics exactly: overflow and bad
//! alignment errors, `realloc` edge cases, `malloc_usable_size`, alignment, zeroed `calloc`.
//! The fixture prints what it sees; the output must be identical with and without the tracer,
//! and the documented results, its `stdout-check` lines, must be there.

mod common;

use common::{c_fixture, fixture_run};

#[test]
fn the_malloc_family_behaves_like_glibc_under_the_tracer() {
    fixture_run(&c_fixture("semantics.c", &[]), "").run_same_as_plain();
}
