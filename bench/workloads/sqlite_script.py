"""Writes the SQL script of the sqlite3 workload to the path given as argv[1].

400k rows: most come from a recursive CTE (cheap to parse, so the time goes
into the b-tree and page cache), the last 80k from batched INSERT ... VALUES
statements, whose parsing adds the many small short-lived allocations real
SQL front ends make.  Then two indexes, updates, a join with GROUP BY and a
self-join through an index.  About 1.6M allocation calls in all (heaptrack
1.4 count with sqlite 3.40).  Every query result goes to stdout, which is the
checksum compared across configurations.
"""
import sys

ROWS = 400_000
CTE_ROWS = 320_000
BATCH = 500


def item_values(i):
    return "(%d,%d,'item-%d',%d.25)" % (i, (i * 7919) % 1000, (i * 2654435761) % 1000003, (i * 37) % 1000)


def script():
    out = [
        "CREATE TABLE item(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, price REAL);",
        "CREATE TABLE grp(id INTEGER PRIMARY KEY, label TEXT, weight INTEGER);",
        "BEGIN;",
        # Same formulas as item_values(), so both halves look alike.
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<%d) "
        "INSERT INTO item SELECT x, (x*7919)%%1000, 'item-'||((x*2654435761)%%1000003), "
        "((x*37)%%1000)+0.25 FROM c;" % CTE_ROWS,
    ]
    for b in range(CTE_ROWS, ROWS, BATCH):
        rows = ",".join(item_values(i) for i in range(b + 1, b + BATCH + 1))
        out.append("INSERT INTO item VALUES %s;" % rows)
    out += [
        "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x+1 FROM c WHERE x<999) "
        "INSERT INTO grp SELECT x, 'group-'||x, x%17 FROM c;",
        "COMMIT;",
        "CREATE INDEX item_grp ON item(grp);",
        "CREATE INDEX item_name ON item(name);",
        "UPDATE item SET price = price*1.5 WHERE grp % 3 = 0;",
        "UPDATE item SET name = name || '-x' WHERE id % 7 = 0;",
        "SELECT count(*), sum(price) FROM item;",
        "SELECT g.weight, count(*), round(sum(i.price),2), max(i.name) FROM item i "
        "JOIN grp g ON i.grp = g.id GROUP BY g.weight ORDER BY g.weight;",
        "SELECT count(*), sum(b.id % 1000) FROM item a JOIN item b ON b.grp = a.grp + 1 "
        "WHERE a.id % 1000 = 0;",
        "DELETE FROM item WHERE grp < 100;",
        "SELECT count(*), total(price) FROM item;",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write(script())
