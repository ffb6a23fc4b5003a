//! Under the preload, the malloc family keeps glibc's semantics exactly: overflow and bad
//! alignment errors, `realloc` edge cases, `malloc_usable_size`, alignment, zeroed `calloc`.
//! The fixture prints what it sees; the output must be identical with and without the tracer,
//! and the documented results must be there.

mod common;

use common::{c_fixture, Job};

#[test]
fn the_malloc_family_behaves_like_glibc_under_the_tracer() {
    let traced = Job::fixture(&c_fixture("semantics.c", &[])).assert_same_with_preload();
    for expected in [
        "calloc(SIZE_MAX/2, 3) is NULL with ENOMEM: ok",
        "malloc(SIZE_MAX) is NULL with ENOMEM: ok",
        "reallocarray overflow is NULL with ENOMEM: ok",
        "realloc(p, huge) is NULL with ENOMEM and keeps p: ok",
        "posix_memalign(align 3) is EINVAL: ok",
        "posix_memalign(align 4 < sizeof(void*)) is EINVAL: ok",
        "posix_memalign failure leaves *memptr alone: ok",
        "posix_memalign(SIZE_MAX) is ENOMEM: ok",
        "memalign(64, huge) is NULL with ENOMEM: ok",
        "realloc(NULL, 100) allocates: ok",
        "realloc growing keeps the contents: ok",
        "realloc shrinking keeps the contents: ok",
        "realloc(p, 0): NULL",
        "free(NULL) returns: ok",
        "malloc(0) is a unique non-NULL pointer: ok",
        "malloc_usable_size(p) >= n: ok",
        "malloc_usable_size(NULL) is 0: ok",
        "posix_memalign/aligned_alloc/memalign honour alignments 8..65536: ok",
        "valloc is page-aligned: ok",
        "pvalloc is page-aligned with a whole page usable: ok",
        "calloc returns zeroed memory, also recycled: ok",
        "calloc zeroes blocks freed dirty, after many frees: ok",
        "malloc_usable_size >= n, after many frees: ok",
        "realloc keeps the contents, after many frees: ok",
        "semantics: 0 failures",
    ] {
        assert!(
            traced.stdout.lines().any(|l| l == expected),
            "missing line `{expected}`\n{}",
            traced.describe()
        );
    }
}
