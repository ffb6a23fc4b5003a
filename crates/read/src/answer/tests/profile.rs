//! The lines of top and peaks, and the ranking's order and clamps.

use super::super::profile::{peaks_lines, rank, top_lines, By, PeaksFacts, Ranked, TopFacts};
use super::super::AnswerError;
use super::*;
use crate::layout::Tables;
use crate::test_image::{Built, ThreadSpec, TraceBuilder};
use mem_trace_format::Counts;
use std::collections::BTreeMap;

/// Three stacks: hold (2 live blocks), churn (everything freed; it held the peak) and leak
/// (counted in a thread's cache only); two threads, the second exited.
pub(super) fn sites(profiler: bool) -> Built {
    let mut b = TraceBuilder::new();
    if profiler {
        b.flags = 3;
        b.profile = Some(0);
    }
    (b.live_bytes, b.peak_bytes, b.peak_seq) = (4096 * 2 + 1000, 1 << 20, 50);
    let t1 = b.add_thread(ThreadSpec {
        tid: 10,
        name: "prog".into(),
        own_live: 9192,
        peak_bytes: 1 << 20,
        allocated_bytes: 3 << 20,
        ..ThreadSpec::default()
    });
    b.add_thread(ThreadSpec {
        tid: 11,
        name: "worker".into(),
        exited: true,
        peak_bytes: 1 << 20,
        allocated_bytes: 1 << 20,
        ..ThreadSpec::default()
    });
    let hold = b.add_stack(&[0x1000]);
    let churn = b.add_stack(&[0x2000]);
    let leak = b.add_stack(&[0x3000]);
    b.add_block(0x5555_0000_0000, 4096, 1, hold, 1);
    b.add_block(0x5555_0000_2000, 4096, 1, hold, 2);
    b.add_block(0x5555_0000_4000, 1000, 2, leak, 3);
    b.counters.insert(hold, [8192, 2, 8192, 2, 0, 0, 2]);
    b.counters.insert(churn, [0, 0, 3 << 20, 3, 1 << 20, 1, 60]);
    b.add_cached(t1, leak, [1000, 1, 1000, 1, 0, 0, 3]);
    b.build()
}

fn top(built: &Built, by: By, thread: Option<u32>, n: usize) -> Result<Vec<String>, AnswerError> {
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = TopFacts::read(&tables, by, thread)?;
    Ok(with_lookups(&tables, |l| top_lines(&facts, l, n, None)))
}

#[test]
fn top_by_live_biggest_last() {
    assert_eq!(
        top(&sites(true), By::Live, None, 10).unwrap(),
        [
            "live: 9192 bytes in 3 blocks; peak: 1048576 bytes; phase 1 (no reset)",
            "top 2 of 2 stacks by live bytes, biggest last:",
            "# 1: 1000 bytes in 1 block",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "# 0: 8192 bytes in 2 blocks",
            "    #0 0x1000 in hold_site at /src/p.c:56",
        ]
    );
}

#[test]
fn top_by_allocated_and_by_peak() {
    let built = sites(true);
    assert_eq!(
        top(&built, By::Allocated, None, 1).unwrap()[1..],
        [
            "top 1 of 3 stacks by bytes ever allocated, biggest last:",
            "# 0: 3145728 bytes in 3 blocks allocated (0 bytes live)",
            "    #0 0x2000 in churn_site at /src/p.c:64",
        ]
    );
    assert_eq!(
        top(&built, By::Peak, None, 1).unwrap()[2],
        "# 0: 1048576 bytes in 1 block at the peak (0 bytes live now)"
    );
}

#[test]
fn top_of_a_thread_counts_its_live_blocks() {
    let built = sites(true);
    assert_eq!(
        top(&built, By::Blocks, Some(2), 5).unwrap()[1..],
        [
            "thread 2, tid 11 \"worker\", exited: 1000 bytes in 1 live block (from the live-block table)",
            "top 1 of 1 stack by live blocks allocated by thread 2, biggest last:",
            "# 0: 1000 bytes in 1 block",
            "    #0 0x3000 in leak_site at /src/p.c:76",
        ]
    );
    let refusal = |by, thread| top(&built, by, Some(thread), 5).unwrap_err().to_string();
    assert_eq!(
        refusal(By::Allocated, 1),
        "--thread counts the live blocks of the live-block table, which knows nothing of bytes \
         ever allocated per thread: use --by live or --by blocks"
    );
    assert_eq!(
        refusal(By::Live, 99),
        "no thread 99: the tracer has seen threads 1..2 (mtrace-peaks lists them)"
    );
}

#[test]
fn peaks() {
    let built = sites(true);
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = PeaksFacts::read(&tables).unwrap();
    assert_eq!(
        with_lookups(&tables, |l| peaks_lines(&facts, l, 1, None)),
        [
            "live now: 9192 bytes in 3 blocks",
            "peak: 1048576 bytes (at event #50, since the start)",
            "phase 1 (no reset)",
            "threads: 2",
            "  thread 1, tid 10 \"prog\": live 9192 bytes, peak 1048576 bytes, allocated 3145728 bytes",
            "  thread 2, tid 11 \"worker\", exited: live 0 bytes, peak 1048576 bytes, allocated 1048576 bytes",
            "top 1 of 3 stacks by bytes at the peak, biggest last:",
            "# 0: 1048576 bytes in 1 block at the peak (0 bytes live now)",
            "    #0 0x2000 in churn_site at /src/p.c:64",
        ]
    );
}

