//! Debug mode's frees of tagged blocks, recorded in the freed-block history and held in
//! quarantine [`BATCH`] at a time.
//!
//! Why: a program whose free loop has a miss or two per iteration (walk a list, free what it
//! points to) runs those misses in parallel across iterations when `free` is short, as
//! glibc's is. Behind a free that also writes a history record, inserts it into the address
//! index (a random line) and takes the quarantine's turn (which gives glibc a block freed a
//! quarantine ago, cold), the processor's window no longer reaches the next iteration, and
//! the misses are waited for one by one: `live` in debug mode ran 1.1 times heaptrack's
//! overhead for that alone (docs/FINDINGS.md "Frees in batches"). So a free that follows a
//! free captures its stack and rewrites the block's tag as a freed tag (`tags::mark_freed`):
//! who freed it is then in the block's own memory, where readers look first, and a second
//! `free` of it is told at once. The records and the holds follow for the whole batch, when
//! it is full or when this thread next allocates, whichever comes first ([`allocating`]).
//!
//! A free that follows an allocation is recorded and held at once, as before: a program that
//! allocates and frees in turn gains nothing from a batch of one, and paid ~100 instructions
//! a free for it (`deep` ran 7% longer).
//!
//! Only where both the history and a quarantine of at least `quarantine::MIN_SHARE` bytes are
//! on, with long tags: the chunk stays the tracer's until the batch holds it, so the
//! quarantine must take any tagged chunk.
//!
//! A batch is not lost when its thread stops freeing: it is taken at the thread's exit (held
//! without releasing anything, see `quarantine::keep`) and before the quarantine is drained
//! for memory. What a `fork` leaves of other threads' batches in the child stays held there:
//! at most [`BATCH`] small blocks per thread, never reused.

use super::steps::{freed_now, held_entry};
use crate::guard::Guard;
use crate::real::RealAlloc;
use crate::state::ThreadState;
use crate::store::{freed, quarantine, tags};
use core::ffi::c_void;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, Ordering};
use mem_trace_format::Block;

use super::batch::BATCH;

/// Whether frees of tagged blocks are deferred (set once, at initialisation).
static ON: AtomicBool = AtomicBool::new(false);

