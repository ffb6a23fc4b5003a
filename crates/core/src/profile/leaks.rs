//! The leak check of the exit report: which live blocks the program can still reach,
//! classified as memcheck does (docs/FINDINGS.md "Peaks and leaks as DHAT, LSan and memcheck
//! define them"). The classification and its rules are `mem_trace_read::leaks`, shared with
//! the `mem-trace leaks` command so that both say the same of the same program; this module
//! gives it the process's own blocks, memory and roots ([`roots`]).
//!
//! Nothing is stopped: the live blocks are copied shard by shard (`table::for_each_block`, a
//! shard's lock held only for its copy), and all memory is read with `process_vm_readv` on
//! the process itself, which fails cleanly on memory that another thread unmapped meanwhile
//! rather than faulting. While the program runs (a snapshot), the answer is approximate in
//! the way any such scan is; at exit, with the program's threads idle, it is exact for the
//! roots it has. The block list comes from the arena; the scan's buffers from the global
//! allocator, which in the preload is the arena too, never the program's heap.

use crate::arena::Arena;
use crate::profile::roots;
use crate::store::table;
use allocator_api2::vec::Vec as AVec;
use mem_trace_read::layout::tags;
use mem_trace_read::leaks::Scan;
use mem_trace_read::memory::{Memory, Process};

pub(crate) use mem_trace_read::leaks::{Live, Total};

/// A vector in the tracer's arena.
pub(crate) type ArenaVec<T> = AVec<T, Arena>;

/// The scan's answer: every block with its class, and the totals per class.
pub(crate) struct Leaks {
    pub blocks: ArenaVec<Live>,
    pub lost: Total,
    /// The part of `lost` that is indirectly lost.
    pub indirect: Total,
    pub possibly: Total,
    pub reachable: Total,
}

/// Runs the check. `own_sp`: see [`roots::for_each`]. `None` when out of memory.
pub(crate) fn check(own_sp: Option<u64>) -> Option<Leaks> {
    let mut blocks = snapshot()?;
    let me = Process::this();
    let mut scan = Scan::new(&me, &mut blocks)?;
    roots::for_each(own_sp, |r| scan.root(r));
    scan.words(&crate::profile::exit_registers(own_sp));
    roots::for_each_tcb(|tcb| {
        if let Some(dtv) = dtv_of(&me, tcb) {
            scan.words(&[dtv]);
        }
    });
    let outcome = scan.finish();
    Some(Leaks {
        blocks,
        lost: outcome.lost,
        indirect: outcome.indirect,
        possibly: outcome.possibly,
        reachable: outcome.reachable,
    })
}

/// The start of the dynamic thread vector of the thread whose control block is at `tcb`, if
/// that control block is still there (glibc's `tcbhead_t`: `tcb` and `self`, at offsets 0
/// and 16, point at it; `dtv`, at 8, is the vector's start plus 16). See
/// [`roots::thread_created`].
fn dtv_of(me: &Process, tcb: u64) -> Option<u64> {
    let mut head = [0u8; 24];
    me.read(tcb, &mut head).ok()?;
    let word = |i: usize| u64::from_ne_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    (word(0) == tcb && word(2) == tcb && word(1) >= 16).then(|| word(1) - 16)
}

/// Adds the live tagged blocks (docs/LAYOUT.md "Block tags"), found by a scan of the
/// process's own heap mappings: they are in no table.
fn tagged_blocks(v: &mut ArenaVec<Live>) {
    let key = crate::store::tags::key();
    if key == 0 {
        return;
    }
    let regions = tags::this_process_regions();
    let flags = crate::store::header::header()
        .flags
        .load(core::sync::atomic::Ordering::Relaxed);
    let format = tags::TagFormat::new(key, flags);
    tags::for_each_tagged(&Process::this(), format, &regions, &mut |b| {
        v.push(Live::new(b.addr, b.size, b.stack))
    });
}

/// The live blocks, sorted by address, each once.
fn snapshot() -> Option<ArenaVec<Live>> {
    let mut v: ArenaVec<Live> = AVec::new_in(Arena);
    // Room for the blocks now and some more, so that pushing under a shard lock rarely grows
    // the vector (an mmap while allocating threads wait).
    let (n, _) = table::totals();
    v.try_reserve(n as usize + n as usize / 8 + 1024).ok()?;
    table::for_each_block(|b| v.push(Live::new(b.addr, b.size, b.stack)));
    tagged_blocks(&mut v);
    v.sort_unstable_by_key(|b| b.addr);
    v.dedup_by_key(|b| b.addr);
    Some(v)
}
