//! Frame names on Debian's own stripped sqlite3 (no -dbgsym): a name only where its symbol
//! reaches, `module+0xoffset` elsewhere, and the same spelling from the library's report,
//! `mem-trace top/why` on a core and gdb's `mtrace-top`/`mtrace-why` on that core.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mtrace::comparable_with_gdb;
use common::{
    gcore, manifest_dir, mem_trace_binary, profiler_library, run_with_timeout, target_dir, Output,
    GDB_TIMEOUT,
};

const SQLITE3: &str = "/usr/bin/sqlite3";
const MARKER: &str = "zq-names-marker";

/// Rows in a table and an index, a marker string to find in the heap, then a line to wait on.
fn script() -> String {
    format!(
        "CREATE TABLE person(id INTEGER PRIMARY KEY, name TEXT NOT NULL, team INTEGER);
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 3000)
  INSERT INTO person SELECT x, 'person-' || x, x % 37 FROM n;
CREATE INDEX person_name ON person(name);
INSERT INTO person VALUES(9999, '{MARKER}', 1);
SELECT count(*) FROM person;
SELECT 'ready';
"
    )
}

/// A file-backed mapping of the process: (start, file offset, path).
fn file_mappings(pid: u32) -> Vec<(u64, u64, String)> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f.get(5)?;
            if !path.starts_with('/') {
                return None;
            }
            let start = u64::from_str_radix(f[0].split('-').next()?, 16).ok()?;
            let offset = u64::from_str_radix(f[2], 16).ok()?;
            Some((start, offset, path.to_string()))
        })
        .collect()
}

/// Addresses of the marker in the process's anonymous writable memory (heap blocks).
fn marker_addresses(pid: u32) -> Vec<u64> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let mut mem = fs::File::open(format!("/proc/{pid}/mem")).expect("open /proc/PID/mem");
    let mut found = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let anonymous = f.len() == 5 || f.get(5) == Some(&"[heap]");
        if !anonymous || !f[1].starts_with("rw") {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        if e - s > 64 << 20 {
            continue;
        }
        let mut buf = vec![0u8; (e - s) as usize];
        if mem.seek(SeekFrom::Start(s)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        let needle = MARKER.as_bytes();
        found.extend(
            buf.windows(needle.len())
                .enumerate()
                .filter(|(_, w)| *w == needle)
                .map(|(i, _)| s + i as u64),
        );
    }
    found
}

/// `nm -D --defined-only -S FILE`: each dynamic symbol's name and (value, size), read
/// independently of the symbolizer.
fn symbol_sizes(path: &str) -> HashMap<String, Vec<(u64, u64)>> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "-S", path])
        .output()
        .expect("run nm");
    assert!(out.status.success(), "nm -D {path} failed");
    let mut map: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (value, size, name) = match f.as_slice() {
            [v, s, _, n] => (v, Some(s), n),
            [v, _, n] => (v, None, n),
            _ => continue,
        };
        let value = u64::from_str_radix(value, 16).unwrap();
        let size = size.map_or(0, |s| u64::from_str_radix(s, 16).unwrap());
        let name = name.split('@').next().unwrap().to_string();
        map.entry(name).or_default().push((value, size));
    }
    map
}

fn mem_trace(dir: &Path, label: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args).current_dir(dir).env_remove("LD_PRELOAD");
    let out = run_with_timeout(
        cmd,
        &dir.join(label),
        false,
        None,
        Duration::from_secs(120),
        label,
    );
    assert!(out.success(), "{}", out.describe());
    out
}

/// What one frame line of `top`/`why` (`#N 0xPC in X ...`) or of a report (`N: X`, `N: 0xPC
/// (X)`) names: the function, `name+0xoff` or `module+0xoff`, or the bare address.
fn frame_token(line: &str) -> Option<String> {
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix('#') {
        let (n, rest) = rest.split_once(' ')?;
        n.parse::<u32>().ok()?;
        let rest = rest.split_once(" at ").map_or(rest, |(f, _)| f);
        let rest = rest.split_once(" from ").map_or(rest, |(f, _)| f);
        let rest = rest.trim_end_matches(" (inlined)");
        return Some(match rest.split_once(" in ") {
            Some((_, name)) => name.to_string(),
            None => rest.to_string(),
        });
    }
    let (n, rest) = t.split_once(": ")?;
    n.parse::<u32>().ok()?;
    let rest = rest.trim_end_matches(" (inlined)");
    if let Some((_, inner)) = rest.split_once(" (") {
        return Some(inner.trim_end_matches(')').to_string());
    }
    Some(rest.to_string())
}

/// The stacks of a `top` answer or of a report's top-stacks section, each as its frames'
/// tokens, as a set (ties may rank in another order).
fn stacks(text: &str, report: bool) -> BTreeSet<Vec<String>> {
    let mut all = BTreeSet::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        if report && line.starts_with("mem-trace: ") && current.is_some() {
            break; // the top-stacks section ends at the next report line
        }
        if line.starts_with("# ") {
            all.extend(current.take());
            current = Some(Vec::new());
        } else if let (Some(c), Some(tok)) = (current.as_mut(), frame_token(line)) {
            c.push(tok);
        }
    }
    all.extend(current);
    all
}

