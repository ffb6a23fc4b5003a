//! Under the preload, the malloc family keeps glibc's semantics exactly: overflow and bad
//! alignment errors, `realloc` edge cases, `malloc_usable_size`, alignment, zeroed `calloc`.
//! The fixture prints what it sees; the output must be identical with and without the tracer,
//! and the documented results, its `stdout-check` lines, must be there.

mod common;

use common::{c_fixture, fixture_run};

#[test]
fn the_malloc_family_behaves_like_glibc_under_the_tracer() {
    fixture_run(&c_fixture("semantics.c", &[]), "")
        .labelled("debug")
        .run_same_as_plain();
}

/// The same in profile mode, where small blocks carry their record in a tag in front of them
/// (their `realloc`, `malloc_usable_size` and `calloc` take other paths).
#[test]
fn the_malloc_family_behaves_like_glibc_with_tagged_blocks() {
    fixture_run(&c_fixture("semantics.c", &[]), "")
        .labelled("tagged")
        .with_env(&[("MEM_TRACE_MODE", "profile"), ("MEM_TRACE_TAGS", "1")])
        .run_same_as_plain();
}

/// The same under sampling, where most calls take the hooks' untouched path: in both modes,
/// one block in a few sampled (1 KiB) so that the full path runs beside it.
#[test]
fn the_malloc_family_behaves_like_glibc_under_sampling() {
    for mode in ["debug", "profile"] {
        fixture_run(&c_fixture("semantics.c", &[]), "")
            .labelled(&format!("sampled-{mode}"))
            .with_env(&[("MEM_TRACE_MODE", mode), ("MEM_TRACE_SAMPLE", "1K")])
            .run_same_as_plain();
    }
}
