//! Raw reports written with the writing side's functions and converted back.

use super::*;

#[inline(never)]
fn marker_function() -> usize {
    core::hint::black_box(marker_function as *const () as usize)
}

/// This test binary as a module line: its path, load bias (a PIE's base) and a range that
/// holds its code.
fn own_module(out: &mut String) {
    let addr = marker_function();
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is writable; dladdr only fills it.
    let found = unsafe { libc::dladdr(addr as *const libc::c_void, info.as_mut_ptr()) };
    assert_ne!(found, 0);
    // SAFETY: dladdr succeeded, so `info` is filled.
    let base = unsafe { info.assume_init() }.dli_fbase as u64;
    let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
    let path = exe.as_os_str().as_encoded_bytes();
    let name = path.rsplit(|&c| c == b'/').next().unwrap();
    write_module(out, (base, base + (1 << 32)), base, name, path).unwrap();
}

#[test]
fn stacks_are_symbolized_as_in_process_and_other_lines_kept() {
    let ra = marker_function() as u64 + 1;
    let mut raw = String::new();
    write_first_line(&mut raw).unwrap();
    write_cmdline(&mut raw, b"wc\0-c\0").unwrap();
    own_module(&mut raw);
    write_graph(&mut raw, "peak", "bytes live at the global peak: report 1").unwrap();
    raw.push_str("mem-trace: report 1 (at exit) at 0.001 s: 5 bytes live in 1 block\n# 0: 5 bytes in 1 block\n");
    write_stack(&mut raw, &[ra, 0x10, mem_trace_format::CUT_MARKER]).unwrap();
    write_hint(&mut raw).unwrap();
    raw.push_str("mem-trace: end of report 1\n");
    let mut folded = String::new();
    write_folded_stack(&mut folded, &[ra, 0x10], 5).unwrap();
    folded.push_str("[2 other stacks] 7\n");
    assert!(is_raw(&raw) && !is_raw("mem-trace: report 1 (at exit)\n"));

    assert!(body(&raw).starts_with("mem-trace: report 1 (at exit) at 0.001 s: 5 bytes"));
    assert_eq!(body("mem-trace: report 2\n"), "mem-trace: report 2\n");
    assert_eq!(argv(&raw), Some(vec![b"wc".to_vec(), b"-c".to_vec()]));

    let mut cache = Cache::new();
    let c = convert(&raw, Some(&folded), &mut cache).unwrap();
    assert_eq!(c.argv, Some(vec![b"wc".to_vec(), b"-c".to_vec()]));
    assert_eq!(
        c.graph,
        Some((
            "peak".into(),
            "bytes live at the global peak: report 1".into()
        ))
    );
    let lines: Vec<&str> = c.text.lines().collect();
    assert_eq!(
        lines[0],
        "mem-trace: report 1 (at exit) at 0.001 s: 5 bytes live in 1 block"
    );
    assert_eq!(lines[1], "# 0: 5 bytes in 1 block");
    // The marker's frames (black_box may show inlined into it), then the frame no module
    // holds, then the cut, numbered on from them.
    let n = lines.len();
    let named = &lines[2..n - 3];
    assert!(
        named.iter().any(|l| l.ends_with("::marker_function")),
        "{}",
        c.text
    );
    assert!(
        named.iter().any(|l| l.contains("deferred/tests.rs:")),
        "{}",
        c.text
    );
    assert!(lines[n - 3].ends_with(": 0x10"), "{}", c.text);
    assert_eq!(lines[n - 2], format!("   {}", text::CUT_TEXT));
    // One frame in three unnamed: no hint.
    assert_eq!(lines[n - 1], "mem-trace: end of report 1");
    assert!(!c.text.contains('@'), "{}", c.text);
    let folded = c.folded.unwrap();
    let folded: Vec<&str> = folded.lines().collect();
    assert!(
        folded[0].starts_with("0x10;mem_trace_read::deferred::tests::marker_function")
            && folded[0].ends_with(" 5"),
        "{folded:?}"
    );
    assert_eq!(folded[1], "[2 other stacks] 7");
    // The cache answers the second time.
    assert_eq!(cache.frames.len(), 1);
}

#[test]
fn mostly_unnamed_frames_get_the_hint_and_no_module_is_no_name() {
    let mut raw = String::new();
    write_first_line(&mut raw).unwrap();
    write_module(
        &mut raw,
        (0x1000, 0x2000),
        0x1000,
        b"prog",
        b"/nonexistent/prog",
    )
    .unwrap();
    write_stack(&mut raw, &[0x1234, 0x1300]).unwrap();
    write_hint(&mut raw).unwrap();
    let c = convert(&raw, None, &mut Cache::new()).unwrap();
    assert_eq!(
        c.text.lines().take(2).collect::<Vec<_>>(),
        ["   0: 0x1234 (prog+0x234)", "   1: 0x1300 (prog+0x300)"]
    );
    assert!(
        c.text
            .lines()
            .nth(2)
            .unwrap()
            .contains("2 of 2 frames have no name"),
        "{}",
        c.text
    );
    assert!(c.argv.is_none() && c.graph.is_none() && c.folded.is_none());
}

#[test]
fn malformed_reports_are_refused_with_the_line() {
    let mut cache = Cache::new();
    assert!(convert("mem-trace: report 1\n", None, &mut cache).is_err());
    let bad = format!("{FIRST_LINE}\n@ 12 zz\n");
    let e = convert(&bad, None, &mut cache).unwrap_err();
    assert!(e.0.starts_with("line 2: bad stack"), "{e}");
    let bad = format!("{FIRST_LINE}\n@module 1 2\n");
    assert!(convert(&bad, None, &mut cache).is_err());
    let folded = "@ x 12\n";
    assert!(convert(FIRST_LINE, Some(folded), &mut cache).is_err());
}

#[test]
fn command_lines_split_at_nuls() {
    assert_eq!(split_args(b"a\0b c\0"), [b"a".to_vec(), b"b c".to_vec()]);
    assert_eq!(split_args(b""), Vec::<Vec<u8>>::new());
    assert_eq!(split_args(b"x"), [b"x".to_vec()]);
}
