//! Blocks recorded in a tag in front of them rather than in the table (profile mode,
//! `store::tags`): what the hooks do around glibc for them.
//!
//! A tagged block is counted as a table block is (its stack's counters, its thread's bytes,
//! the global live bytes and peak), but it has no sequence number of its own and is never in
//! the freed-block history: tags are on only when the history, free stacks, the quarantine and
//! sampling are all off.

use super::{not_recording, stack_here, thread_index, FREES};
use crate::config;
use crate::guard::Guard;
use crate::profile;
use crate::store::tags;
use core::ffi::c_void;
use core::sync::atomic::Ordering;
use mem_trace_format::Block;

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
    let state = g.state();
    let stack = stack_here(state);
    let thread = thread_index(state);
    let size = size as u64;
    let (seq, live) = profile::tick(size);
    // SAFETY: forwarded contract; `room` returned `Some` only for a size under the limit.
    let q = unsafe { tags::write(p0, size, thread, stack) };
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
/// global live bytes move with the caller's [`freed`] or [`resized`].
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

/// Counts the free of a block [`untag`] returned (the program freed it, or `realloc` moved it
/// or freed it): one event of the global count.
#[inline(always)]
pub fn freed(block: &Block) {
    if config::STATS.load(Ordering::Relaxed) {
        FREES.fetch_add(1, Ordering::Relaxed);
    }
    profile::tick(block.size.wrapping_neg());
}

/// Counts the end of a block [`untag`] returned that `realloc` resized where it was: the new
/// block's own event follows, as for a table block.
pub fn resized(block: &Block) {
    profile::untick(block.size);
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
