//! What a hook does around the real allocator: capture, intern, publish on allocation; forget,
//! remember and quarantine on free. The caller (the preload library's hooks) enters the
//! reentrancy guard and calls the real allocator; this module never does either.
//!
//! Order matters: a block is recorded after the real allocation returns, and forgotten before
//! the real free. Once freed, another thread may get the same address from `malloc` and record
//! it, and forgetting afterwards would erase that new block.

pub mod attached;
pub(crate) mod batch;
pub(crate) mod deferred;
mod invalid;
mod lifecycle;
pub mod nested;
pub mod racing;
mod status;
mod steps;
pub mod tagged;

use lifecycle::ready;
pub use lifecycle::{on_load, on_unload, thread_started};

use crate::capture;
use crate::config;
use crate::guard::Guard;
use crate::profile;
use crate::real::RealAlloc;
use crate::report::Op;
use crate::sample::{self, Filter};
use crate::state::ThreadState;
use crate::store::header::header;
use crate::store::{quarantine, table, tags};
use core::ffi::c_void;
use core::sync::atomic::Ordering;
use invalid::unknown_pointer;
use mem_trace_format::Block;
use status::{is_ready, not_recording, thread_index};
use steps::{free_stack_here, held_entry, remember_free, stack_here};

/// What the free hook must do with a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Hand it to the real allocator now.
    Release,
    /// Kept in quarantine; the real allocator gets it later.
    Held,
    /// A double or invalid free, reported; the real allocator must never see it (glibc would
    /// abort).
    Reject,
    /// Nothing left to do: the block was the tracer's own (see `nested`), given back.
    Done,
}

/// Records a block the real allocator just returned (with `MEM_TRACE_SAMPLE`, only when it
/// is sampled).
#[inline(always)]
pub fn allocated(g: &Guard, p: *mut c_void, size: usize) {
    if !p.is_null() {
        if ready() {
            if sample::on() && skipped(g.state(), size as u64) {
                return;
            }
            record(g.state(), p as u64, size as u64);
        } else {
            untracked();
        }
    }
}

/// Says that this thread frees `addr` until the result is dropped (see `racing::freeing`):
/// the thread's part of the racing frees' slots, taken from the guard's state.
#[inline(always)]
pub fn freeing(g: &Guard, addr: u64) -> racing::Freeing {
    racing::freeing(&g.state().freeing, addr)
}

/// Whether an allocation of `size` bytes goes unrecorded under sampling.
#[inline(always)]
fn skipped(state: &ThreadState, size: u64) -> bool {
    state.sample.skip(size, || thread_index(state))
}

/// Counts a block that was not recorded (the tracer is starting on another thread, or
/// degraded), so that readers know an address may be one they cannot explain.
#[cold]
#[inline(never)]
fn untracked() {
    header().untracked.fetch_add(1, Ordering::Relaxed);
}

/// The real allocator returned null: gives it back every block the quarantine holds (every
/// thread's, recycling lists included), and says whether there were any, in which case the
/// caller asks it once more before returning null to the program. A program that runs out of
/// memory then fails as it would without the tracer, not earlier for the blocks held back.
/// (`g`: only from inside the tracer, where the real frees below are not the program's.)
#[cold]
#[inline(never)]
pub fn give_back<R: RealAlloc>(g: &Guard, real: &R) -> bool {
    // This thread's batch of frees first, so that the drain finds them held (or, once the
    // quarantine stopped holding, so that they go back now).
    let mut any = deferred::flush(g, real);
    let mut at = quarantine::Drain::default();
    let mut released = quarantine::released();
    loop {
        let more = quarantine::drain(&mut at, &mut released);
        for &a in released.addrs() {
            // SAFETY: a block the program freed and that we held back; nobody else owns it.
            g.in_glibc(|| unsafe { real.free(a as *mut c_void) });
            any = true;
        }
        if !more {
            return any;
        }
    }
}

/// Where the stacks the caller records start: its own frame, read where this is inlined, and
/// not the tracer's frames below it. For an allocator wrapper linked into the program
/// (`capture::modules::tracer_in_program`); dropping it undoes it.
pub struct StartHere<'g>(&'g Guard);