/// Of the distinct return addresses an answer's frames show, how many have no name
/// (`module+0xoffset`), and how many there are.
fn unnamed_return_addresses(answer: &str) -> (usize, usize) {
    let mut named: BTreeMap<&str, bool> = BTreeMap::new();
    for l in answer.lines().filter(|l| is_frame_line(l)) {
        let pc = l.split_whitespace().nth(1).unwrap();
        let unnamed = l.contains("+0x") && !l.contains(" from ") && !l.contains(" at ");
        *named.entry(pc).or_insert(false) |= !unnamed;
    }
    let bare = named.values().filter(|&&n| !n).count();
    (bare, named.len())
}

/// Whether `line` is a frame of a `top`/`why` answer (`    #N 0xPC ...`).
fn is_frame_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    words.next().is_some_and(|w| w.starts_with('#'))
        && words.next().is_some_and(|w| w.starts_with("0x"))
}

#[test]
fn sqlite3_frames_are_named_only_within_their_symbols_everywhere() {
    assert!(
        Path::new(SQLITE3).is_file(),
        "{SQLITE3} is missing: install Debian's sqlite3 (README lists the test packages)"
    );
    let dir = target_dir().join("mem-trace-tests").join("real_names");
    let reports = dir.join("reports");
    let _ = fs::remove_dir_all(&reports);
    fs::create_dir_all(&reports).expect("create the reports directory");
    let core = dir.join("sqlite3.core");

    let mut child = Command::new(SQLITE3)
        .arg(":memory:")
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_OUT", &reports)
        .env("MEM_TRACE_PROFILE_INTERVAL", "0")
        .env("MEM_TRACE_PROFILE_TOP", "10000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(dir.join("sqlite3.stderr")).unwrap())
        .spawn()
        .expect("start sqlite3");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script().as_bytes()).unwrap();
    stdin.flush().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "sqlite3 ended before `ready`"
        );
    }
    // A full report now, from the process itself, of what the core will hold.
    Command::new("kill")
        .args(["-USR2", &pid.to_string()])
        .status()
        .unwrap();
    let report_path = reports.join(format!("mem-trace.{pid}.1.txt"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let report = loop {
        let text = fs::read_to_string(&report_path).unwrap_or_default();
        if text.contains("mem-trace: end of report 1") {
            break text;
        }
        assert!(Instant::now() < deadline, "no snapshot report in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mappings = file_mappings(pid);
    let markers = marker_addresses(pid);
    gcore(pid, &core, &dir.join("gcore"));
    drop(stdin);
    let _ = child.wait();
    assert!(!markers.is_empty(), "the marker is not in the heap");

    let core_arg = core.to_str().unwrap();
    let top = mem_trace(&dir, "top", &["top", core_arg, "10000", "--frames", "0"]);
    let whys: Vec<(u64, Output)> = markers
        .iter()
        .take(12)
        .map(|&a| {
            let label = format!("why-{a:#x}");
            (
                a,
                mem_trace(&dir, &label, &["why", core_arg, &format!("{a:#x}")]),
            )
        })
        .collect();

    // 1. Every frame named from the symbol table lies within its symbol, by nm's sizes, and
    //    every module+0xoffset frame is the address as its file states it, where no sized
    //    symbol would have named it.
    let module_of = |name: &str| -> (String, u64) {
        let path = mappings
            .iter()
            .find(|(_, _, p)| p.rsplit('/').next() == Some(name))
            .map(|(_, _, p)| p.clone())
            .unwrap_or_else(|| panic!("no mapping of {name}"));
        let bias = mappings
            .iter()
            .filter(|(_, off, p)| *p == path && *off == 0)
            .map(|(s, _, _)| *s)
            .min()
            .unwrap();
        (path, bias)
    };
    let mut sizes: BTreeMap<String, HashMap<String, Vec<(u64, u64)>>> = BTreeMap::new();
    let (mut named, mut unnamed) = (0, 0);
    let frame_lines = top
        .stdout
        .lines()
        .chain(whys.iter().flat_map(|(_, o)| o.stdout.lines()))
        .filter(|l| is_frame_line(l) && !l.contains(" at "));
    for l in frame_lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        // `#N 0xPC in name+0xOFF from MODULE` or `#N 0xPC in MODULE+0xOFF`.
        let pc = u64::from_str_radix(words[1].trim_start_matches("0x"), 16).unwrap();
        let Some(spelled) = words.get(3) else {
            continue;
        };
        let (name, off) = spelled.rsplit_once("+0x").expect("name+0xoffset");
        let off = u64::from_str_radix(off, 16).unwrap();
        let module = if words.get(4) == Some(&"from") {
            words[5]
        } else {
            name
        };
        let (path, bias) = module_of(module);
        let table = sizes
            .entry(path.clone())
            .or_insert_with(|| symbol_sizes(&path));
        let stated = pc - bias;
        let probe = stated - 1;
        if module == name {
            unnamed += 1;
            assert_eq!(off, stated, "{l}: not the address as {path} states it");
            for (sym, entries) in table.iter() {
                for &(value, size) in entries {
                    assert!(
                        !(value <= probe && probe < value + size),
                        "{l}: {sym} ({value:#x}, {size} bytes) holds it but was not named"
                    );
                }
            }
        } else {
            named += 1;
            let entries = table
                .get(name)
                .unwrap_or_else(|| panic!("{l}: {name} is not a symbol of {path}"));
            assert!(
                entries.iter().any(|&(value, size)| value <= probe
                    && probe < value + size
                    && off == stated - value),
                "{l}: {name} {entries:x?} does not hold {probe:#x} at offset {off:#x}"
            );
        }
    }
    assert!(
        named > 0 && unnamed > 0,
        "expected frames of both kinds: {named} named, {unnamed} unnamed\n{}",
        top.stdout
    );
    for far in ["sqlite3ApiExit+", "sqlite3BtreeLeaveCursor+"] {
        assert!(
            !top.stdout.contains(far),
            "{far} named a frame past its end"
        );
    }

    // 2. The library's own report, taken just before the core, shows the same stacks with
    //    the same frame names as `mem-trace top` on the core.
    let report_top = report
        .split_once("mem-trace: top ")
        .expect("a top-stacks section")
        .1;
    assert_eq!(
        stacks(report_top, true),
        stacks(&top.stdout, false),
        "the report's stacks differ from `mem-trace top` on its core\n{report}"
    );

    // 3. gdb's commands on the core answer line for line as `mem-trace` does (glibc's own
    //    frames compared without their file:line, which two DWARF readers spell apart).
    let mut gdb_script = format!(
        "set debuginfod enabled off\nsource {}\n",
        manifest_dir().join("gdb").join("mem_trace.py").display()
    );
    gdb_script += "echo === top\\n\nmtrace-top 10000 --frames 0\n";
    for (a, _) in &whys {
        gdb_script += &format!("echo === why {a:#x}\\n\nmtrace-why {a:#x}\n");
    }
    gdb_script += "echo === end\\n\n";
    let script_path = dir.join("names.gdb");
    fs::write(&script_path, gdb_script).unwrap();
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", SQLITE3, core_arg, "-x"])
        .arg(&script_path)
        .env_remove("LD_PRELOAD");
    let gdb = run_with_timeout(cmd, &dir.join("gdb"), false, None, GDB_TIMEOUT, "gdb");
    let section = |name: &str| -> Vec<String> {
        gdb.stdout
            .lines()
            .skip_while(|l| l.trim() != format!("=== {name}"))
            .skip(1)
            .take_while(|l| !l.starts_with("=== "))
            .map(|l| comparable_with_gdb(l, "\0"))
            .collect()
    };
    let ours = |text: &str| -> Vec<String> {
        text.lines().map(|l| comparable_with_gdb(l, "\0")).collect()
    };
    assert_eq!(
        section("top"),
        ours(&top.stdout),
        "mtrace-top differs from `mem-trace top`\n{}",
        gdb.describe()
    );
    for (a, why) in &whys {
        assert_eq!(
            section(&format!("why {a:#x}")),
            ours(&why.stdout),
            "mtrace-why differs from `mem-trace why`\n{}",
            gdb.describe()
        );
    }
    assert!(
        whys.iter()
            .any(|(_, o)| o.stdout.contains(" bytes inside a ") && o.stdout.contains("libsqlite3")),
        "no marker found in a block sqlite allocated"
    );

    // 4. Where most frames have no name, one line says how to get names: `top` and `why`
    //    count each return address once, the report each frame it writes.
    let mut hinted = 0;
    for answer in std::iter::once(&top).chain(whys.iter().map(|(_, o)| o)) {
        let (bare, total) = unnamed_return_addresses(&answer.stdout);
        let hint = format!(
            "mem-trace: {bare} of {total} frames have no name; install the debug symbols of "
        );
        assert_eq!(
            answer.stderr.contains(&hint),
            bare * 2 > total,
            "{hint}\n{}",
            answer.describe()
        );
        hinted += usize::from(bare * 2 > total);
    }
    assert!(hinted > 0, "no answer had mostly unnamed frames");
    let report_frames: Vec<&str> = report
        .lines()
        .filter(|l| frame_token(l).is_some() && !l.trim_start().starts_with('#'))
        .filter(|l| !l.ends_with(" (inlined)"))
        .collect();
    let report_bare = report_frames
        .iter()
        .filter(|l| l.trim_start().split_once(": ").unwrap().1.starts_with("0x"))
        .count();
    let report_hint = format!(
        "mem-trace: {report_bare} of {} frames have no name; install the debug symbols of ",
        report_frames.len()
    );
    assert_eq!(
        report.contains(&report_hint),
        report_bare * 2 > report_frames.len(),
        "{report_hint}\n{report}"
    );
}
