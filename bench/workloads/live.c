/* live: many small blocks alive at the same time.
 *
 * usage: live BLOCKS CYCLES
 *
 * Each cycle allocates BLOCKS blocks of 16..128 bytes, touches them, then
 * frees them all (in a shuffled order, so the tracer's table is not walked
 * in insertion order).  What this measures is the tracer's memory per live
 * block, which dominates its footprint in real programs; a few cycles only
 * make the run long enough to time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x243F6A8885A308D3ULL;

static uint64_t next_rand(void)
{
    uint64_t x = rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Four call paths, so blocks do not all share one stack. */
static __attribute__((noinline)) unsigned char *alloc_a(size_t n) { return malloc(n); }
static __attribute__((noinline)) unsigned char *alloc_b(size_t n) { return malloc(n); }
static __attribute__((noinline)) unsigned char *via_c(size_t n) { return alloc_a(n + 1) ; }
static __attribute__((noinline)) unsigned char *via_d(size_t n) { return alloc_b(n + 2); }

static unsigned char *alloc_one(size_t n, unsigned path)
{
    switch (path & 3) {
    case 0: return alloc_a(n);
    case 1: return alloc_b(n);
    case 2: return via_c(n - 1);
    default: return via_d(n - 2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s BLOCKS CYCLES\n", argv[0]);
        return 2;
    }
    size_t blocks = strtoull(argv[1], NULL, 10);
    unsigned cycles = (unsigned)atoi(argv[2]);
    unsigned char **v = malloc(blocks * sizeof *v);
    size_t *order = malloc(blocks * sizeof *order);
    if (!v || !order) {
        perror("malloc");
        return 1;
    }
    uint64_t sum = 0;
    for (unsigned c = 0; c < cycles; c++) {
        for (size_t i = 0; i < blocks; i++) {
            size_t n = 16 + next_rand() % (128 - 16 + 1);
            unsigned char *p = alloc_one(n, (unsigned)(i ^ c));
            if (!p) {
                perror("malloc");
                return 1;
            }
            p[0] = (unsigned char)n;
            p[n - 1] = (unsigned char)i;
            v[i] = p;
        }
        for (size_t i = 0; i < blocks; i++)
            order[i] = i;
        for (size_t i = blocks; i > 1; i--) {
            size_t j = next_rand() % i;
            size_t t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        for (size_t i = 0; i < blocks; i++) {
            unsigned char *p = v[order[i]];
            sum = sum * 31 + p[0] + p[p[0] - 1];
            free(p);
        }
    }
    printf("live blocks=%zu cycles=%u checksum=%016llx\n", blocks, cycles,
           (unsigned long long)sum);
    free(v);
    free(order);
    return 0;
}
