//! Pointers handed to `free` or `realloc` that are not live block starts: double frees and
//! invalid frees, told apart from blocks the tracer never saw.

use super::status::thread_index;
use crate::capture::modules;
use crate::glibc_heap;
use crate::report::{self, Op, Why};
use crate::state::ThreadState;
use crate::store::{self, freed, quarantine, tags};
use core::ffi::c_void;
use core::sync::atomic::{AtomicI64, Ordering};

/// A pointer given to `free` or `realloc` that is not a live block start. Returns whether glibc
/// may see it: `false` for a double free (the block is in quarantine, or the history saw it
/// freed and nothing allocated it since) and for pointers glibc would abort on (inside a live
/// block, misaligned, on the stack, in code, and, when the allocator is glibc's (`glibc`),
/// anywhere glibc's heap has no in-use chunk: unmapped, outside heap memory, or with no chunk
/// header before it). Other pointers may be blocks made while the tracer was not recording
/// (before it started, inside its own calls), so they pass.
///
/// In a process the tracer was attached to (`attached`), every pointer passes but one the
/// quarantine holds (a true double free: glibc still counts the block as in use, and the
/// quarantine alone will free it): blocks from before the attach, or from allocations that
/// were not redirected, are unknown by nature, and the tracer must not keep glibc from
/// seeing a free it would have seen without it. What is wrong is still reported; the freed
/// history and glibc's heap walk are not consulted, since they would call such blocks double
/// or invalid frees.
pub(super) fn unknown_pointer(state: &ThreadState, addr: u64, op: Op, glibc: bool) -> bool {
    if super::status::attached() {
        return judge_attached(state, addr, op);
    }
    // A report names this thread and walks its stack, and the stack check below reads its
    // bounds: all set by registration, which a thread whose first allocator call is this one
    // has not had yet.
    thread_index(state);
    // Another thread freeing this very block now took it first: once it is done, its free is
    // in the records below, and this is a double free whatever they say. Never a look at the
    // chunk then, which that thread may have handed glibc (and glibc unmapped).
    let raced = super::racing::another_frees(&state.freeing, addr);
    // SAFETY: `addr` is what the program passed to `free` or `realloc` (`read_freed`'s
    // contract).
    if let Some(f) = unsafe { tags::read_freed(addr as *mut c_void) } {
        report::double_free(state, addr, Some(f), op);
        return false;
    }
    if quarantine::contains(addr) {
        report::double_free(state, addr, freed::newest_at(addr), op);
        return false;
    }
    if raced {
        match freed::newest_at(addr) {
            Some(f) => report::double_free(state, addr, Some(f), op),
            None => report::double_free_racing(state, addr, op),
        }
        return false;
    }
    let (inside, _) = store::block_containing(addr);
    let on_stack = state.capture.bounds.contains(addr);
    let in_code = modules::snapshot().is_some_and(|m| m.find(addr).is_some());
    if inside.is_some() || !addr.is_multiple_of(16) || on_stack || in_code {
        let why = if let Some(b) = inside {
            Why::Inside(b)
        } else if on_stack {
            Why::Stack
        } else if in_code {
            Why::Code
        } else {
            Why::Misaligned
        };
        report::invalid_free(state, addr, why, op);
        return false;
    }
    // Both checks below cost a pass over a whole table or file: bound how often a program
    // that frees many untracked blocks pays them.
    if within(&HISTORY_SCANS) {
        if let Some(f) = freed::newest_at(addr) {
            report::double_free(state, addr, Some(f), op);
            return false;
        }
    }
    if glibc && within(&HEAP_CHECKS) {
        if let Err(not) = glibc_heap::vouch(addr) {
            report::invalid_free(state, addr, Why::NotHeap(not), op);
            return false;
        }
    }
    true
}

/// [`unknown_pointer`] in an attached process.
#[cold]
fn judge_attached(state: &ThreadState, addr: u64, op: Op) -> bool {
    thread_index(state);
    if quarantine::contains(addr) {
        report::double_free(state, addr, freed::newest_at(addr), op);
        return false;
    }
    let (inside, _) = store::block_containing(addr);
    let why = if let Some(b) = inside {
        Some(Why::Inside(b))
    } else if state.capture.bounds.contains(addr) {
        Some(Why::Stack)
    } else if modules::snapshot().is_some_and(|m| m.find(addr).is_some()) {
        Some(Why::Code)
    } else if !addr.is_multiple_of(16) {
        Some(Why::Misaligned)
    } else {
        None
    };
    if let Some(why) = why {
        report::invalid_free(state, addr, why, op);
    }
    true
}

/// Takes one from a budget of checks, saying whether there was one left.
fn within(budget: &AtomicI64) -> bool {
    if budget.fetch_sub(1, Ordering::Relaxed) > 0 {
        return true;
    }
    budget.store(0, Ordering::Relaxed);
    false
}

/// History scans left before they stop (see `unknown_pointer`).
static HISTORY_SCANS: AtomicI64 = AtomicI64::new(10_000);

/// Reads of the process's mappings left before they stop (see `unknown_pointer`).
static HEAP_CHECKS: AtomicI64 = AtomicI64::new(10_000);
