//! Unmodified real programs under the preload give exactly the output they give without it.

mod common;

use std::fs;
use std::path::PathBuf;

use common::{target_dir, Job};

fn work_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("mem-trace-tests").join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// A few thousand inserts (a recursive CTE), two indexes, a join, an update.
const SQL: &str = "\
CREATE TABLE person(id INTEGER PRIMARY KEY, name TEXT NOT NULL, team INTEGER, score REAL);
CREATE TABLE team(id INTEGER PRIMARY KEY, label TEXT NOT NULL);
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000)
  INSERT INTO person SELECT x, 'person-' || x, x % 37, (x * 7919) % 1000 / 10.0 FROM n;
WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < 36)
  INSERT INTO team SELECT x, printf('team-%02d', x) FROM n;
CREATE INDEX person_team ON person(team);
CREATE INDEX person_name ON person(name);
UPDATE person SET score = score * 2 WHERE team % 3 = 0;
SELECT count(*), sum(score), max(length(name)) FROM person;
SELECT t.label, count(*), round(sum(p.score), 1)
  FROM person p JOIN team t ON p.team = t.id
  GROUP BY t.label ORDER BY t.label;
SELECT name FROM person WHERE name LIKE 'person-49%' ORDER BY name LIMIT 5;
SELECT group_concat(id) FROM (SELECT id FROM person WHERE team = 5 ORDER BY score DESC, id LIMIT 10);
";

#[test]
fn sqlite3_gives_the_same_output() {
    let dir = work_dir("sqlite3");
    let script = dir.join("script.sql");
    fs::write(&script, SQL).expect("write script.sql");
    let mut job = Job::new("sqlite3", "sqlite3");
    job.args.push(":memory:".into());
    job.stdin = Some(script);
    job.log_dir = Some(dir);
    let traced = job.assert_same_with_preload();
    assert!(
        traced.stdout.starts_with("5000|"),
        "unexpected sqlite3 output\n{}",
        traced.describe()
    );
    assert!(
        traced.stdout.contains("team-36|"),
        "the join is missing\n{}",
        traced.describe()
    );
}

/// Dicts, lists, strings; with PYTHONMALLOC=malloc every object goes through our hooks.
const PYTHON: &str = r#"
import json
words = {}
for i in range(20000):
    key = "w%d" % (i % 997)
    words.setdefault(key, []).append(str(i) * (i % 7))
text = " ".join(sorted(words))
total = sum(len(v) for v in words.values())
squares = [i * i for i in range(50000)]
del squares[::3]
nested = {str(k): {"list": list(range(k % 50)), "s": "x" * k} for k in range(3000)}
blob = json.dumps(nested, sort_keys=True)
print(len(words), total, len(text), text[:40])
print(len(squares), sum(squares) % 1000003)
print(len(blob), len(json.loads(blob)))
"#;

#[test]
fn python3_gives_the_same_output() {
    let dir = work_dir("python3");
    let script = dir.join("job.py");
    fs::write(&script, PYTHON).expect("write job.py");
    let mut job = Job::new("/usr/bin/python3", "python3");
    job.args = vec!["-I".into(), script.display().to_string()];
    job.env.push(("PYTHONMALLOC".into(), "malloc".into()));
    job.log_dir = Some(dir);
    let traced = job.assert_same_with_preload();
    assert!(
        traced.stdout.starts_with("997 "),
        "unexpected python3 output\n{}",
        traced.describe()
    );
}
