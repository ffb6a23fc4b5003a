"""python workload: dicts of tuples and lists of strings, built and dropped.

Run with PYTHONMALLOC=malloc so every object allocation reaches malloc (and
the preloaded tracer) instead of pymalloc's arenas.  Deterministic: prints a
checksum that must not change under tracing.
"""
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40


def build(r):
    table = {}
    for i in range(5000):
        key = "k%d-%d" % (r, i)
        table[key] = (i, r, key[::-1], float(i) / 3)
    names = [str(i * r) + "-" + str(i) for i in range(5000)]
    groups = {}
    for name in names:
        groups.setdefault(len(name), []).append(name.upper())
    return table, names, groups


def digest(table, names, groups):
    h = 0
    for key, (i, r, rev, f) in table.items():
        h = (h * 31 + i + r + len(rev) + int(f)) & 0xFFFFFFFFFFFF
    h ^= sum(len(n) for n in names)
    for k in sorted(groups):
        h = (h * 131 + k * len(groups[k])) & 0xFFFFFFFFFFFF
    return h


def main():
    total = 0
    keep = []
    for r in range(ROUNDS):
        t, n, g = build(r)
        total = (total * 1000003 + digest(t, n, g)) & 0xFFFFFFFFFFFFFFFF
        # Keep a few generations alive so the heap does not just recycle
        # one round's blocks.
        keep.append((t, n))
        if len(keep) > 3:
            keep.pop(0)
    print("python rounds=%d checksum=%016x" % (ROUNDS, total))


main()
