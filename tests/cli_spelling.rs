//! One idea, one spelling: every `mem-trace` subcommand that has an option for one of these
//! spells it alike, as its `--help` shows it to a user:
//!
//! | idea | option |
//! | --- | --- |
//! | frames per stack | `-f, --frames <N>` |
//! | how many entries to list | `-n, --count <N>` |
//! | what the tracer records | `--mode <MODE>` |
//! | sampling | `--sample <BYTES>` |
//! | where the output goes | `-o, --output <...>` |
//!
//! and the line that says a stack was cut names that option, in the `mem-trace` answers and
//! in gdb's `mtrace-*` commands alike, on the same core (of `tests/fixtures/profile_sites.c`,
//! taken as it exits). The spellings these replaced (`why -n/--max-frames`, `history -n`,
//! `top TARGET N`) still give the same answers.

mod common;

use common::{c_fixture, gcore_at_exit_group, mem_trace_binary, run_with_timeout, Output};
use std::path::Path;
use std::process::Command;

/// One option as `--help` lists it.
#[derive(Debug)]
struct Opt {
    short: Option<String>,
    long: String,
    value: Option<String>,
    help: String,
}

/// `mem-trace ARGS`, its logs in `logs` as `LABEL.*`.
fn mem_trace(logs: &Path, label: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args)
        .current_dir(logs)
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .env("XDG_CACHE_HOME", logs.join("cache"));
    run_with_timeout(
        cmd,
        &logs.join(label),
        false,
        None,
        common::GDB_TIMEOUT,
        &format!("mem-trace {}", args.join(" ")),
    )
}

/// `mem-trace ARGS`'s standard output; it must succeed.
fn answer(logs: &Path, label: &str, args: &[&str]) -> String {
    let out = mem_trace(logs, label, args);
    assert!(out.success(), "{}", out.describe());
    out.stdout
}

/// The subcommands `mem-trace --help` lists (but `help`).
fn subcommands(logs: &Path) -> Vec<String> {
    let help = answer(logs, "help", &["--help"]);
    let listed = help
        .split_once("Commands:\n")
        .expect("a Commands: section")
        .1;
    listed
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect()
}

/// The options of `mem-trace SUB --help`, each with its whole help text, in either of clap's
/// layouts (the help on the option's line, or on the lines under it).
fn options(logs: &Path, sub: &str) -> Vec<Opt> {
    let help = answer(logs, &format!("{sub}.help"), &[sub, "--help"]);
    let section = help
        .split_once("Options:\n")
        .unwrap_or_else(|| panic!("no Options: in `mem-trace {sub} --help`:\n{help}"))
        .1;
    let mut found: Vec<Opt> = Vec::new();
    for line in section.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if indent == 0 {
            // The text after the options (`after_help`).
            break;
        }
        if indent <= 6 && text.starts_with('-') {
            let (names, rest) = match text.find("  ") {
                Some(at) => (&text[..at], text[at..].trim()),
                None => (text, ""),
            };
            let mut opt = Opt {
                short: None,
                long: String::new(),
                value: None,
                help: rest.to_string(),
            };
            for word in names.split([',', ' ']).filter(|w| !w.is_empty()) {
                if let Some(v) = word.strip_prefix('<') {
                    opt.value = Some(v.trim_end_matches('>').to_string());
                } else if word.starts_with("--") {
                    opt.long = word.to_string();
                } else {
                    opt.short = Some(word.to_string());
                }
            }
            found.push(opt);
        } else if let Some(last) = found.last_mut() {
            last.help.push(' ');
            last.help.push_str(text);
        }
    }
    found
}

fn spelled(opt: &Opt) -> String {
    match &opt.short {
        Some(s) => format!("{s}, {}", opt.long),
        None => opt.long.clone(),
    }
}

