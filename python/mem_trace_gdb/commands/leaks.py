"""`mtrace-leaks`: the live blocks as memcheck classifies them (definitely lost, possibly
lost, still reachable), by allocation stack, found by reading memory only (a conservative
scan, with the rules of the profiler's in-process leak check: see scan.py).

The scan is `scan.py` and the answer's text `text.leaks`; this module finds the
roots with gdb, in ways that work on a live process and on a core file alike:

* the writable data of every loaded object (`.data`, `.bss`, `.got`, ... from
  `maintenance info sections -all-objects`), except libmem_trace.so's own: its
  data points at the tracer's tables, which hold every block's address;
* every thread's stack, from its stack pointer (less the 128-byte red zone a
  leaf function may use) to the end of the mapping that holds it: the mapping
  comes from `info proc mappings` on a live process, from the core's segments
  (the `Core file` part of `maintenance info sections`) on a core, where `info
  proc mappings` is unavailable; failing both, readable pages are probed upward;
* every thread's general registers (a pointer may live only in a register);
* the start of every glibc thread's dynamic thread vector, found from its control block
  at the top of its stack mapping (scan.dtv_words).

Not scanned: thread-local storage outside the thread stacks (the main thread's
static TLS), and memory mapped by the program itself outside the heap (a block
pointed to only from such memory is reported lost).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import gdb

from .. import memory, scan
from ..layout import MASK64, MemTraceError, sample
from ..text import leaks
from .base import ArgparsedCommand, ArgumentParser
from .lookups import lookups
from .options import add_frames, add_raw, non_negative

DEFAULT_GROUPS = 10
RED_ZONE = 128
# Without a mapping to bound a stack, probe at most this far above the stack pointer.
MAX_PROBED_STACK = 8 << 20

REGISTERS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")

_OBJECT = re.compile(r"^(Exec|Object|Core) file: `(.*)', file type")
_SECTION = re.compile(r"^\s*\[\d+\]\s+0x([0-9a-fA-F]+)->0x([0-9a-fA-F]+) at 0x[0-9a-fA-F]+: (\S+)(.*)$")
# Sections that are not where they say: TLS templates (each thread has its own copy).
_NOT_DATA = (".tdata", ".tbss")

Range = Tuple[int, int]


def _sections() -> Tuple[Dict[str, List[Range]], List[Range]]:
    """Writable allocated sections per object file, and the core's segments (if a core)."""
    try:
        text = gdb.execute("maintenance info sections -all-objects ALLOC", to_string=True)
    except gdb.error:
        text = gdb.execute("maintenance info sections ALLOC", to_string=True)
    objects: Dict[str, List[Range]] = {}
    core: List[Range] = []
    current: Optional[str] = None
    is_core = False
    for line in text.splitlines():
        m = _OBJECT.match(line)
        if m:
            current = None if m.group(1) == "Core" else m.group(2)
            is_core = m.group(1) == "Core"
            continue
        m = _SECTION.match(line)
        if not m:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        name, flags = m.group(3), m.group(4).split()
        if current is None:
            if is_core:
                core.append((start, end))
            continue
        if "READONLY" in flags or "CODE" in flags or name in _NOT_DATA or end <= start:
            continue
        objects.setdefault(current, []).append((start, end))
    return objects, core


def _is_debug_file(path: str) -> bool:
    """A separate debug-info file: the same sections as its object, counted once."""
    return "/.build-id/" in path or path.endswith(".debug")


def data_roots(tracer_address: int) -> Tuple[List[scan.Root], int, List[Range]]:
    """Roots for every object's writable data but the tracer's; the number of objects;
    the core's segments (empty on a live process)."""
    objects, core = _sections()
    excluded = [
        path for path, ranges in objects.items()
        if any(start <= tracer_address < end for start, end in ranges)
    ]
    ranges: List[Range] = []
    counted = 0
    for path, rs in objects.items():
        if path in excluded:
            continue
        if not _is_debug_file(path):
            counted += 1
        ranges += rs
    # A debug file of the tracer lists the tracer's sections again: drop those too.
    dropped = [r for path in excluded for r in objects[path]]
    roots = [
        scan.Root("object data", start, end) for start, end in memory.merge_ranges(ranges)
        if not any(start < d_end and d_start < end for d_start, d_end in dropped)
    ]
    return roots, counted, core


