/* churn: many short-lived blocks from many distinct, deep call paths.
 *
 * usage: churn THREADS TOTAL_PAIRS
 *
 * Every allocation is made 14 frames below the thread's entry, on one of 50
 * call paths.  The frames come from four noinline step functions chosen per
 * depth by the path index, so the 50 paths differ in their return addresses,
 * not just in their arguments: a tracer that interns stacks really sees 50
 * distinct stacks.  Built with -fomit-frame-pointer so the tracer must unwind
 * through CFI, as it would in most distribution binaries.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATHS 50
#define DEPTH 14
/* A few blocks stay alive for a while, so frees do not always hit the block
 * just allocated (closer to real programs and to what a block table sees). */
#define WINDOW 16

struct worker {
    uint64_t rng;
    uint64_t pairs;
    uint64_t checksum;
    void *window[WINDOW];
    size_t window_size[WINDOW];
    unsigned slot;
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

static unsigned choice(unsigned path, unsigned depth)
{
    /* First three levels: base-4 digits of the path index (64 >= 50, so the
     * paths are pairwise distinct).  Deeper levels: a mix, so the paths do
     * not share long suffixes either. */
    if (depth < 3)
        return (path >> (2 * depth)) & 3;
    return (path * 7 + depth * 13 + ((path * depth) >> 1)) & 3;
}

static __attribute__((noinline)) uint64_t leaf(struct worker *w)
{
    size_t size = 16 + next_rand(&w->rng) % (4096 - 16 + 1);
    unsigned char *p = malloc(size);
    if (!p) {
        perror("malloc");
        exit(1);
    }
    /* Touch both ends and read them back later, so the compiler cannot drop
     * the malloc/free pair. */
    p[0] = (unsigned char)size;
    p[size - 1] = (unsigned char)(size >> 8);

    unsigned s = w->slot++ % WINDOW;
    unsigned char *old = w->window[s];
    uint64_t sum = 0;
    if (old) {
        size_t os = w->window_size[s];
        sum = old[0] + 3u * old[os - 1] + os;
        free(old);
    }
    w->window[s] = p;
    w->window_size[s] = size;
    return sum;
}

typedef uint64_t (*step_fn)(struct worker *, unsigned, unsigned);
static uint64_t step0(struct worker *, unsigned, unsigned);
static uint64_t step1(struct worker *, unsigned, unsigned);
static uint64_t step2(struct worker *, unsigned, unsigned);
static uint64_t step3(struct worker *, unsigned, unsigned);
static step_fn const steps[4] = {step0, step1, step2, step3};

/* The arithmetic after each call keeps it from being a tail call, so every
 * level really leaves a frame on the stack. */
#define STEP(name, k)                                                          \
    static __attribute__((noinline, noclone)) uint64_t name(                   \
        struct worker *w, unsigned path, unsigned depth)                       \
    {                                                                          \
        if (depth == DEPTH - 1)                                                \
            return leaf(w) + (k);                                              \
        uint64_t r = steps[choice(path, depth + 1)](w, path, depth + 1);       \
        return r * 31 + (k) + depth;                                           \
    }
STEP(step0, 1)
STEP(step1, 2)
STEP(step2, 3)
STEP(step3, 5)

static void *run(void *arg)
{
    struct worker *w = arg;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < w->pairs; i++) {
        unsigned path = next_rand(&w->rng) % PATHS;
        sum = sum * 1000003 + steps[choice(path, 0)](w, path, 0);
    }
    for (unsigned s = 0; s < WINDOW; s++)
        free(w->window[s]);
    w->checksum = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s THREADS TOTAL_PAIRS\n", argv[0]);
        return 2;
    }
    unsigned threads = (unsigned)atoi(argv[1]);
    uint64_t total = strtoull(argv[2], NULL, 10);
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "churn: THREADS must be 1..64\n");
        return 2;
    }

    struct worker *ws = calloc(threads, sizeof *ws);
    pthread_t *ts = calloc(threads, sizeof *ts);
    for (unsigned t = 0; t < threads; t++) {
        ws[t].rng = 0x9E3779B97F4A7C15ULL * (t + 1);
        ws[t].pairs = total / threads + (t < total % threads);
    }
    if (threads == 1) {
        run(&ws[0]);
    } else {
        for (unsigned t = 0; t < threads; t++)
            if (pthread_create(&ts[t], NULL, run, &ws[t]) != 0) {
                fprintf(stderr, "churn: pthread_create failed\n");
                return 1;
            }
        for (unsigned t = 0; t < threads; t++)
            pthread_join(ts[t], NULL);
    }

    uint64_t checksum = 0;
    for (unsigned t = 0; t < threads; t++)
        checksum = checksum * 0x100000001B3ULL ^ ws[t].checksum;
    printf("churn threads=%u pairs=%llu checksum=%016llx\n", threads,
           (unsigned long long)total, (unsigned long long)checksum);
    free(ws);
    free(ts);
    return 0;
}