#[test]
fn every_subcommand_spells_the_shared_options_alike() {
    let logs = common::scratch_dir("cli_spelling", "help");
    let subs = subcommands(&logs);
    assert!(
        subs.len() >= 15 && subs.iter().any(|s| s == "attach"),
        "{subs:?}"
    );
    let mut with_frames = Vec::new();
    let mut with_count = Vec::new();
    for sub in &subs {
        let opts = options(&logs, sub);
        assert!(
            opts.iter().any(|o| o.long == "--help"),
            "{sub}: no --help among {opts:?}"
        );
        for o in &opts {
            let help = o.help.to_lowercase();
            let what = format!("mem-trace {sub} {}: {}", spelled(o), o.help);
            assert!(
                !o.long.contains("max-frames") && o.long != "--out",
                "{what}: a spelling replaced by the shared one"
            );
            if help.contains("frames") {
                assert_eq!(spelled(o), "-f, --frames", "{what}");
                assert_eq!(o.value.as_deref(), Some("N"), "{what}");
                with_frames.push(sub.clone());
            }
            // A count of entries: how many to list, show or make.
            let counts = help.starts_with("how many")
                || help.contains(" to show")
                || help.contains("this many");
            if counts || o.long == "--count" || o.short.as_deref() == Some("-n") {
                assert_eq!(spelled(o), "-n, --count", "{what}");
                assert_eq!(o.value.as_deref(), Some("N"), "{what}");
                with_count.push(sub.clone());
            }
            if help.starts_with("what the tracer records") || o.long == "--mode" {
                assert_eq!(spelled(o), "--mode", "{what}");
            }
            if help.contains("mem_trace_sample") || o.long == "--sample" {
                assert_eq!(spelled(o), "--sample", "{what}");
                assert_eq!(o.value.as_deref(), Some("BYTES"), "{what}");
            }
            if o.long == "--output" || o.short.as_deref() == Some("-o") {
                assert_eq!(spelled(o), "-o, --output", "{what}");
            }
        }
    }
    // The checks above found the options where they are: a subcommand that lost one, or
    // renamed it beyond their reach, shows here.
    let has = |list: &[String], want: &[&str]| {
        let mut got: Vec<&str> = list.iter().map(String::as_str).collect();
        got.sort_unstable();
        let mut want = want.to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
    };
    has(
        &with_frames,
        &["attach", "history", "leaks", "peaks", "run", "top", "why"],
    );
    has(&with_count, &["leaks", "peaks", "push", "top"]);
    for (sub, modes) in [("run", true), ("attach", true), ("top", false)] {
        let opts = options(&logs, sub);
        assert_eq!(opts.iter().any(|o| o.long == "--mode"), modes, "{sub}");
        assert_eq!(opts.iter().any(|o| o.long == "--sample"), modes, "{sub}");
    }
    for sub in ["run", "attach", "flamegraph", "dhat", "pprof"] {
        assert!(
            options(&logs, sub).iter().any(|o| o.long == "--output"),
            "{sub} has no -o, --output"
        );
    }
}

/// `run` and `attach` start the tracer in the same mode when not told, and say which and why;
/// an attached tracer's help promises no quarantine.
#[test]
fn run_and_attach_default_to_the_same_mode() {
    let logs = common::scratch_dir("cli_spelling", "modes");
    for sub in ["run", "attach"] {
        let mode = options(&logs, sub)
            .into_iter()
            .find(|o| o.long == "--mode")
            .unwrap_or_else(|| panic!("{sub}: no --mode"));
        assert!(
            mode.help.contains("else profile") || mode.help.contains("Default: profile"),
            "{sub}: {}",
            mode.help
        );
        assert!(
            mode.help.contains("half"),
            "{sub} says not why: {}",
            mode.help
        );
    }
    let attach = answer(&logs, "attach.help", &["attach", "--help"]);
    let promised = attach
        .to_lowercase()
        .replace("holds no quarantine", "")
        .contains("quarantine");
    assert!(!promised, "attach --help promises a quarantine:\n{attach}");
}

