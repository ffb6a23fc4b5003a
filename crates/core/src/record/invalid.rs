//! Pointers handed to `free` or `realloc` that are not live block starts: double frees and
//! invalid frees, told apart from blocks the tracer never saw.

use super::lifecycle::thread_index;
use crate::capture::modules;
use crate::report::{self, Op, Why};
use crate::state::ThreadState;
use crate::store::{freed, quarantine, table};
use core::sync::atomic::{AtomicI64, Ordering};

/// A pointer given to `free` or `realloc` that is not a live block start. Returns whether glibc
/// may see it: `false` for a double free (the block is in quarantine, or the history saw it
/// freed and nothing allocated it since) and for pointers glibc would abort on (inside a live
/// block, misaligned, on the stack, in code). Other pointers may be blocks made while the
/// tracer was not recording (inside its own calls), so they pass.
pub(super) fn unknown_pointer(state: &ThreadState, addr: u64, op: Op) -> bool {
    // A report names this thread and walks its stack, and the stack check below reads its
    // bounds: all set by registration, which a thread whose first allocator call is this one
    // has not had yet.
    thread_index(state);
    if quarantine::contains(addr) {
        report::double_free(state, addr, freed::newest_at(addr), op);
        return false;
    }
    let (inside, _) = table::find_containing(addr);
    let on_stack = state.capture.bounds.contains(addr);
    let in_code = modules::snapshot().is_some_and(|m| m.find(addr).is_some());
    if inside.is_some() || addr % 16 != 0 || on_stack || in_code {
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
    // The history scan costs a pass over the ring: bound how often a program that frees many
    // untracked blocks pays it.
    if HISTORY_SCANS.fetch_sub(1, Ordering::Relaxed) > 0 {
        if let Some(f) = freed::newest_at(addr) {
            report::double_free(state, addr, Some(f), op);
            return false;
        }
    } else {
        HISTORY_SCANS.store(0, Ordering::Relaxed);
    }
    true
}

/// History scans left before they stop (see `unknown_pointer`).
static HISTORY_SCANS: AtomicI64 = AtomicI64::new(10_000);
