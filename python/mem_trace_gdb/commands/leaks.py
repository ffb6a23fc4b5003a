"""`mtrace-leaks`: the live blocks as memcheck classifies them (definitely lost, possibly
lost, still reachable), by allocation stack, found by reading memory only.

The scan and its answer are the Rust reader's (`mem-trace leaks` on the same process or core
prints the same). Its roots are the writable data of every loaded object but
libmem_trace.so's, the memory the program mapped itself, every thread's stack from its stack
pointer, every thread's registers and thread-local storage. A core's threads come from its
notes; a live process's from gdb, which holds it stopped: each thread's registers are read
here and handed over.
"""

from __future__ import annotations

import gdb

from .. import reader, target
from .base import ArgparsedCommand, ArgumentParser
from .options import add_frames, add_raw, non_negative

DEFAULT_GROUPS = 10

parser = ArgumentParser(
    prog="mtrace-leaks",
    description=("List the live blocks definitely lost, possibly lost and still reachable, "
                 "by allocation stack."),
    epilog=(
        "A conservative scan, as memcheck does it, by reading memory only, with the\n"
        "rules of the profiler's exit report (same program, same classes). From the\n"
        "roots (the writable data of every loaded object but libmem_trace.so, the\n"
        "program's own anonymous mappings, every\n"
        "thread's stack from its stack pointer, every thread's registers), any aligned\n"
        "8-byte word that points into a live block reaches it, and the block's own\n"
        "words are scanned in turn:\n"
        "  still reachable  reached from the roots by a chain of pointers to block starts;\n"
        "  possibly lost    reached, but only through a pointer into some block's middle;\n"
        "  definitely lost  not reached at all (memcheck's \"indirectly lost\" too).\n"
        "Unlike LeakSanitizer, an interior pointer does not make a block reachable:\n"
        "glibc's own free lists point into the last bytes of blocks, at the header of\n"
        "the free chunk after them. And a pointer exactly 8 bytes before a\n"
        "block's end, where that header starts for sizes of 16n+8 bytes, does not count\n"
        "at all. A value that only looks like a pointer keeps a block reached: a\n"
        "definitely lost block is really lost, a missed leak is possible.\n"
        "Memory the program mapped itself (a pool, an interpreter's heap pages) is\n"
        "scanned too, the tracer's own left out. Works live and on core files.\n"
        "Each class lists its stacks biggest first, unlike mtrace-top and mtrace-peaks,\n"
        "which put the biggest last, next to the prompt: here three lists and a summary\n"
        "follow one another, so no order puts the biggest of each there, and first\n"
        "opens each list with the stack that matters most, as memcheck, LeakSanitizer\n"
        "and the exit report do.\n"
        "\n"
        "Examples:\n"
        "  mtrace-leaks\n"
        "  mtrace-leaks --no-reachable -n 0"
    ),
)
parser.add_argument("-n", "--count", type=non_negative, default=DEFAULT_GROUPS,
                    metavar="N", help="stacks of each kind to show (default %(default)s; 0: all)")
add_frames(parser)
parser.add_argument("--no-reachable", action="store_true",
                    help="do not list the still reachable blocks (the summary counts them)")
add_raw(parser)


class LeaksCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA
    words = True

    def run(self, args):
        named = target.named()
        threads = target.thread_registers() if named[0] == "process" else []
        return reader.ask("leaks", named, count=args.count, frames=args.frames,
                          no_reachable=args.no_reachable, raw=args.raw,
                          gdb_threads=target.gdb_threads(), threads=threads)
