/* deep_new: allocations from deep stacks that never repeat, as a program running ever-new
 * code makes them (a compiler or a template engine on generated input).
 *
 * usage: deep_new TREES
 *
 * Each tree is a random expression, generated from a seeded xorshift while it is evaluated
 * by recursive descent: a chain of 24 to 84 unary nodes (the spine), then a full binary
 * subtree six levels high whose every node allocates, 30 to 90 frames deep in all.  The
 * node kinds are noinline functions that call their children each from call sites of their
 * own, so a node's stack is its path of (kind, child) pairs: with 8 kinds on at least 24
 * random levels above every allocating node, no two trees share a path (the generator is
 * never reset, so no program runs twice), and within a tree no two nodes do.  Every
 * allocation's stack is therefore new, which is what measures a tracer's memory per
 * distinct stack rather than per block.
 *
 * A tree's blocks are kept on a list and freed by main once the tree is evaluated, all from
 * one stack: free stacks recorded by a debug tracer do not add to the count, and the live
 * blocks stay few, so that peak RSS above plain's is the stacks' cost.
 * Built with -fomit-frame-pointer: the tracer must unwind through CFI.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KINDS 8
#define BUSH 6

struct box {
    struct box *next;
    uint64_t v;
    unsigned char data[];
};

struct ev {
    uint64_t rng;
    struct box *blocks;
};

static uint64_t next_rand(uint64_t *s)
{
    /* xorshift64*: deterministic across runs, libc-independent. */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Inlined so that the allocation's return address is in the node that asked for it. */
static inline __attribute__((always_inline)) uint64_t box(struct ev *e, uint64_t v,
                                                           int zeroed)
{
    size_t n = 8 + (v >> 7) % 104;
    struct box *b = zeroed ? calloc(1, sizeof *b + n) : malloc(sizeof *b + n);
    if (!b) {
        perror("malloc");
        exit(1);
    }
    /* Some work per node, as folding a constant would do, so that the plain run is not
     * all malloc: the ratios then read like an ordinary program's. */
    uint64_t h = v;
    for (size_t i = 0; i < 2 * n; i++)
        h = (h ^ i) * 0x100000001B3ULL;
    for (size_t i = 0; i < n; i++) {
        h = h * 0x100000001B3ULL ^ i;
        b->data[i] = (unsigned char)h;
    }
    b->v = h ^ b->data[n / 2];
    b->next = e->blocks;
    e->blocks = b;
    return b->v;
}

/* GCC turns `return f(x) + c` on itself into a loop (tail recursion with an accumulator),
 * which would take the frames out of the stack: a child's value goes through this first. */
static inline __attribute__((always_inline)) uint64_t opaque(uint64_t v)
{
    __asm__("" : "+r"(v));
    return v;
}

static uint64_t k_add(struct ev *, unsigned, unsigned);
static uint64_t k_mul(struct ev *, unsigned, unsigned);
static uint64_t k_neg(struct ev *, unsigned, unsigned);
static uint64_t k_let(struct ev *, unsigned, unsigned);
static uint64_t k_call(struct ev *, unsigned, unsigned);
static uint64_t k_cond(struct ev *, unsigned, unsigned);
static uint64_t k_index(struct ev *, unsigned, unsigned);
static uint64_t k_str(struct ev *, unsigned, unsigned);

/* One node, `depth` levels above the tree's bottom, whose subtree becomes binary `BUSH`
 * levels up.  Inlined into every call site: a direct call per kind, so each child a kind
 * evaluates is reached through return addresses of that call site alone. */
static inline __attribute__((always_inline)) uint64_t eval(struct ev *e, unsigned depth,
                                                            unsigned salt)
{
    uint64_t r = next_rand(&e->rng);
    if (depth == 0)
        return box(e, r ^ salt, 0);
    switch (r % KINDS) {
    case 0: return k_add(e, depth - 1, salt);
    case 1: return k_mul(e, depth - 1, salt);
    case 2: return k_neg(e, depth - 1, salt);
    case 3: return k_let(e, depth - 1, salt);
    case 4: return k_call(e, depth - 1, salt);
    case 5: return k_cond(e, depth - 1, salt);
    case 6: return k_index(e, depth - 1, salt);
    default: return k_str(e, depth - 1, salt);
    }
}

/* The kinds differ in frame size, in allocating before or after their children and in
 * the allocator call, so that their frames and unwind rules differ as real code's do.
 * On the spine (depth >= BUSH) they have one child and do not allocate. */
