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
use crate::profile::world::{NotStopped, Stopped, World};
use crate::store::table;
use allocator_api2::vec::Vec as AVec;
use mem_trace_read::layout::tags;
use mem_trace_read::leaks::{glibc_heap, mmapped_chunk, Root, Scan};
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
    /// At exit: whether the other threads were stopped for the scan, and for how long.
    pub stop: Option<Result<Pause, NotStopped>>,
}

/// How the other threads were held for the scan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pause {
    pub threads: usize,
    pub ms: u64,
    /// Threads left running for lack of room.
    pub left: usize,
}

/// Runs the check. `own_sp`: see [`roots::for_each`]. `stop`: stop the other threads for the
/// scan (at exit). `None` when out of memory.
pub(crate) fn check(own_sp: Option<u64>, stop: bool) -> Option<Leaks> {
    let modules = roots::Modules::now();
    let world = stop.then(|| World::stop(roots::busy_below()));
    let stopped = match &world {
        Some(Ok(w)) => Some(w.threads()),
        _ => None,
    };
    let mut blocks = snapshot()?;
    // Read once, with the threads stopped: both the stacks' and the program's mappings come
    // from it.
    let mut mappings: ArenaVec<crate::maps::Mapping> = AVec::new_in(Arena);
    crate::maps::for_each(|m| mappings.push(*m));
    let me = Process::this();
    let mut extra: ArenaVec<Root> = AVec::new_in(Arena);
    let own: &[(u64, u64)] = match &world {
        Some(Ok(w)) => &w.own_ranges(),
        _ => &[],
    };
    program_mappings(
        &blocks, &mappings, &modules, own, own_sp, stopped, &mut extra,
    );
    let mut scan = Scan::new(&me, &mut blocks)?;
    roots::for_each(own_sp, &modules, stopped, &mappings, |r| scan.root(r));
    for r in extra.iter() {
        scan.root(*r);
    }
    scan.words(&crate::profile::exit::exit_registers(own_sp));
    for t in stopped.unwrap_or(&[]) {
        scan.words(&t.words());
    }
    roots::for_each_tcb(|tcb| {
        if let Some(dtv) = dtv_of(&me, tcb) {
            scan.words(&[dtv]);
        }
    });
    let outcome = scan.finish();
    let stop = world.map(|w| {
        w.map(|w| Pause {
            threads: w.threads().len(),
            ms: w.elapsed_ms(),
            left: w.left_running(),
        })
    });
    Some(Leaks {
        blocks,
        lost: outcome.lost,
        indirect: outcome.indirect,
        possibly: outcome.possibly,
        reachable: outcome.reachable,
        stop,
    })
}

