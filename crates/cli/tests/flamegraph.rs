//! `mem-trace flamegraph`'s output: folded stacks whose totals are the counts given, and the
//! SVG that `inferno` draws from them, which parses as XML and names the stacks' functions
//! with their counts.

use mem_trace_cli::cli::By;
use mem_trace_cli::flamegraph::folded_lines;
use mem_trace_cli::stacks::{Frame, Stack};
use mem_trace_format::Counts;
use mem_trace_read::symbolize::SymFrame;
use std::path::{Path, PathBuf};
use std::process::Command;

fn frame(ra: u64, function: &str) -> Frame {
    Frame {
        ra,
        symbols: vec![SymFrame {
            function: Some(function.to_string()),
            ..SymFrame::default()
        }],
        module: None,
    }
}

fn stack(id: u32, names: &[&str], live_bytes: u64, total_bytes: u64) -> Stack {
    Stack {
        id,
        counts: Counts {
            live_bytes,
            live_blocks: live_bytes / 4096,
            total_bytes,
            total_blocks: total_bytes / 4096,
            ..Counts::default()
        },
        frames: names
            .iter()
            .enumerate()
            .map(|(i, n)| frame(0x1000 * (u64::from(id) + 1) + i as u64, n).into())
            .collect(),
    }
}

/// Stacks innermost first: two sites under `sites`, one straight under `main`, one raw.
fn stacks() -> Vec<Stack> {
    vec![
        stack(1, &["hold_site", "sites", "main"], 67_108_864, 67_108_864),
        stack(2, &["churn_site", "sites", "main"], 0, 2_147_483_648),
        stack(3, &["kept_site", "main"], 53_248, 53_248),
        Stack {
            id: 4,
            frames: vec![Frame {
                ra: 0x7f00_0000_2345,
                symbols: vec![],
                module: Some((b"/lib/libz.so".to_vec(), 0x7f00_0000_0000)),
            }
            .into()],
            ..stack(4, &[], 4096, 4096)
        },
    ]
}

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flamegraph");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The count at the end of each folded line, by its innermost frame.
fn folded_counts(folded: &str) -> Vec<(String, u64)> {
    folded
        .lines()
        .map(|l| {
            let (frames, n) = l.rsplit_once(' ').expect("a count");
            let leaf = frames.rsplit(';').next().unwrap().to_string();
            (leaf, n.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn folded_totals_are_the_counts_given() {
    let s = stacks();
    for by in [By::Live, By::Allocated, By::Blocks] {
        let folded = folded_lines(&s, by);
        let total: u64 = folded_counts(&folded).iter().map(|(_, n)| n).sum();
        let expected: u64 = s
            .iter()
            .map(|st| match by {
                By::Live => st.counts.live_bytes,
                By::Allocated => st.counts.total_bytes,
                _ => st.counts.live_blocks,
            })
            .sum();
        assert_eq!(total, expected, "{by:?}:\n{folded}");
    }
    let live = folded_lines(&s, By::Live);
    assert_eq!(
        live,
        "main;sites;hold_site 67108864\nmain;kept_site 53248\nlibz.so+0x2345 4096\n"
    );
}

/// `mem-trace flamegraph --from-folded`: the SVG is XML, titled as asked, and every function
/// is a frame with its bytes; the root holds the total.
#[test]
fn the_svg_parses_and_names_the_functions() {
    let d = dir();
    let folded = d.join("stacks.folded");
    let svg = d.join("stacks.svg");
    let _ = std::fs::remove_file(&svg);
    std::fs::write(&folded, folded_lines(&stacks(), By::Live)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mem-trace"))
        .args(["flamegraph", "--from-folded"])
        .arg(&folded)
        .args(["--by", "live", "--title", "live bytes of the fixture", "-o"])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    // inferno writes the SVG 1.1 DOCTYPE, which roxmltree refuses unless asked.
    let opt = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&text, opt)
        .unwrap_or_else(|e| panic!("not XML: {e}"));
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for expected in [
        "all (67,166,208 bytes, 100%)",
        "main (67,162,112 bytes, 99.99%)",
        "sites (67,108,864 bytes, 99.91%)",
        "hold_site (67,108,864 bytes, 99.91%)",
        "kept_site (53,248 bytes, 0.08%)",
    ] {
        assert!(
            titles.contains(&expected),
            "no frame titled {expected:?} in {titles:?}"
        );
    }
    assert!(
        !titles.iter().any(|t| t.starts_with("churn_site")),
        "{titles:?}"
    );
    let heading = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("title"))
        .and_then(|n| n.text());
    assert_eq!(heading, Some("live bytes of the fixture"));
}

/// A missing input is one line on stderr and a failure.
#[test]
fn a_missing_folded_file_is_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_mem-trace"))
        .args([
            "flamegraph",
            "--from-folded",
            "/nonexistent/x.folded",
            "-o",
            "-",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("mem-trace: cannot read /nonexistent/x.folded: "),
        "{stderr}"
    );
}
