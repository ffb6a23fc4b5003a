/* The bundled example: a small program with a live block, an interior pointer and a dangling
 * pointer, for `examples/run-demo` to explain under gdb. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct order {
    int id;
    char *note;
};

__attribute__((noinline)) struct order *new_order(int id, const char *note)
{
    struct order *o = malloc(sizeof *o);          /* allocation site of the order */
    o->id = id;
    o->note = strdup(note);                       /* allocation site of the note */
    return o;
}

__attribute__((noinline)) void drop_order(struct order *o)
{
    free(o->note);
    free(o);                                      /* free site of the dangling pointer */
}

__attribute__((noinline)) void break_here(void) { __asm__ volatile(""); }

int main(void)
{
    struct order *keep = new_order(1, "two espressos, no sugar");
    struct order *gone = new_order(2, "a croissant");
    char *inside = keep->note + 4;
    drop_order(gone);
    printf("order %d: %s (%s)\n", keep->id, keep->note, inside);
    break_here();                                 /* gdb stops here */
    return 0;
}