static __attribute__((noinline)) uint64_t k_add(struct ev *e, unsigned d, unsigned s)
{
    if (d >= BUSH)
        return opaque(eval(e, d, s)) + 1;
    uint64_t a = opaque(eval(e, d, s + 1));
    uint64_t b = opaque(eval(e, d, s + 2));
    return box(e, a + b, 0);
}

static __attribute__((noinline)) uint64_t k_mul(struct ev *e, unsigned d, unsigned s)
{
    volatile uint64_t pad[6];
    pad[2] = s;
    if (d >= BUSH)
        return opaque(eval(e, d, s)) * 3 + pad[2];
    uint64_t m = box(e, pad[2] * 7, 0);
    uint64_t a = opaque(eval(e, d, s + 3));
    return m ^ (a * (opaque(eval(e, d, s + 5)) | 1));
}

static __attribute__((noinline)) uint64_t k_neg(struct ev *e, unsigned d, unsigned s)
{
    if (d >= BUSH)
        return ~opaque(eval(e, d, s));
    uint64_t a = opaque(eval(e, d, s ^ 1));
    return box(e, -a, 1) ^ opaque(eval(e, d, s ^ 2));
}

static __attribute__((noinline)) uint64_t k_let(struct ev *e, unsigned d, unsigned s)
{
    volatile char name[40];
    name[0] = (char)s;
    if (d >= BUSH)
        return opaque(eval(e, d, s + 7)) ^ (uint64_t)name[0];
    uint64_t bound = box(e, (uint64_t)name[0] << 3, 1);
    uint64_t a = opaque(eval(e, d, s + (unsigned)bound % 5));
    return opaque(eval(e, d, s + 11)) + a;
}

static __attribute__((noinline)) uint64_t k_call(struct ev *e, unsigned d, unsigned s)
{
    if (d >= BUSH)
        return opaque(eval(e, d, s * 3)) - s;
    uint64_t a = opaque(eval(e, d, s * 3));
    uint64_t b = opaque(eval(e, d, s * 5));
    return box(e, a ^ (b << 1), 1);
}

static __attribute__((noinline)) uint64_t k_cond(struct ev *e, unsigned d, unsigned s)
{
    if (d >= BUSH) {
        /* Either branch, from a call site of its own. */
        if (e->rng & 1)
            return opaque(eval(e, d, s + 13)) >> 1;
        return opaque(eval(e, d, s + 17)) << 1;
    }
    uint64_t c = box(e, s, 0);
    uint64_t a = opaque(eval(e, d, s + 19));
    return (c & 1 ? a : ~a) + opaque(eval(e, d, s + 23));
}

static __attribute__((noinline)) uint64_t k_index(struct ev *e, unsigned d, unsigned s)
{
    volatile uint32_t idx[20];
    idx[s % 20] = s;
    if (d >= BUSH)
        return opaque(eval(e, d, s + 29)) + idx[s % 20];
    uint64_t a = opaque(eval(e, d, s + 31));
    uint64_t b = opaque(eval(e, d, s + 37));
    return box(e, a - b + idx[s % 20], 0);
}

static __attribute__((noinline)) uint64_t k_str(struct ev *e, unsigned d, unsigned s)
{
    if (d >= BUSH)
        return opaque(eval(e, d, s ^ 0x55)) * 5;
    uint64_t a = opaque(eval(e, d, s ^ 0x66));
    uint64_t str = box(e, a * 31, 1);
    return str + opaque(eval(e, d, s ^ 0x77));
}

static __attribute__((noinline)) void free_tree(struct ev *e)
{
    while (e->blocks) {
        struct box *b = e->blocks;
        e->blocks = b->next;
        free(b);
    }
}

int main(int argc, char **argv)
{
    long trees = argc > 1 ? atol(argv[1]) : 10000;
    struct ev e = {0x9e3779b97f4a7c15ULL, NULL};
    uint64_t checksum = 0;
    for (long t = 0; t < trees; t++) {
        /* The spine: 24..84 levels, so the tree is 30..90 nodes deep. */
        unsigned depth = BUSH + 24 + (unsigned)(next_rand(&e.rng) % 61);
        checksum = checksum * 31 + eval(&e, depth, (unsigned)t);
        free_tree(&e);
    }
    printf("%llu\n", (unsigned long long)checksum);
    return 0;
}
