//! The freed-block index as the tracer writes it, read back by `mem-trace-read` through
//! `process_vm_readv`: the same frees as a pass over the ring finds, for a ring that has
//! wrapped, written by several threads' claims, one of them far behind the others.
//!
//! A file of its own: the history is configured once per process, and the ring of
//! `read_back.rs` is a small one, which has no index.

use mem_trace_core::store::freed::{self, index, HISTORY};
use mem_trace_format::{Block, Freed};
use mem_trace_read::layout::Tables;
use mem_trace_read::memory::Process;
use std::sync::atomic::Ordering;

mem_trace_core::define_header!();

const HEAP: u64 = 0x5555_0000_0000;
/// Block sizes at several levels, the larger ones rarer, as in a program's heap.
const SIZES: [u64; 9] = [0, 16, 48, 64, 100, 256, 5 << 10, 200 << 10, 2 << 20];

fn size(rng: &mut Rng) -> u64 {
    match rng.below(10_000) {
        0 => SIZES[8],
        1..=10 => SIZES[7],
        11..=200 => SIZES[6],
        n => SIZES[(n % 6) as usize],
    }
}

/// The same frees on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn free(claim: &freed::Claim, addr: u64, size: u64, seq: u64) {
    freed::push(
        claim,
        &Freed {
            block: Block {
                addr,
                size,
                thread: 1,
                seq,
                stack: 0,
            },
            free_seq: seq + 1,
            free_stack: 0,
            free_thread: 1,
            by_realloc: false,
        },
    );
}

/// Every record of the ring, in one pass: (start, the block, free sequence number), by
/// start.
fn ring_records() -> Vec<(u64, Block, u64)> {
    let cap = HISTORY.capacity.load(Ordering::Relaxed);
    let ring = HISTORY.records.load(Ordering::Acquire);
    let mut out: Vec<(u64, Block, u64)> = (0..cap as usize)
        .filter_map(|i| {
            // SAFETY: a record of the ring, which is never freed; no thread writes it now.
            let r = unsafe { &*ring.add(i) };
            let addr = r.addr.load(Ordering::Acquire);
            let b = Block::unpack(
                addr,
                r.size_thread.load(Ordering::Relaxed),
                r.seq_stack.load(Ordering::Relaxed),
            );
            (addr != 0).then(|| (addr, b, b.seq + 1))
        })
        .collect();
    out.sort_unstable_by_key(|r| r.0);
    out
}

/// What that pass finds at `a`: free sequence numbers, newest first.
fn scanned(records: &[(u64, Block, u64)], a: u64) -> Vec<u64> {
    let largest = SIZES.iter().max().copied().unwrap_or(0);
    let from = records.partition_point(|r| r.0 < a.saturating_sub(largest));
    let mut out: Vec<u64> = records[from..]
        .iter()
        .take_while(|r| r.0 <= a)
        .filter(|r| r.1.contains(a))
        .map(|r| r.2)
        .collect();
    out.sort_unstable_by(|x, y| y.cmp(x));
    out
}

/// The free sequence numbers the index finds at `a`, newest first.
fn by_index(t: &Tables<'_, Process>, a: u64) -> Vec<u64> {
    t.freed_blocks_containing(a)
        .unwrap()
        .iter()
        .map(|f| f.free_seq)
        .collect()
}

#[test]
fn the_index_finds_what_a_pass_over_the_ring_finds() {
    let cap = index::MIN_CAPACITY;
    freed::configure(cap, true);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    // Four threads' claims, one of which frees only every 5000th time: its runs are
    // abandoned once far behind, or used late, joining their chains out of order.
    let claims: Vec<freed::Claim> = (0..4).map(|_| freed::Claim::new()).collect();
    let mut seq = 1;
    let mut probes = Vec::new();
    for i in 0..cap + cap / 4 {
        let size = size(&mut rng);
        let addr = HEAP + 16 * rng.below(1 << 24);
        let who = if i % 5000 == 0 { 3 } else { (i % 3) as usize };
        free(&claims[who], addr, size, seq);
        seq += 2;
        if i % 16411 == 0 {
            probes.extend([addr, addr + size / 2, addr + size.max(1) - 1, addr + size]);
        }
    }
    assert_ne!(HISTORY.index.load(Ordering::Relaxed), core::ptr::null_mut());
    let disorder = index::INDEX.disorder.load(Ordering::Relaxed);
    assert!(
        disorder > 8 && disorder <= 2 * index::LAG,
        "disorder {disorder}"
    );

    let me = Process::this();
    let t = Tables::open(&me, &MEM_TRACE_HEADER as *const _ as u64).expect("open");
    probes.extend([0x1234, HEAP - 1, HEAP + (256 << 20) + (4 << 20)]);
    let records = ring_records();
    let mut found = 0;
    for a in probes {
        let got = by_index(&t, a);
        assert_eq!(got, scanned(&records, a), "address {a:#x}");
        found += got.len();
    }
    assert!(
        found > 100,
        "{found} frees found: probes in the ring, mostly"
    );

    // A chain cut short in front of a record still in the ring: the late thread's free at
    // `x` joins `x`'s chain in front of an earlier-joined, later-claimed one, then its slot
    // is taken first. Only the window of `disorder` records behind the cut finds the other.
    let x = HEAP - (1 << 20);
    let late = freed::Claim::new();
    free(&late, HEAP - (2 << 20), 48, seq);
    // Its run is records `first..first + 8`; the earlier free's, just after.
    let first = HISTORY.written.load(Ordering::Relaxed) - 8;
    free(&freed::Claim::new(), x, 48, seq + 2);
    seq += 4;
    for _ in 0..30_000 {
        free(&claims[1], HEAP + 16 * rng.below(1 << 24), 48, seq);
        seq += 2;
    }
    free(&late, x, 48, seq);
    seq += 2;
    // Up to record `first + 1 + cap`, which takes the late free's slot (claimed in the run
    // of `first + cap`, 8 records before the earlier free's is claimed again).
    let mut taken = false;
    while !taken {
        taken = HISTORY.written.load(Ordering::Relaxed) > first + 1 + cap;
        free(&claims[1], HEAP + 16 * rng.below(1 << 24), 48, seq);
        seq += 2;
    }
    let records = ring_records();
    let want = scanned(&records, x + 8);
    assert_eq!(
        want.len(),
        1,
        "the earlier free at x is still in the ring, the late one not"
    );
    assert_eq!(by_index(&t, x + 8), want);

    // A run claimed and not written yet must not show the frees of a lap ago in its slots:
    // those may have left their chains' reach. Record `a` (at `z`) is behind record `j` (at
    // `z` too) on their chain; a lap later a thread claims the run that holds `a`'s slot and
    // writes only its first record, and `j`'s slot is taken.
    let z = HEAP - (3 << 20);
    let base = HISTORY.written.load(Ordering::Relaxed);
    let a = freed::Claim::new();
    free(&a, HEAP - (4 << 20), 48, seq);
    free(&a, z, 48, seq + 2);
    free(&freed::Claim::new(), z, 48, seq + 4);
    seq += 6;
    while HISTORY.written.load(Ordering::Relaxed) < base + cap {
        free(&claims[1], HEAP + 16 * rng.below(1 << 24), 48, seq);
        seq += 2;
    }
    free(&freed::Claim::new(), HEAP - (5 << 20), 48, seq);
    free(&claims[2], HEAP - (6 << 20), 48, seq + 2);
    assert_eq!(by_index(&t, z), scanned(&ring_records(), z));
}
