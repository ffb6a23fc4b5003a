/* floor: the least a sampling interposer can cost, for bench/run's "floor" column.
 *
 * Preloaded like libmem_trace.so, it forwards the malloc family to glibc and does only what
 * sampling by bytes cannot avoid: a per-thread countdown of the bytes allocated (taking a
 * "sample" each 512 KiB, which here only sets a bit), and at each free the check of one bit
 * of a bitmap by address hash. Whatever mem-trace's sampled mode costs above this is its own.
 * The countdown is in initial-exec TLS, the cheapest a preloaded library can have (one load
 * from a GOT slot): the default for -fPIC, a call to __tls_get_addr per malloc, made this
 * floor 2-4% of plain slower than it need be on deep, dicts and rust.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define MEAN (512 << 10)
static __thread long countdown __attribute__((tls_model("initial-exec"))) = MEAN;
static uint8_t sampled[1 << 16];

static inline unsigned slot(void *p) {
    return (unsigned)(((uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 48);
}

static inline void *count(void *p, size_t n) {
    if ((countdown -= (long)n) <= 0) {
        countdown = MEAN;
        if (p)
            __atomic_fetch_add(&sampled[slot(p)], 1, __ATOMIC_RELAXED);
    }
    return p;
}

static inline void check(void *p) {
    if (p && __atomic_load_n(&sampled[slot(p)], __ATOMIC_RELAXED))
        __atomic_fetch_sub(&sampled[slot(p)], 1, __ATOMIC_RELAXED);
}

void *malloc(size_t n) { return count(__libc_malloc(n), n); }
void *calloc(size_t k, size_t n) { return count(__libc_calloc(k, n), k * n); }
void *realloc(void *p, size_t n) {
    check(p);
    return count(__libc_realloc(p, n), n);
}
void free(void *p) {
    check(p);
    __libc_free(p);
}
void *memalign(size_t a, size_t n) { return count(__libc_memalign(a, n), n); }
void *aligned_alloc(size_t a, size_t n) { return count(__libc_memalign(a, n), n); }
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = count(__libc_memalign(a, n), n);
    if (!p)
        return 12;
    *out = p;
    return 0;
}
