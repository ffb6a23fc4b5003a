/* bench/report_speed's program. A heap of BLOCKS live blocks from ~STACKS distinct stacks, then one snapshot report
 * (MEM_TRACE_SNAPSHOT_SIGNAL) while a worker thread keeps allocating: prints how long the
 * report took (from the signal until the profile's report count moves) and the longest any
 * of the worker's malloc/free pairs took meanwhile.
 *
 * Distinct stacks come from a recursion that branches on the bits of the block's index:
 * each of LEVELS levels calls one of two noinline functions, so 2^LEVELS paths. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void **blocks;
static volatile int stop;
static volatile double worst;

NOINLINE static void *descend0(unsigned bits, int level);
NOINLINE static void *descend1(unsigned bits, int level);

static void *descend(unsigned bits, int level)
{
    if (level == 0)
        return malloc(16 + (bits & 63));
    return (bits & 1) ? descend1(bits >> 1, level - 1) : descend0(bits >> 1, level - 1);
}
NOINLINE static void *descend0(unsigned bits, int level)
{
    void *p = descend(bits, level);
    __asm__ volatile("" ::: "memory");
    return p;
}
NOINLINE static void *descend1(unsigned bits, int level)
{
    void *p = descend(bits, level);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void *worker(void *arg)
{
    (void)arg;
    double t = now();
    while (!stop) {
        void *p = malloc(100);
        free(p);
        double u = now();
        if (u - t > worst)
            worst = u - t;
        t = u;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int levels = argc > 2 ? atoi(argv[2]) : 17;
    blocks = malloc(n * sizeof(void *));
    for (long i = 0; i < n; i++)
        blocks[i] = descend((unsigned)(i * 2654435761u), levels);
    const char *h = dlsym(RTLD_DEFAULT, "MEM_TRACE_HEADER");
    if (!h) {
        printf("not traced\n");
        return 1;
    }
    volatile uint64_t *reports = (uint64_t *)(*(char **)(h + 96) + 32);
    if (!*(char **)(h + 96)) {
        printf("not the profiler build\n");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    usleep(100000);
    worst = 0;
    (void)reports;
    const char *dir = getenv("MEM_TRACE_OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s/mem-trace.%d.1.txt", dir ? dir : ".", (int)getpid());
    double t0 = now();
    kill(getpid(), SIGUSR2);
    static char buf[1 << 20];
    for (;;) {
        usleep(2000);
        if (now() - t0 > 60)
            break;
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        if (strstr(buf, "end of report"))
            break;
    }
    double took = now() - t0;
    stop = 1;
    pthread_join(t, NULL);
    printf("blocks=%ld levels=%d report_s=%.3f worst_pause_ms=%.2f\n", n, levels, took, worst * 1e3);
    return 0;
}