#[test]
fn without_the_profiler() {
    let built = sites(false);
    let err = top(&built, By::Live, None, 10).unwrap_err().to_string();
    assert!(
        err.contains("old tracer-only build") && !err.contains('\n'),
        "{err}"
    );
    let tables = Tables::open(&built.image, built.header).unwrap();
    assert!(matches!(
        PeaksFacts::read(&tables),
        Err(AnswerError::NotProfiler)
    ));
}

#[test]
fn ranks_biggest_first_ties_by_blocks_then_older_stack_and_negative_sums_as_zero() {
    let c = |live_bytes: u64, live_blocks: u64| Counts {
        live_bytes,
        live_blocks,
        ..Counts::default()
    };
    let counts = BTreeMap::from([
        (5, c(100, 1)),
        (3, c(100, 2)),
        (4, c(100, 2)),
        (6, c(50, 9)),
        (7, c(0u64.wrapping_sub(8), 0)),
        (8, c(0, 0)),
    ]);
    let order = |by| -> Vec<u32> { rank(&counts, by).iter().map(|r: &Ranked| r.stack).collect() };
    assert_eq!(order(By::Live), [3, 4, 5, 6]);
    assert_eq!(order(By::Blocks), [6, 3, 4, 5]);
    assert!(order(By::Allocated).is_empty());
}

#[test]
fn no_stack_to_rank() {
    let mut b = TraceBuilder::new();
    b.flags = 3;
    b.profile = Some(2);
    let built = b.build();
    assert_eq!(
        top(&built, By::Live, None, 10).unwrap(),
        [
            "live: 0 bytes in 0 blocks; peak: 0 bytes; phase 3 (2 resets)",
            "no stack has live bytes",
        ]
    );
}

/// Numbers no consistent tables hold are printed as read, each flagged (a reader must not
/// present a scribbled or torn count as the truth, nor hide it): live bytes
/// that went below zero (read near 2^64) and above the peak, a thread's live above its peak,
/// and a stack whose counters sum below zero.
#[test]
fn impossible_numbers_are_flagged() {
    let mut b = TraceBuilder::new();
    b.flags = 3;
    b.profile = Some(0);
    (b.live_bytes, b.peak_bytes, b.peak_seq) = (u64::MAX, 4096, 5);
    b.add_thread(ThreadSpec {
        tid: 10,
        name: "prog".into(),
        own_live: 8192,
        peak_bytes: 4096,
        allocated_bytes: 8192,
        ..ThreadSpec::default()
    });
    let fine = b.add_stack(&[0x1000]);
    let wrapped = b.add_stack(&[0x2000]);
    b.counters.insert(fine, [4096, 1, 4096, 1, 0, 0, 2]);
    b.counters
        .insert(wrapped, [0u64.wrapping_sub(4096), 0, 4096, 1, 0, 0, 3]);
    let built = b.build();
    let flags = [
        "inconsistent tables: live bytes 18446744073709551615 above the peak 4096".to_string(),
        "inconsistent tables: thread 1 live bytes 8192 above its peak 4096".to_string(),
        format!(
            "inconsistent tables: the counters of 1 stack sum below zero or to more live than \
             ever allocated (stack {wrapped} first)"
        ),
    ];
    let lines = top(&built, By::Live, None, 10).unwrap();
    assert_eq!(
        lines[..4],
        [
            "live: 18446744073709551615 bytes in 0 blocks; peak: 4096 bytes; phase 1 (no reset)",
            flags[0].as_str(),
            &flags[1],
            &flags[2]
        ]
    );
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = PeaksFacts::read(&tables).unwrap();
    let peaks = with_lookups(&tables, |l| peaks_lines(&facts, l, 1, None));
    assert_eq!(peaks[3..6], flags);
    assert_eq!(peaks[6], "threads: 1");
    // Consistent tables: no flag.
    let built = sites(true);
    let lines = top(&built, By::Live, None, 10).unwrap();
    assert!(
        lines.iter().all(|l| !l.starts_with("inconsistent")),
        "{lines:?}"
    );
}

/// Shards' counts that sum past 2^64: `top` and `peaks` say so below their figures.
#[test]
fn shard_sums_past_2_64_are_flagged() {
    let mut built = sites(true);
    for shard in 0..3 {
        built.set_shard_bytes(shard, 3 << 61);
    }
    let flag = "inconsistent tables: live counts sum past 2^64 or below zero";
    let lines = top(&built, By::Live, None, 10).unwrap();
    assert_eq!(lines[1], flag, "{lines:?}");
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = PeaksFacts::read(&tables).unwrap();
    let peaks = with_lookups(&tables, |l| peaks_lines(&facts, l, 1, None));
    assert_eq!(peaks[3], flag, "{peaks:?}");
}