/// Stacks recorded while the result lives start at the caller's frame (see [`StartHere`]).
#[inline(always)]
pub fn start_here(g: &Guard) -> StartHere<'_> {
    start_at(g, registers())
}

/// The registers a stack starts from (pc, sp, rbp), read where this is inlined.
#[inline(always)]
pub fn registers() -> (u64, u64, u64) {
    capture::registers()
}

/// Like [`start_here`], from registers the caller read (see [`registers`]): for a wrapper
/// that hands its records to another copy of the tracer, which then starts where the
/// wrapper read them, in the same thread.
#[inline(always)]
pub fn start_at(g: &Guard, regs: (u64, u64, u64)) -> StartHere<'_> {
    set_start(g, Some(regs));
    StartHere(g)
}

/// Stacks recorded while the result lives start at the frame a hook returns to: `sp` is the
/// caller's stack pointer once the hook returns, `bp` its rbp, both as they were at the
/// hook's first instruction (see `capture::start_at_return`). `None`, changing nothing,
/// when an allocator wrapper's start is set already (its frames are skipped from there).
///
/// # Safety
/// The hook's return address is at `sp - 8` on this thread's stack, and the hook has not
/// returned.
#[inline(always)]
pub unsafe fn start_at_caller(g: &Guard, sp: u64, bp: u64) -> Option<StartHere<'_>> {
    // SAFETY: forwarded contract.
    let set = unsafe { capture::start_at_return(&g.state().capture, sp, bp) };
    // Not `then_some`: a `StartHere` made and dropped would clear the wrapper's start.
    set.then(|| StartHere(g))
}

/// Where this thread's stacks start until changed again: at `regs` (see [`start_at`]), or,
/// with `None`, where they are captured. For a caller that cannot hold a [`StartHere`]
/// across the calls it covers.
#[inline(always)]
pub fn set_start(g: &Guard, regs: Option<(u64, u64, u64)>) {
    match regs {
        Some(regs) => capture::start_at(&g.state().capture, regs),
        None => capture::start_here(&g.state().capture),
    }
}

impl Drop for StartHere<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        set_start(self.0, None);
    }
}

fn record(state: &ThreadState, addr: u64, size: u64) {
    // The table line loads while the stack is walked.
    table::prefetch(addr, size);
    let stack = stack_here(state);
    record_with(state, addr, size, stack);
}

fn record_with(state: &ThreadState, addr: u64, size: u64, stack: u32) {
    let thread = thread_index(state);
    let counted = sample::counted(addr, size);
    let (seq, live) = profile::tick(counted.0);
    let block = Block {
        addr,
        size,
        thread,
        seq,
        stack,
    };
    if insert(block) {
        if sample::on() {
            Filter::add(addr);
        }
        profile::allocated(state, &block, counted, live);
    } else {
        profile::untick(counted.0);
    }
}

/// Publishes a block in the table, counting it in the header when no memory is left for it.
fn insert(block: Block) -> bool {
    let recorded = table::insert(block);
    if !recorded {
        untracked();
    }
    recorded
}

/// Forgets a block that is about to be freed or moved, returning what was recorded. Called
/// *before* the real `free`/`realloc` (see the module documentation).
#[inline(always)]
pub fn take(g: &Guard, p: *mut c_void) -> Option<Block> {
    if p.is_null() || !is_ready() || unsampled(p) {
        return None;
    }
    let block = table::remove(p as u64)?;
    if sample::on() {
        Filter::remove(block.addr);
    }
    profile::forgotten(g.state(), &block, sample::counted(block.addr, block.size));
    Some(block)
}

/// Under sampling, `p` is surely no sampled block: its free or realloc goes to the real
/// allocator without a look in the table.
#[inline(always)]
fn unsampled(p: *mut c_void) -> bool {
    sample::on() && !Filter::may_hold(p as u64)
}

