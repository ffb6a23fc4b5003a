//! Blocks recorded in a tag in front of them rather than in the table (`store::tags`): what
//! the hooks do around glibc for them.
//!
//! A tagged block is counted as a table block is (its stack's counters, its thread's bytes,
//! the global live bytes and peak), and its free is remembered as a table block's is (history,
//! free stack, quarantine: `record::free_tagged`). Its tag carries its sequence number only
//! where the history needs it (`tags::configure`).

use super::status::{not_recording, thread_index, FREES};
use super::steps::{remember_free, stack_here};
use crate::config;
use crate::guard::Guard;
use crate::profile;
use crate::store::tags;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};
use mem_trace_format::Block;

/// Whether a tagged block's free is remembered (the history, free stacks or the quarantine
/// is on: debug mode) rather than only counted. Set once, at initialisation: profile mode's
/// frees then take none of the work (a call each into the history and the quarantine was 8%
/// more instructions on the Rust workload).
static KEPT: AtomicBool = AtomicBool::new(false);

/// Sets [`frees_kept`] (initialisation).
pub(crate) fn configure(kept: bool) {
    KEPT.store(kept, Ordering::Relaxed);
}

/// Whether frees of tagged blocks go through `record::free_tagged`, or only [`freed`].
#[inline(always)]
pub fn frees_kept() -> bool {
    KEPT.load(Ordering::Relaxed)
}

/// Bytes to ask glibc for so that a block of `size` bytes can carry a tag, or `None` when it
/// goes to the table: tags are off, the block is too large for one, or the tracer stopped
/// recording (degraded: new blocks go unrecorded, as table blocks do).
#[inline(always)]
pub fn room(size: usize) -> Option<usize> {
    tags::room(size).filter(|_| !not_recording())
}

/// Tags and counts the chunk `p0` that glibc returned for a block of `size` bytes (asked with
/// [`room`]), and returns the block the program gets; null stays null.
///
/// # Safety
/// `p0` is null or a fresh chunk of glibc's of at least `room(size)` bytes.
#[inline(always)]
pub unsafe fn tag(g: &Guard, p0: *mut c_void, size: usize) -> *mut c_void {
    if p0.is_null() {
        return p0;
    }
    let stack = stack_here(g.state());
    // SAFETY: forwarded contract.
    unsafe { tag_with(g, p0, size, stack) }
}

/// [`tag`] with the stack captured already.
///
/// # Safety
/// `p0` is a fresh chunk of glibc's of at least `room(size)` bytes.
#[inline(always)]
unsafe fn tag_with(g: &Guard, p0: *mut c_void, size: usize, stack: u32) -> *mut c_void {
    let state = g.state();
    let thread = thread_index(state);
    let size = size as u64;
    let (seq, live) = profile::tick(size);
    // SAFETY: forwarded contract; `room` returned `Some` only for a size under the limit.
    let q = unsafe { tags::write(p0, size, thread, stack, seq) };
    let block = Block {
        addr: q as u64,
        size,
        thread,
        seq,
        stack,
    };
    profile::allocated(state, &block, (size, 1), live);
    q
}

/// If `p` is a tagged block: uncounts it from its stack and thread, erases its tag, and
/// returns it. Its chunk ([`tags::chunk`]) is then the caller's to free or reallocate; the
/// global live bytes move with the caller's `record::free_tagged` or [`reallocated`].
///
/// # Safety
/// As for `tags::read`: `p` is what the program passed to `free` or `realloc`.
#[inline(always)]
pub unsafe fn untag(g: &Guard, p: *mut c_void) -> Option<Block> {
    // SAFETY: forwarded contract.
    let block = unsafe { tags::read(p) }?;
    // SAFETY: `read` vouched for the tag; the program gives the block up.
    unsafe { tags::erase(p) };
    profile::forgotten(g.state(), &block, (block.size, 1));
    Some(block)
}

/// [`untag`] for debug mode's free, where several threads may free one block at once (a
/// double free in a thread pool): the tag is erased with a compare-and-swap, so exactly one
/// of them takes the block; the others find it gone and are told apart by
/// `record::racing`. A locked instruction on a line just read, on the free path of the mode
/// that already records and holds every free.
///
/// # Safety
/// As for [`untag`].
#[inline(always)]
pub unsafe fn untag_once(g: &Guard, p: *mut c_void) -> Option<Block> {
    // SAFETY: forwarded contract.
    let block = unsafe { tags::read(p) }?;
    // SAFETY: `read` vouched for the tag; the program gives the block up.
    if !unsafe { tags::claim(p) } {
        return None;
    }
    profile::forgotten(g.state(), &block, (block.size, 1));
    Some(block)
}

/// Counts the free of a block [`untag`] returned when frees are not kept (see
/// [`frees_kept`]), and returns its chunk for the caller to give glibc.
#[inline(always)]
pub fn freed(block: &Block) -> *mut c_void {
    if config::STATS.load(Ordering::Relaxed) {
        FREES.fetch_add(1, Ordering::Relaxed);
    }
    profile::tick(block.size.wrapping_neg());
    tags::chunk(block.addr as *mut c_void)
}

/// Records what glibc's `realloc` did with the chunk of a tagged block `old` ([`untag`]
/// returned it): moved it (`moved`), the old block's free remembered as `free` remembers it,
/// or resized it where it was. Tags the new chunk `q0` and returns the block the program gets.
/// One capture serves as the old block's free stack and the new block's allocation stack.
///
/// # Safety
/// `q0` is the chunk glibc's `realloc` returned for at least `room(size)` bytes.
#[inline(always)]
pub unsafe fn reallocated(
    g: &Guard,
    old: &Block,
    moved: bool,
    q0: *mut c_void,
    size: usize,
) -> *mut c_void {
    let state = g.state();
    let stack = stack_here(state);
    if moved && !frees_kept() {
        freed(old);
    } else if moved {
        let free_stack = match config::FREE_STACKS.load(Ordering::Relaxed) {
            true => stack,
            false => 0,
        };
        remember_free(state, *old, free_stack, true);
    } else {
        // The new block's own event follows, as for a table block.
        profile::untick(old.size);
    }
    // SAFETY: forwarded contract.
    unsafe { tag_with(g, q0, size, stack) }
}

/// Puts back a block [`untag`] returned whose `realloc` failed: the program still owns it.
///
/// # Safety
/// `block` came from [`untag`] and its chunk was not freed.
pub unsafe fn restore(g: &Guard, block: &Block) {
    // SAFETY: forwarded contract.
    unsafe { tags::restore(tags::chunk(block.addr as *mut c_void), block) };
    profile::restored(g.state(), block, (block.size, 1));
}

/// A tagged block freed where the tracer cannot count (a signal handler's `free` that
/// interrupted a hook on this thread): its tag is erased so that its chunk can go back to
/// glibc, and its bytes stay counted to its stack. Returns the chunk.
///
/// # Safety
/// As for [`untag`].
#[cold]
pub unsafe fn untag_uncounted(p: *mut c_void) -> Option<*mut c_void> {
    // SAFETY: forwarded contract.
    unsafe { tags::read(p) }?;
    // SAFETY: `read` vouched for the tag; the program gives the block up.
    Some(unsafe { tags::erase(p) })
}