/// The cut stacks of every answer name `--frames`, the option that shows more, and that option
/// (or the spelling it replaced) does what the line says; gdb's commands say the same on the
/// same core, `mem-trace gdb CORE` finding the executable by itself.
#[test]
fn cut_stacks_name_the_frames_option_everywhere() {
    let f = c_fixture("profile_sites.c", &[]);
    let logs = common::scratch_dir("cli_spelling", "cut");
    let core = logs.join("profile_sites.core");
    gcore_at_exit_group(&f, &[], &core, &logs.join("gcore"));
    let core = core.to_str().expect("a UTF-8 path");
    let cut = "    ... (--frames 1)";
    let cuts = |text: &str| text.lines().filter(|l| l.starts_with("    ... (")).count();

    let top = answer(&logs, "top", &["top", core, "-n", "2", "-f", "1"]);
    assert_eq!(cuts(&top), 2, "{top}");
    assert_eq!(top.matches(cut).count(), 2, "{top}");
    let top_word = answer(&logs, "top-word", &["top", core, "2", "-f", "1"]);
    assert_eq!(top_word, top, "`top CORE 2` is `top CORE -n 2`");

    let peaks = answer(&logs, "peaks", &["peaks", core, "-n", "1", "-f", "1"]);
    assert!(peaks.contains(cut), "{peaks}");
    assert_eq!(cuts(&peaks), peaks.matches(cut).count(), "{peaks}");

    let leaks = answer(&logs, "leaks", &["leaks", core, "-n", "1", "-f", "1"]);
    assert!(leaks.contains(cut), "{leaks}");
    assert_eq!(cuts(&leaks), leaks.matches(cut).count(), "{leaks}");
    for header in [
        "definitely lost: 1 stack, biggest first:",
        "still reachable: ",
    ] {
        assert!(
            leaks.lines().any(|l| l.starts_with(header)),
            "no {header:?}\n{leaks}"
        );
    }
    assert!(
        leaks
            .lines()
            .any(|l| l.starts_with("still reachable: ") && l.ends_with(" stacks, biggest first:")),
        "{leaks}"
    );

    // gdb on the core alone: the executable from the core's notes. The address of a held
    // block, and the gdb commands' answers, between markers.
    let gdb = mem_trace(
        &logs,
        "gdb",
        &[
            "gdb",
            "-nx",
            "-batch",
            "-ex",
            "print/x (unsigned long)held[5]",
            "-ex",
            "echo === why\\n",
            "-ex",
            "mtrace-why -f 1 held[5]",
            "-ex",
            "echo === history\\n",
            "-ex",
            "mtrace-history -n 1 held[5]",
            "-ex",
            "echo === top\\n",
            "-ex",
            "mtrace-top -n 2 -f 1",
            "-ex",
            "echo === end\\n",
            core,
        ],
    );
    assert!(gdb.success(), "{}", gdb.describe());
    let address = gdb
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("$1 = "))
        .unwrap_or_else(|| panic!("no held[5]\n{}", gdb.describe()))
        .trim()
        .to_string();
    let between = |start: &str, end: &str| -> String {
        let from = gdb.stdout.split_once(start).map_or("", |s| s.1);
        from.split_once(end).map_or(from, |s| s.0).to_string()
    };
    let gdb_why = between("=== why\n", "=== history");
    assert_eq!(gdb_why.matches(cut).count(), 1, "{}", gdb.describe());
    // Every event at the address has its stack cut (a block freed there before has two).
    let gdb_history = between("=== history\n", "=== top");
    assert!(
        cuts(&gdb_history) >= 1 && cuts(&gdb_history) == gdb_history.matches(cut).count(),
        "{}",
        gdb.describe()
    );
    assert_eq!(
        between("=== top\n", "=== end").matches(cut).count(),
        2,
        "{}",
        gdb.describe()
    );

    let why = answer(&logs, "why", &["why", core, &address, "-f", "1"]);
    assert_eq!(why.matches(cut).count(), 1, "{why}");
    assert_eq!(
        why.lines().last(),
        gdb_why.lines().last(),
        "mtrace-why and mem-trace why cut alike\n{why}\n{gdb_why}"
    );
    for old in ["-n", "--max-frames"] {
        let again = answer(
            &logs,
            &format!("why{old}"),
            &["why", core, &address, old, "1"],
        );
        assert_eq!(again, why, "why {old} 1");
    }
    let whole = answer(&logs, "why-whole", &["why", core, &address]);
    assert_eq!(
        cuts(&whole),
        0,
        "why shows whole stacks unless asked\n{whole}"
    );
    assert_eq!(
        answer(&logs, "why-0", &["why", core, &address, "-f", "0"]),
        whole,
        "-f 0 is all, as everywhere"
    );

    let history = answer(&logs, "history", &["history", core, &address, "-f", "1"]);
    assert_eq!(
        cuts(&history),
        cuts(&gdb_history),
        "{history}\n{gdb_history}"
    );
    assert_eq!(cuts(&history), history.matches(cut).count(), "{history}");
    let old = answer(&logs, "history-n", &["history", core, &address, "-n", "1"]);
    assert_eq!(old, history, "history -n 1");
}