/// The whole of `free` but handing the block itself to the real allocator: forget the block,
/// remember who freed it, and say whether the real allocator gets it now, later (quarantine),
/// or never (a double or invalid free). Blocks the quarantine lets go meanwhile go back
/// through `real`.
pub fn free<R: RealAlloc>(g: &Guard, p: *mut c_void, real: &R) -> Disposition {
    if unsampled(p) {
        return Disposition::Release;
    }
    let block = match forget_freed(g, p, R::GLIBC_HEAP) {
        Ok(block) => block,
        Err(disposition) => return disposition,
    };
    match held(g, block.addr, block.size, real) {
        true => Disposition::Held,
        false => Disposition::Release,
    }
}

/// The whole of `free` for a tagged block that [`tagged::untag`] returned, when frees are kept
/// ([`tagged::frees_kept`]): its free counted and remembered (in the history, with its stack,
/// when they are on), its chunk held in quarantine when one is on. Returns the chunk for the
/// caller to give glibc now, or `None` when the quarantine holds it.
#[inline(never)]
pub fn free_tagged<R: RealAlloc>(g: &Guard, block: Block, real: &R) -> Option<*mut c_void> {
    let state = g.state();
    if deferred::defers(state) {
        deferred::free(g, block, free_stack_here(state), real);
        return None;
    }
    quarantine::prefetch_next_release(&state.quarantine);
    remember_free(state, block, free_stack_here(state), false);
    let (entry, bytes) = held_entry(&block);
    let chunk = tags::chunk(block.addr as *mut c_void);
    (!held(g, entry, bytes, real)).then_some(chunk)
}

/// Offers the quarantine a freed block (`entry`, of `size` bytes asked of glibc, see
/// `quarantine::hold`) and gives the real allocator what the quarantine lets go meanwhile.
/// Whether the block is held.
fn held<R: RealAlloc>(g: &Guard, entry: u64, size: u64, real: &R) -> bool {
    let mut released = quarantine::released();
    if !quarantine::hold(&g.state().quarantine, entry, size, &mut released) {
        return false;
    }
    for &a in released.addrs() {
        // SAFETY: a block the program freed and that we held back; nobody else owns it.
        g.in_glibc(|| unsafe { real.free(a as *mut c_void) });
    }
    true
}

/// [`free`] for an allocator that needs a block's layout to free it (a Rust `GlobalAlloc`),
/// which the quarantine cannot keep: the block is forgotten and remembered as freed, and the
/// caller releases it at once (`Release`) or, for a double or invalid free, never (`Reject`).
pub fn free_unheld(g: &Guard, p: *mut c_void) -> Disposition {
    match forget_freed(g, p, false) {
        Ok(_) => Disposition::Release,
        Err(disposition) => disposition,
    }
}

/// The common part of the two frees: the live block `p` was, now in the freed history, or
/// what to do with a pointer that is no live block (`glibc`: the real allocator is glibc's,
/// whose heap can tell a wild pointer, see `RealAlloc::GLIBC_HEAP`).
fn forget_freed(g: &Guard, p: *mut c_void, glibc: bool) -> Result<Block, Disposition> {
    if !is_ready() {
        return Err(Disposition::Release);
    }
    let state = g.state();
    // The stack first, so that the table line (prefetched here) loads meanwhile; on a double
    // or invalid free, rare, it is captured for nothing.
    table::prefetch(p as u64, 0);
    let free_stack = free_stack_here(state);
    let Some(block) = take(g, p) else {
        // Once degraded (or detached), blocks go unrecorded: a pointer the table does not
        // know is most likely one of them, and its free must free.
        if not_recording() {
            return Err(Disposition::Release);
        }
        // A block a signal handler got from the tracer's arena (`nested`), then kept.
        // SAFETY: the pointer is one the program frees: a live block, or reported below.
        if glibc && unsafe { nested::free(p) } {
            return Err(Disposition::Done);
        }
        // Under sampling, an unsampled block whose address shares a filter count with a
        // sampled one.
        if sample::on() {
            return Err(Disposition::Release);
        }
        return Err(
            match unknown_pointer(state, p as u64, Op::Free, glibc && crate::real::is_glibc()) {
                true => Disposition::Release,
                false => Disposition::Reject,
            },
        );
    };
    remember_free(state, block, free_stack, false);
    Ok(block)
}