/// Sets [`on`] (initialisation, after the tags are configured).
pub(crate) fn configure(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether frees of tagged blocks go into a batch.
#[inline(always)]
fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The free of the tagged block `block` ([`tagged::untag`](super::tagged::untag) erased its
/// tag), stack `free_stack`: its tag freed, the block put in this thread's batch, and the
/// batch recorded and held when full (what the quarantine lets go meanwhile goes through
/// `real`).
#[inline(always)]
pub(super) fn free<R: RealAlloc>(g: &Guard, block: Block, free_stack: u32, real: &R) {
    let state = g.state();
    let f = freed_now(state, block, free_stack, false);
    // SAFETY: deferring is on only with long tags; `untag` erased the block's tag, and its
    // chunk is the tracer's until the batch holds it.
    unsafe { tags::mark_freed(&f) };
    let batch = &state.deferred;
    let n = batch.n.get();
    batch.blocks[n as usize].set(block.addr);
    batch.n.set(n + 1);
    if n as usize + 1 == BATCH {
        let _ = flush(g, real);
    }
}

/// Whether this free of a tagged block goes into this thread's batch: batches are on and the
/// thread's last call was a free too.
#[inline(always)]
pub(super) fn defers(state: &ThreadState) -> bool {
    let run = &state.deferred.run;
    let before = run.get();
    run.set(before.saturating_add(1));
    on() && before != 0
}

/// This thread allocates: its batch is held first, as each of its frees would have been at
/// its `free`, so that what they pushed out of the quarantine is there to reuse as without
/// batches (python3's py_records ran 10% longer when its allocations found the recycling lists
/// emptied for up to 32 frees), and a batch of blocks too large to recycle does not wait past
/// the run of frees that made it. What the quarantine lets go goes through `real`.
#[inline(always)]
pub(super) fn allocating<R: RealAlloc>(g: &Guard, real: &R) {
    let batch = &g.state().deferred;
    batch.run.set(0);
    if batch.n.get() != 0 {
        let _ = flush(g, real);
    }
}

/// Records each free of this thread's batch in the history, then holds its block. Once its
/// record is in the history a block's freed tag is erased: the history answers for it from
/// then on, and no freed tag outlives its batch (the quarantine hands its chunks on to glibc
/// or to a `malloc`, and an erase there, on a block freed a quarantine ago, waited for its
/// page walk: 15% of `hold`'s time on py_records). What the holds let go is given to glibc
/// after all of them, each chunk's header loaded from when it was let go: those chunks were
/// freed a quarantine ago, long out of the cache, and given back one hold at a time each
/// waited for its own. Whether anything went back to glibc.
#[inline(never)]
pub(super) fn flush<R: RealAlloc>(g: &Guard, real: &R) -> bool {
    let state = g.state();
    let mut out = LetGo::new();
    let mut released = quarantine::released();
    for q in state.deferred.take() {
        let (entry, bytes) = record(state, q);
        // SAFETY: a block of the batch, its free now in the history.
        let chunk = unsafe { tags::erase(q as *mut c_void) } as u64;
        if quarantine::hold(&state.quarantine, entry, bytes, &mut released) {
            for &a in released.addrs() {
                out.add(g, real, a);
            }
        } else {
            out.add(g, real, chunk);
        }
    }
    out.free(g, real);
    out.any
}

/// Puts the free of `q`, a block of this thread's batch, in the history; returns its chunk's
/// quarantine entry and size (see `held_entry`).
#[inline(always)]
fn record(state: &ThreadState, q: u64) -> (u64, u64) {
    // SAFETY: a block of the batch: its freed tag is intact while the tracer holds it.
    let f = unsafe { tags::held_freed(q) };
    freed::push(&state.history, &f);
    held_entry(&f.block)
}

/// Chunks a batch lets go, to give glibc together. Left uninitialised beyond `n`: a program
/// that frees in short runs flushes a batch of a few at each allocation.
struct LetGo {
    n: usize,
    chunks: [MaybeUninit<u64>; 2 * BATCH],
    /// Whether any was given to glibc.
    any: bool,
}

impl LetGo {
    fn new() -> Self {
        LetGo {
            n: 0,
            chunks: [MaybeUninit::uninit(); 2 * BATCH],
            any: false,
        }
    }

    /// Adds `chunk` (its header starts loading), giving glibc those before it if full.
    #[inline(always)]
    fn add<R: RealAlloc>(&mut self, g: &Guard, real: &R, chunk: u64) {
        if self.n == self.chunks.len() {
            self.free(g, real);
        }
        crate::prefetch::line(chunk.wrapping_sub(8) as *const u8);
        self.chunks[self.n] = MaybeUninit::new(chunk);
        self.n += 1;
    }

    /// Gives glibc every chunk added.
    fn free<R: RealAlloc>(&mut self, g: &Guard, real: &R) {
        for c in &self.chunks[..self.n] {
            // SAFETY: the first `n` chunks were written by `add`.
            let a = unsafe { c.assume_init() } as *mut c_void;
            // SAFETY: a block the program freed and the tracer held; nobody else owns it.
            g.in_glibc(|| unsafe { real.free(a) });
        }
        self.any |= self.n != 0;
        self.n = 0;
    }
}

/// The thread is exiting: its batch is recorded and held in its quarantine, which is then
/// orphaned with them (nothing is given back to glibc here: no allocator call).
pub(super) fn thread_exiting(state: &ThreadState) {
    for q in state.deferred.take() {
        let (entry, bytes) = record(state, q);
        // Refused (no memory for the quarantine): the block stays held for good, and its
        // freed tag with it.
        if quarantine::keep(&state.quarantine, entry, bytes) {
            // SAFETY: a block of the batch, its free now in the history.
            unsafe { tags::erase(q as *mut c_void) };
        }
    }
}