/// The program's own anonymous writable memory, as memcheck scans it: a pool or arena the
/// program mapped itself (CPython's object arenas, Ruby's heap pages) holds pointers to
/// blocks. Left out: what is not the program's data — this library's arena and the stop's own
/// mappings, glibc's heaps (the program break, other arenas' 64 MiB heaps, `mmap`ed chunks:
/// freed chunks there hold stale pointers, and live blocks are reached as blocks), thread
/// stacks (read from their stack pointers, the dead part below left out; stacks glibc keeps
/// for the next thread), the modules' segments (scanned already), and pages never touched.
fn program_mappings(
    blocks: &[Live],
    mappings: &[crate::maps::Mapping],
    modules: &roots::Modules,
    own: &[(u64, u64)],
    own_sp: Option<u64>,
    stopped: Option<&[Stopped]>,
    out: &mut ArenaVec<Root>,
) {
    let sps = || {
        own_sp
            .into_iter()
            .chain(stopped.unwrap_or(&[]).iter().map(|t| t.regs.rsp))
    };
    for m in mappings {
        let name = m.name();
        if !m.readable() || !m.writable() || !(name.is_empty() || name.starts_with(b"[anon:")) {
            continue;
        }
        let (lo, hi) = (m.start, m.end);
        if sps().any(|sp| (lo..hi).contains(&sp)) || roots::holds_a_stack(lo, hi) {
            continue;
        }
        let mut at = lo;
        // glibc's `mmap`ed chunks, one after the other where the kernel merged their mappings.
        while let Some(size) = mmapped_chunk(&Process::this(), at, hi) {
            at += size;
        }
        if at >= hi || glibc_heap(&Process::this(), at, hi) || holds_a_block(blocks, at, hi) {
            continue;
        }
        // The modules' segments and the stop's own mappings may share a mapping with the
        // program's, where the kernel merged neighbours: only they are left out.
        let mut cut: [(u64, u64); 8] = [(0, 0); 8];
        let mut n = 0;
        for &(a, b) in modules.ranges().iter().chain(own) {
            if a < hi && at < b && n < cut.len() {
                cut[n] = (a.max(at), b.min(hi));
                n += 1;
            }
        }
        let cut = &mut cut[..n];
        cut.sort_unstable();
        for &(a, b) in cut.iter() {
            if at < a {
                resident(at, a, &mut |lo, hi| out.push(Root::range(lo, hi)));
            }
            at = at.max(b);
        }
        if at < hi {
            resident(at, hi, &mut |lo, hi| out.push(Root::range(lo, hi)));
        }
    }
}

/// Whether a live block starts in `[lo, hi)` (`blocks` sorted by address).
fn holds_a_block(blocks: &[Live], lo: u64, hi: u64) -> bool {
    let i = blocks.partition_point(|b| b.addr < lo);
    blocks.get(i).is_some_and(|b| b.addr < hi)
}

/// Calls `f` on each run of resident pages of `[lo, hi)` (`mincore`) that are not the arena's:
/// a mapping reserved but never touched costs nothing to skip, however large.
fn resident(lo: u64, hi: u64, f: &mut impl FnMut(u64, u64)) {
    const PAGE: u64 = 4096;
    const CHUNK: usize = 4096;
    let mut vec = [0u8; CHUNK];
    let mut at = lo & !(PAGE - 1);
    let mut run: Option<u64> = None;
    while at < hi {
        let len = (hi - at).min(CHUNK as u64 * PAGE);
        let pages = len.div_ceil(PAGE) as usize;
        // SAFETY: `vec` has a byte for each of the pages of `[at, at + len)`.
        let whole = unsafe { mincore(at, len, vec.as_mut_ptr()) };
        if !whole {
            // Part of the range was unmapped since the maps were read (the arena gives back
            // pages it merged with the program's while the scan runs): each page alone, so
            // one gone page does not hide the rest.
            for (i, v) in vec[..pages].iter_mut().enumerate() {
                // SAFETY: one byte for one page.
                if !unsafe { mincore(at + i as u64 * PAGE, PAGE, v) } {
                    *v = 0;
                }
            }
        }
        for (i, v) in vec[..pages].iter().enumerate() {
            let page = at + i as u64 * PAGE;
            // The arena's pages (the tracer's tables hold every block's address) may share a
            // mapping with the program's, where the kernel merged neighbours.
            let wanted = v & 1 != 0 && !crate::arena::owns(page as *const u8);
            match (wanted, run) {
                (true, None) => run = Some(page),
                (false, Some(start)) => {
                    f(start, page);
                    run = None;
                }
                _ => {}
            }
        }
        at += len;
    }
    if let Some(start) = run {
        f(start, hi);
    }
}

/// `mincore` of the page-aligned `[at, at + len)`, whether it succeeded (not where a page in
/// it is unmapped).
///
/// # Safety
/// `vec` must have room for a byte per page of the range.
unsafe fn mincore(at: u64, len: u64, vec: *mut u8) -> bool {
    // SAFETY: mincore only reads the page tables; `vec` is the caller's promise.
    unsafe { libc::mincore(at as *mut libc::c_void, len as usize, vec) == 0 }
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
