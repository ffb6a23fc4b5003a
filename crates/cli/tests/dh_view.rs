//! DHAT's JSON as `mem-trace dhat` writes it, loaded into valgrind's real viewer
//! (`/usr/libexec/valgrind/dh_view.html`) in headless Chromium, the way a user loads it: the
//! page's file input is given the file, and the test reads what the page shows.
//!
//! The stacks here are synthetic (known counts and frames), so the test needs no target; the
//! same path serves a real process's stacks.

mod webdriver;

use mem_trace_cli::dhat;
use mem_trace_cli::stacks::{Frame, Profile, Stack};
use mem_trace_format::Counts;
use mem_trace_read::symbolize::SymFrame;
use std::path::{Path, PathBuf};
use std::time::Duration;
use webdriver::Browser;

const VIEWER: &str = "/usr/libexec/valgrind/dh_view.html";

fn frame(ra: u64, function: &str, line: u32) -> Frame {
    Frame {
        ra,
        symbols: vec![SymFrame {
            function: Some(function.to_string()),
            file: Some("/src/sites.c".to_string()),
            line,
            column: 5,
            inlined: false,
        }],
        module: Some((b"/src/sites".to_vec(), 0)),
    }
}

/// Three stacks under `main`: the holder (most bytes and blocks, live to the end), a churner
/// (much allocated, nothing live) and a small one.
fn profile() -> Profile {
    let main = frame(0x401100, "main", 40);
    let stack = |id, site: Frame, counts| Stack {
        id,
        counts,
        frames: vec![site.into(), main.clone().into()],
    };
    Profile {
        stacks: vec![
            stack(
                1,
                frame(0x401010, "hold_site", 12),
                Counts {
                    live_bytes: 67_108_864,
                    live_blocks: 16_384,
                    total_bytes: 67_108_864,
                    total_blocks: 16_384,
                    peak_bytes: 67_108_864,
                    peak_blocks: 16_384,
                },
            ),
            stack(
                2,
                frame(0x401020, "churn_site", 20),
                Counts {
                    total_bytes: 2_097_152,
                    total_blocks: 2,
                    peak_bytes: 1_048_576,
                    peak_blocks: 1,
                    ..Counts::default()
                },
            ),
            stack(
                3,
                frame(0x401030, "leak_site", 30),
                Counts {
                    live_bytes: 1000,
                    live_blocks: 1,
                    total_bytes: 1000,
                    total_blocks: 1,
                    peak_bytes: 1000,
                    peak_blocks: 1,
                },
            ),
        ],
        now_seq: 40_000,
        peak_seq: 32_800,
        sample_mean: 0,
    }
}

fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dh_view");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The viewer shows the file: no error, the invocation, and the top stack (by total blocks,
/// its default sort) with its frames and its bytes in every count we fill.
#[test]
fn dh_view_shows_the_top_stack() {
    let json = out_dir().join("synthetic.json");
    let doc = dhat::document("sites --hold", 4242, &profile());
    std::fs::write(&json, serde_json::to_string(&doc).unwrap()).unwrap();

    let browser = Browser::start();
    browser.open(&format!("file://{VIEWER}"));
    let before = browser.text();
    assert!(
        before.contains("Load a DHAT data file to begin"),
        "not DHAT's viewer:\n{before}"
    );
    browser.choose_file(json.to_str().unwrap());
    let text = browser.text_when(Duration::from_secs(30), |t| {
        t.contains("PP 1.1/") || t.contains("Error")
    });
    let shown = format!("the page shows:\n{text}");
    assert!(!text.contains("Error"), "{shown}");
    assert!(text.contains("Command: sites --hold"), "{shown}");
    assert!(text.contains("PID:     4242"), "{shown}");
    // The root first, then its biggest child: the holder, with its frames and counts.
    let top = &text[text
        .find("PP 1.1/")
        .unwrap_or_else(|| panic!("no PP 1.1: {shown}"))..];
    let top = &top[..top.find("\n}").unwrap_or(top.len())];
    for expected in [
        "Total:     67,108,864 bytes",
        "in 16,384 blocks",
        "At t-gmax: 67,108,864 bytes",
        "At t-end:  67,108,864 bytes",
        "0x401010: hold_site (/src/sites.c:12:5)",
        "0x401100: main (/src/sites.c:40:5)",
    ] {
        assert!(
            top.contains(expected),
            "no {expected:?} in PP 1.1:\n{top}\n{shown}"
        );
    }
    assert!(!top.contains("churn_site"), "{top}");
}
