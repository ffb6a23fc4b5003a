use super::*;

fn frames<'a>(names: &[&'a str]) -> Vec<Frame<'a>> {
    names
        .iter()
        .map(|&n| Frame {
            function: Some(n),
            object: Some("/tmp/prog"),
            file: Some("/src/prog.c"),
        })
        .collect()
}

fn one(text: &str) -> Suppression {
    let mut all = parse("t.supp", text).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0)
}

const STACK: &[&str] = &["lost_site", "leak", "main", "__libc_start_call_main"];

#[test]
fn valgrind_wildcards() {
    assert!(wildcard("mal*", "malloc"));
    assert!(wildcard("*alloc", "calloc"));
    assert!(wildcard("m?lloc", "malloc"));
    assert!(wildcard("*", ""));
    assert!(!wildcard("m?lloc", "mlloc"));
    assert!(wildcard("a*b*c", "aXbYbZc"));
    assert!(!wildcard("a*b*c", "aXbYbZ"));
    assert!(wildcard(
        "std::vector<int>::push_back\\*",
        "std::vector<int>::push_back*"
    ));
    assert!(!wildcard("x\\*", "xy"));
    // No exponential backtracking.
    let long = "a".repeat(5000);
    assert!(!wildcard("*a*a*a*a*a*a*a*b", &long));
}

#[test]
fn a_valgrind_stack_matches_from_the_allocation_function_out() {
    let s = frames(STACK);
    let block = |body: &str| one(&format!("{{\n  name\n  Memcheck:Leak\n{body}}}\n"));
    assert!(block("  fun:malloc\n  fun:lost_site\n  fun:leak\n").matches(LeakKind::Definite, &s));
    // A prefix is enough; a frame out of place is not.
    assert!(block("  fun:malloc\n").matches(LeakKind::Definite, &s));
    assert!(!block("  fun:malloc\n  fun:leak\n").matches(LeakKind::Definite, &s));
    assert!(!block("  fun:lost_site\n").matches(LeakKind::Definite, &s));
    // `...` takes any number of frames, the allocation function's included.
    assert!(block("  ...\n  fun:leak\n").matches(LeakKind::Definite, &s));
    assert!(block("  fun:*alloc\n  ...\n  fun:main\n").matches(LeakKind::Definite, &s));
    assert!(!block("  ...\n  fun:nowhere\n").matches(LeakKind::Definite, &s));
    // Which allocation function was called is not known: any of them stands for it.
    assert!(block("  fun:calloc\n  fun:lost_site\n").matches(LeakKind::Definite, &s));
    assert!(block("  fun:_Znwm\n  fun:lost_site\n").matches(LeakKind::Definite, &s));
    assert!(block("  obj:*vgpreload_memcheck*\n  obj:/tmp/prog\n").matches(LeakKind::Definite, &s));
    // Deeper than the stack goes: no match.
    let deep = "  fun:malloc\n  fun:lost_site\n  fun:leak\n  fun:main\n  fun:*\n  fun:*\n";
    assert!(!block(deep).matches(LeakKind::Definite, &s));
    // A symbol table's offset is no part of the name.
    let offsets = frames(&["lost_site+0x1f", "leak+0x9"]);
    assert!(
        block("  fun:malloc\n  fun:lost_site\n  fun:leak\n").matches(LeakKind::Definite, &offsets)
    );
}

#[test]
fn leak_kinds_limit_a_valgrind_suppression() {
    let s = frames(STACK);
    let kinds = |list: &str| {
        one(&format!(
            "{{\n  n\n  Memcheck:Leak\n  match-leak-kinds: {list}\n  fun:malloc\n}}\n"
        ))
    };
    assert!(kinds("definite,possible").matches(LeakKind::Possible, &s));
    assert!(!kinds("definite,possible").matches(LeakKind::Reachable, &s));
    assert!(kinds("all").matches(LeakKind::Indirect, &s));
    assert!(!kinds("none").matches(LeakKind::Definite, &s));
    let bad = parse(
        "k.supp",
        "{\n n\n Memcheck:Leak\n match-leak-kinds: lost\n}\n",
    );
    assert_eq!(
        bad.unwrap_err().to_string(),
        "k.supp:4: `lost` is no leak kind (definite, indirect, possible, reachable, all, none)"
    );
}