/// A block (or a tagged block's chunk) of `size` bytes the quarantine recycles, or null (see
/// `quarantine::reuse`). Only a quarantine recycles, and there is one only where frees are
/// kept: elsewhere (profile mode) this costs one flag's load. This thread's batch of frees is
/// held first (see `deferred::allocating`).
#[inline(always)]
pub fn reuse<R: RealAlloc>(g: &Guard, size: usize, real: &R) -> *mut c_void {
    if !tagged::frees_kept() {
        return core::ptr::null_mut();
    }
    let state = g.state();
    deferred::allocating(g, real);
    // The quarantine matches blocks by glibc's chunk sizes: another allocator's size classes
    // differ (jemalloc's 8-byte class would pass for a 24-byte chunk), so nothing is recycled
    // there and the quarantine's blocks go back through `real` as they leave it.
    if !crate::real::is_glibc() {
        return core::ptr::null_mut();
    }
    quarantine::reuse(&state.quarantine, size)
}

/// Records what the real `realloc` of `p` did: `old` is what [`take`] returned for `p` before
/// it, `q` the result for `size` bytes (null: failed, or `size` 0 freed the block).
pub fn reallocated(g: &Guard, old: Option<Block>, p: *mut c_void, q: *mut c_void, size: usize) {
    match (q.is_null(), old) {
        (false, Some(old)) if q != p => moved(g, old, q, size),
        (false, Some(old)) => resized(g, old, q, size),
        (false, None) => allocated(g, q, size),
        // realloc(p, 0) freed the block.
        (true, Some(old)) if size == 0 => freed_by_realloc(g, old),
        // Failed to grow: the old block is untouched and still the program's.
        (true, Some(old)) => restore(g, old),
        (true, None) => {}
    }
}

/// Notes that `realloc(p, 0)` freed `block`.
pub fn freed_by_realloc(g: &Guard, block: Block) {
    let state = g.state();
    remember_free(state, block, free_stack_here(state), true);
}

/// Notes that `realloc` moved `old` to `q`, now `size` bytes: one capture serves as the old
/// block's free stack and the new block's allocation stack (same call).
/// (`old` was a recorded block, so the tracer is ready.)
pub fn moved(g: &Guard, old: Block, q: *mut c_void, size: usize) {
    let state = g.state();
    if not_recording() {
        remember_free(state, old, 0, true);
        untracked();
        return;
    }
    if sample::on() && skipped(state, size as u64) {
        // The new block is not sampled: the old one's free is all there is to record.
        remember_free(state, old, free_stack_here(state), true);
        return;
    }
    table::prefetch(q as u64, size as u64);
    let stack = stack_here(state);
    let free_stack = if config::FREE_STACKS.load(Ordering::Relaxed) {
        stack
    } else {
        0
    };
    remember_free(state, old, free_stack, true);
    record_with(state, q as u64, size as u64, stack);
}

/// Whether `realloc` may pass `p` to the real allocator `_real` (see
/// `invalid::unknown_pointer`); `p` is not a live block.
pub fn realloc_unknown<R: RealAlloc>(g: &Guard, p: *mut c_void, _real: &R) -> bool {
    !is_ready()
        || not_recording()
        || sample::on()
        || unknown_pointer(
            g.state(),
            p as u64,
            Op::Realloc,
            R::GLIBC_HEAP && crate::real::is_glibc(),
        )
}

/// Notes that `realloc` resized `old` where it was, now `q` (== old.addr) of `size` bytes:
/// a new block of this call, without a free event for the old one.
pub fn resized(g: &Guard, old: Block, q: *mut c_void, size: usize) {
    profile::untick(sample::counted(old.addr, old.size).0);
    allocated(g, q, size);
}

/// Puts back a block that `realloc` failed to move (the old block is still valid).
pub fn restore(g: &Guard, block: Block) {
    if insert(block) {
        if sample::on() {
            Filter::add(block.addr);
        }
        profile::restored(g.state(), &block, sample::counted(block.addr, block.size));
    }
}
