//! The tracer in a process that was already running when `mem-trace attach` loaded it.
//!
//! The library is `dlopen`ed there, not preloaded: its constructor does nothing, and the
//! command's injected call to the library's `mem_trace_attach` initialises the tracer with
//! the command's settings ([`attach`]) before the hooks are put in the modules' GOTs. What
//! follows differs from a preloaded run in one way that matters here: blocks allocated
//! before the attach, or since through paths that were never redirected (ld.so's own
//! allocator, a function pointer to `malloc` taken earlier), are unknown to the tables, and
//! their frees must reach glibc as if the tracer were not there. So an attached tracer's
//! checks on an unknown pointer report but pass it on, and skip the two checks whose answer
//! is no longer reliable (the freed history, glibc's heap walk: see `invalid`).
//!
//! [`detach`] stops recording, gives every quarantined block back to glibc and forgets the
//! live blocks (their frees will no longer be seen, so keeping them would show them live for
//! ever); a later [`attach`] resumes with the first attach's settings.

use super::{lifecycle, status};
use crate::config;
use crate::guard::Guard;
use crate::real::RealAlloc;
use crate::store::header::header;
use crate::store::{quarantine, table};
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};
use mem_trace_format::FLAG_ATTACHED;

/// Whether the first attach's start-up (fork handlers, profiler) was done.
static STARTED: AtomicBool = AtomicBool::new(false);
/// What `detach` turned off, put back by the next attach.
static SAVED_UNWIND: AtomicBool = AtomicBool::new(true);
static SAVED_FREE_STACKS: AtomicBool = AtomicBool::new(true);

/// What [`attach`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// The tracer started, with the settings given.
    Started,
    /// The tracer, detached earlier, records again with the first attach's settings.
    Resumed,
    /// It was recording already.
    Already,
}

/// Starts (or resumes) recording in a process the library was `dlopen`ed into. `settings`
/// are `NAME=VALUE` lines with the environment variables' names, used instead of the
/// process's environment; they are read at the first attach only. Called from the thread
/// `mem-trace attach` chose, at a point where it is not inside the allocator or the loader,
/// before any GOT entry points at the hooks: nothing reaches the tracer concurrently.
pub fn attach(settings: &str) -> Result<Attached, &'static str> {
    status::ATTACHED.store(true, Ordering::Relaxed);
    let _ = config::ATTACH_SETTINGS.set(settings.to_string());
    // Blocks a hook was still recording while the last detach swept the table: their frees
    // since went to glibc unseen. No hook runs now (the GOT entries are glibc's), so the
    // sweep is complete this time.
    if let Some(g) = Guard::enter() {
        forget_live(&g);
    }
    // What the readers tell of an address they do not know: attached at this event.
    let h = header();
    h.attached_at
        .store(h.next_seq.load(Ordering::Relaxed), Ordering::Relaxed);
    if lifecycle::resume_recording(|| {
        config::UNWIND.store(SAVED_UNWIND.load(Ordering::Relaxed), Ordering::Relaxed);
        config::FREE_STACKS.store(SAVED_FREE_STACKS.load(Ordering::Relaxed), Ordering::Relaxed);
    }) {
        // The peaks of the earlier attach were of blocks now forgotten: this one starts its
        // own, as a reset would.
        crate::profile::peaks::reset();
        return Ok(Attached::Resumed);
    }
    if STARTED.swap(true, Ordering::AcqRel) {
        return Ok(Attached::Already);
    }
    if !lifecycle::start() {
        return Err("the tracer could not start (out of memory for its tables)");
    }
    // No quarantine: it recycles a held block for a request up to the size recorded, and in
    // an attached process a recorded size can be stale (a block a hook recorded while a
    // detach swept the table, freed by glibc unseen, its address reused for a smaller one):
    // recycling it would overrun that block (seen: heap corruption after a few dozen
    // attach/detach cycles of a busy program).
    quarantine::stop();
    header().flags.fetch_or(FLAG_ATTACHED, Ordering::Relaxed);
    lifecycle::after_start();
    Ok(Attached::Started)
}

/// Stops recording (the GOT entries are restored by the caller first): hands every
/// quarantined block back through `real`, and forgets every live block, whose free may now go
/// to glibc unseen. Returns the number of blocks forgotten, or `None` if the tracer was not
/// recording.
pub fn detach<R: RealAlloc>(g: &Guard, real: &R) -> Option<usize> {
    let unwind = config::UNWIND.load(Ordering::Relaxed);
    let free_stacks = config::FREE_STACKS.load(Ordering::Relaxed);
    if !lifecycle::stop_recording() {
        return None;
    }
    SAVED_UNWIND.store(unwind, Ordering::Relaxed);
    SAVED_FREE_STACKS.store(free_stacks, Ordering::Relaxed);
    super::give_back(g, real);
    Some(forget_live(g))
}

/// Forgets every live block, and its bytes in the live total; how many there were. (Each
/// stack's counters lose it in `take`; the total, which a free's event changes, would
/// otherwise keep it, and every re-attach add the blocks of the one before.)
fn forget_live(g: &Guard) -> usize {
    // Collected first: the table's walk holds a shard lock that `take` needs.
    let mut live = Vec::new();
    table::for_each_block(|b| live.push(b.addr));
    live.iter()
        .filter_map(|&a| super::take(g, a as *mut c_void))
        .map(|b| crate::profile::untick(crate::sample::counted(b.addr, b.size).0))
        .count()
}