def _live_mappings() -> List[Range]:
    return [(m.start, m.end) for m in memory.gdb_listing()]


def _probe_end(reader: memory.InferiorReader, sp: int) -> int:
    """The end of the readable pages from ``sp`` up (at most MAX_PROBED_STACK bytes)."""
    page = sp & ~4095
    limit = sp + MAX_PROBED_STACK
    while page < limit:
        try:
            reader.read(page, 1)
        except MemTraceError:
            break
        page += 4096
    return max(page, sp)


def thread_roots(reader: memory.InferiorReader, mappings: List[Range]
                 ) -> Tuple[List[scan.Root], List[int], int]:
    """Each thread's stack range (bounded by the mapping that holds its stack pointer, when
    ``mappings`` has one) and registers, read with the thread selected; the user's thread
    and frame are selected again afterwards."""
    inferior = gdb.selected_inferior()
    try:
        saved_thread = gdb.selected_thread()
    except gdb.error:
        saved_thread = None
    try:
        saved_frame = gdb.selected_frame()
    except gdb.error:
        saved_frame = None
    roots: List[scan.Root] = []
    values: List[int] = []
    sets = 0
    try:
        for thread in inferior.threads():
            if not thread.is_valid():
                continue
            thread.switch()
            try:
                frame = gdb.newest_frame()
                regs = [int(frame.read_register(r)) & MASK64 for r in REGISTERS]
            except (gdb.error, ValueError):
                continue
            sets += 1
            values += regs
            sp = regs[REGISTERS.index("rsp")]
            end = next((e for s, e in mappings if s <= sp < e), None)
            start = sp - RED_ZONE
            if end is None:
                end = _probe_end(reader, sp)
            else:
                start = max(start, next(s for s, e in mappings if s <= sp < e))
            roots.append(scan.Root(f"the stack of gdb thread {thread.num}", start, end))
    finally:
        if saved_thread is not None and saved_thread.is_valid():
            saved_thread.switch()
        if saved_frame is not None and saved_frame.is_valid():
            saved_frame.select()
    return roots, values, sets


parser = ArgumentParser(
    prog="mtrace-leaks",
    description=("List the live blocks definitely lost, possibly lost and still reachable, "
                 "by allocation stack."),
    epilog=(
        "A conservative scan, as memcheck does it, by reading memory only, with the\n"
        "rules of the profiler's exit report (same program, same classes). From the\n"
        "roots (the writable data of every loaded object but libmem_trace.so, every\n"
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
        "Not scanned: the main thread's static TLS and memory the program mapped\n"
        "itself. Works without the profiler feature, live and on core files.\n"
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
        tracer = memory.open_tracer()
        reader = tracer.reader
        blocks = list(tracer.blocks())
        roots, objects, segments = data_roots(tracer.header.address)
        # A core's segments, or the live process's mappings, listed once for both scans.
        mappings = segments or _live_mappings()
        stacks, registers, sets = thread_roots(reader, mappings)
        dtvs = scan.dtv_words(reader, mappings, blocks)
        result = scan.scan(reader, blocks, roots + stacks, registers + dtvs)
        facts = leaks.LeakFacts.from_scan(result, objects, len(stacks), sets,
                                          tracer.header.untracked)
        out = leaks.lines(facts, lookups(tracer, args.raw), args.count or None,
                          args.frames or None, reachable=not args.no_reachable)
        return out + sampled_leaks_lines(tracer.header.sample_mean)


def sampled_leaks_lines(mean: int) -> List[str]:
    """What a leak check can claim when the process samples (the twin of the Rust
    reader's `sampled_leaks_line`)."""
    if not mean:
        return []
    return [
        f"(sampled: this process samples {sample.rate(mean)} (MEM_TRACE_SAMPLE), so only "
        "sampled blocks were checked, each counted once; a block reachable only through "
        "unsampled blocks shows as lost, so \"definitely lost\" is an upper bound and misses "
        "unsampled leaks)"
    ]