#[test]
fn lsan_patterns_match_any_frame_by_function_file_or_module() {
    let s = frames(STACK);
    let lsan = |p: &str| one(&format!("# a comment\nleak:{p}\n"));
    assert!(lsan("lost_site").matches(LeakKind::Definite, &s));
    assert!(lsan("lost").matches(LeakKind::Definite, &s));
    assert!(lsan("^lost").matches(LeakKind::Definite, &s));
    assert!(!lsan("^site").matches(LeakKind::Definite, &s));
    assert!(lsan("site$").matches(LeakKind::Definite, &s));
    assert!(lsan("l*_site").matches(LeakKind::Definite, &s));
    assert!(lsan("prog.c").matches(LeakKind::Definite, &s));
    assert!(lsan("/tmp/prog$").matches(LeakKind::Definite, &s));
    assert!(!lsan("nowhere").matches(LeakKind::Definite, &s));
    // Other sanitizers' types are read and left out.
    assert!(parse("l.supp", "called_from_lib:libfoo.so\nrace:bar\n")
        .unwrap()
        .is_empty());
    assert_eq!(
        parse("l.supp", "\nnot a suppression\n").unwrap_err().to_string(),
        "l.supp:2: `not a suppression` is neither a valgrind suppression (`{ ... }`) nor LeakSanitizer's `leak:PATTERN`"
    );
}

#[test]
fn bad_valgrind_files_are_named_by_line() {
    let unclosed = parse("u.supp", "{\n  name\n  Memcheck:Leak\n  fun:malloc\n");
    assert_eq!(
        unclosed.unwrap_err().to_string(),
        "u.supp:1: a suppression opened here is never closed with `}`"
    );
    let frame = parse("f.supp", "{\n  name\n  Memcheck:Leak\n  fn:malloc\n}\n");
    assert_eq!(
        frame.unwrap_err().to_string(),
        "f.supp:4: `fn:malloc` is no frame (`fun:`, `obj:`, `...`)"
    );
}

/// The suppressions CPython ships (Misc/valgrind-python.supp, installed by Debian's python3
/// as /usr/lib/valgrind/python3.supp) and valgrind's own default file read without error;
/// only their leak suppressions are kept.
#[test]
fn cpython_and_valgrind_files_read_whole() {
    let python = "/usr/lib/valgrind/python3.supp";
    let text = std::fs::read_to_string(python)
        .unwrap_or_else(|e| panic!("{python}: {e} (.ci/run installs python3)"));
    let all = parse(python, &text).unwrap();
    let blocks = text.lines().filter(|l| l.trim() == "{").count();
    let leaks = text.lines().filter(|l| l.trim() == "Memcheck:Leak").count();
    assert!(blocks > leaks && leaks > 0, "{blocks} {leaks}");
    assert_eq!(all.len(), leaks);
    // Its pthread one: calloc from allocate_dtv, under _dl_allocate_tls.
    let tls = frames(&[
        "allocate_dtv",
        "_dl_allocate_tls_storage",
        "_dl_allocate_tls",
    ]);
    assert!(all.iter().any(|s| s.matches(LeakKind::Possible, &tls)));
    let default = "/usr/libexec/valgrind/default.supp";
    let text = std::fs::read_to_string(default)
        .unwrap_or_else(|e| panic!("{default}: {e} (.ci/run installs valgrind)"));
    assert!(!parse(default, &text).unwrap().is_empty());
}

#[test]
fn a_generated_suppression_suppresses_its_leak_only() {
    let s = frames(STACK);
    let text = generate("lost_site leak", LeakKind::Definite, &s);
    assert_eq!(
        text,
        "{\n   lost_site leak\n   Memcheck:Leak\n   match-leak-kinds: definite\n   fun:*\n   fun:lost_site\n   fun:leak\n   fun:main\n   fun:__libc_start_call_main\n}\n"
    );
    let files = vec![("gen.supp".to_string(), text)];
    let mut supp = Suppressions::read(&files).unwrap();
    assert!(supp.suppress(LeakKind::Definite, &s, 300, 2).is_some());
    let other = frames(&["lost_site", "other", "main", "__libc_start_call_main"]);
    assert!(supp.suppress(LeakKind::Definite, &other, 1, 1).is_none());
    assert!(supp.suppress(LeakKind::Possible, &s, 1, 1).is_none());
    let used: Vec<Used> = supp.each().map(|(_, u)| u).collect();
    assert_eq!(
        used,
        [Used {
            leaks: 1,
            bytes: 300,
            blocks: 2
        }]
    );
}
