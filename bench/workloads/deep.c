/* deep: allocations from deep, varied stacks, as an interpreter makes them.
 *
 * usage: deep DESCENTS
 *
 * Each descent recurses 40 to 80 frames deep through five noinline "opcode"
 * functions, chosen per level by the descent's program (one of 512), so that
 * stacks differ in their return addresses all along, as an interpreter's
 * evaluator frames do.  At the bottom it runs a loop of 16 short calls, each
 * descending 0 to 5 more levels through opcodes of its own and allocating at
 * one of three leaf sites: consecutive allocations share their outer frames
 * and differ in the last few, as an interpreter running a loop does.  Some
 * levels also allocate on the way down and back up.  Each allocation frees the
 * oldest of a window of live blocks, so frees come from deep stacks too.
 * Built with -fomit-frame-pointer: the tracer must unwind through CFI.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PROGRAMS 512
#define WINDOW 4096

static void *window[WINDOW];
static unsigned slot;
static uint64_t checksum;

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

/* Keeps the block for a while and frees the one it replaces. */
static void keep(unsigned char *p, size_t size)
{
    if (!p) {
        perror("malloc");
        exit(1);
    }
    p[0] = (unsigned char)size;
    p[size - 1] = (unsigned char)(size >> 3);
    unsigned s = slot++ % WINDOW;
    unsigned char *old = window[s];
    if (old)
        checksum = checksum * 31 + old[0];
    free(old);
    window[s] = p;
}

static __attribute__((noinline)) void leaf_a(size_t n) { keep(malloc(n), n); }
static __attribute__((noinline)) void leaf_b(size_t n) { keep(malloc(n + 24), n + 24); }
static __attribute__((noinline)) void leaf_c(size_t n) { keep(calloc(1, n + 8), n + 8); }

struct frame {
    unsigned program;
    unsigned depth;
    /* Levels still to go in the current short call, and which one it is. */
    unsigned inner;
    unsigned call;
    uint64_t rng;
};

typedef void (*op_fn)(struct frame *);
static op_fn ops[5];

static void step(struct frame *f);

/* The bottom of a short call: one allocation from one of three sites. */
static void leaf(struct frame *f)
{
    size_t n = 16 + next_rand(&f->rng) % 240;
    switch ((f->program + f->call) % 3) {
    case 0: leaf_a(n); break;
    case 1: leaf_b(n); break;
    default: leaf_c(n); break;
    }
}

/* At the bottom of the descent: the loop of short calls. */
static __attribute__((noinline)) void loop(struct frame *f)
{
    for (unsigned c = 0; c < 16; c++) {
        f->call = c;
        f->inner = 1 + (unsigned)(next_rand(&f->rng) % 6);
        step(f);
        f->inner = 0;
    }
}

/* Descends one level through the opcode this program runs at this depth, or, in a short
 * call, through the opcode this call runs at this level. */
static void step(struct frame *f)
{
    unsigned op;
    if (f->inner) {
        if (--f->inner == 0) {
            leaf(f);
            return;
        }
        op = (f->call * 7 + f->inner * 3 + f->program) % 5;
        ops[op](f);
        return;
    }
    if (f->depth == 0) {
        loop(f);
        return;
    }
    f->depth--;
    op = (f->program * 2654435761u + f->depth * 40503u) >> 7;
    ops[op % 5](f);
    f->depth++;
}

/* The opcodes differ in frame size and in when they allocate, so that their
 * frames are laid out differently and their stacks differ. */
static __attribute__((noinline)) void op_load(struct frame *f)
{
    volatile char pad[32];
    pad[0] = (char)f->depth;
    step(f);
    checksum += pad[0];
}

static __attribute__((noinline)) void op_call(struct frame *f)
{
    if (f->depth % 4 == 0)
        leaf_a(32 + f->depth);
    step(f);
}

static __attribute__((noinline)) void op_build(struct frame *f)
{
    step(f);
    if (f->depth % 3 == 0)
        leaf_b(64);
}

static __attribute__((noinline)) void op_iter(struct frame *f)
{
    volatile uint64_t pad[12];
    pad[3] = f->rng;
    step(f);
    checksum ^= pad[3];
}

static __attribute__((noinline)) void op_store(struct frame *f)
{
    if (f->depth % 7 == 0)
        leaf_c(48);
    step(f);
}

static op_fn ops[5] = {op_load, op_call, op_build, op_iter, op_store};

int main(int argc, char **argv)
{
    long descents = argc > 1 ? atol(argv[1]) : 50000;
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long d = 0; d < descents; d++) {
        /* Zeroed: `inner` and `call` must start at 0. Left to whatever lay on the stack, they
         * made the descent endless (a stack overflow) once a preloaded library's start-up
         * had written there, though not in a plain run. */
        struct frame f = {0};
        f.program = (unsigned)(next_rand(&rng) % PROGRAMS);
        f.depth = 40 + f.program % 41;
        f.rng = rng;
        step(&f);
    }
    for (unsigned i = 0; i < WINDOW; i++)
        free(window[i]);
    printf("%llu\n", (unsigned long long)checksum);
    return 0;
}
