/* The bundled example of the profiler: a little "server" that loads a catalog it keeps, handles
 * requests with a scratch buffer it frees, and forgets one session in ten. `examples/run-demo`
 * runs it under the profiler build and shows where its memory went. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITEMS 2000
#define REQUESTS 1000

static char **catalog;

__attribute__((noinline)) static char *load_item(int i)
{
    char *item = malloc(512);                     /* the catalog: 1 MB kept to the end */
    snprintf(item, 512, "item %d", i);
    return item;
}

__attribute__((noinline)) static void load_catalog(void)
{
    catalog = malloc(ITEMS * sizeof *catalog);
    for (int i = 0; i < ITEMS; i++)
        catalog[i] = load_item(i);
}

__attribute__((noinline)) static size_t handle_request(int i)
{
    char *scratch = malloc(64 << 10);             /* 64 KiB per request, freed at once */
    size_t n = (size_t)snprintf(scratch, 64 << 10, "%s", catalog[i % ITEMS]);
    free(scratch);
    return n;
}

__attribute__((noinline)) static void open_session(int i)
{
    char *session = malloc(200);                  /* one in ten is never freed: a leak */
    snprintf(session, 200, "session %d", i);
    if (i % 10 != 0)
        free(session);
}

int main(void)
{
    size_t served = 0;
    load_catalog();
    for (int i = 0; i < REQUESTS; i++) {
        open_session(i);
        served += handle_request(i);
    }
    printf("served %d requests, %zu bytes\n", REQUESTS, served);
    return 0;
}
