//! The steps an allocation and a free share, whichever path takes them (a table block's in
//! `mod`, a tagged block's in `tagged`, a batch's in `deferred`): the stack here, captured and
//! interned (checked against the reference walk under `MEM_TRACE_CHECK_STACKS`), and the free
//! written down.

use super::status::{thread_index, CUT, FREES};
use crate::capture;
use crate::config;
use crate::out::Out;
use crate::profile;
use crate::sample;
use crate::state::ThreadState;
use crate::store::freed::{self, Freed};
use crate::store::{quarantine, stacks, tags};
use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, Ordering};
use mem_trace_format::{Block, CUT_MARKER};

/// Captures and interns the calling thread's stack (0 when capture is off or failed).
#[inline(always)]
pub(super) fn stack_here(state: &ThreadState) -> u32 {
    if !config::UNWIND.load(Ordering::Relaxed) {
        return 0;
    }
    // A thread's first call registers it, which sets the stack bounds the capture reads in.
    thread_index(state);
    let local = &state.capture;
    // SAFETY: the thread's frame buffer is used only here, and this never nests: it runs
    // inside a hook holding the guard, and nothing it calls allocates through a hook.
    let buf = unsafe { &mut *local.frames.get() };
    let max = config::FRAMES
        .load(Ordering::Relaxed)
        .min(config::MAX_FRAMES);
    let c = capture::capture_interned(local, &mut buf[..max]);
    let id = match c.id {
        0 => {
            let id = stacks::intern_cached(&state.stacks, &buf[..c.frames], c.node);
            capture::remember_id(local, id, max);
            id
        }
        id => id,
    };
    if config::CHECK_STACKS.load(Ordering::Relaxed) != 0 {
        check_stack(local, id, &mut buf[..max]);
    }
    // Counted only when the statistics line was asked for, like frees: a shared counter.
    if config::STATS.load(Ordering::Relaxed) && stacks::is_cut(id) {
        CUT.fetch_add(1, Ordering::Relaxed);
    }
    id
}

/// The stack to remember a free by (0 when free stacks are off).
#[inline(always)]
pub(super) fn free_stack_here(state: &ThreadState) -> u32 {
    if config::FREE_STACKS.load(Ordering::Relaxed) {
        stack_here(state)
    } else {
        0
    }
}

pub(super) fn remember_free(state: &ThreadState, block: Block, free_stack: u32, by_realloc: bool) {
    freed::push(
        &state.history,
        &freed_now(state, block, free_stack, by_realloc),
    );
}

/// The free of `block` happening now: counted (its sequence number taken, the live bytes
/// lowered), with this thread and `free_stack`.
#[inline(always)]
pub(super) fn freed_now(
    state: &ThreadState,
    block: Block,
    free_stack: u32,
    by_realloc: bool,
) -> Freed {
    // A shared counter costs a cache-line transfer per free between threads: count only
    // when the statistics line was asked for.
    if config::STATS.load(Ordering::Relaxed) {
        FREES.fetch_add(1, Ordering::Relaxed);
    }
    let free_thread = thread_index(state);
    Freed {
        block,
        free_seq: profile::tick(sample::counted(block.addr, block.size).0.wrapping_neg()).0,
        free_stack,
        free_thread,
        by_realloc,
    }
}

/// The quarantine's entry for the chunk of the tagged block `block` (see `quarantine::hold`),
/// and the bytes asked of glibc for it.
#[inline(always)]
pub(super) fn held_entry(block: &Block) -> (u64, u64) {
    let chunk = tags::chunk(block.addr as *mut c_void) as u64;
    (chunk | quarantine::TAGGED, block.size + tags::bytes())
}

/// Captures checked against the reference walk, and those that agreed
/// (`MEM_TRACE_CHECK_STACKS`).
static CHECKED: AtomicU64 = AtomicU64::new(0);
static AGREED: AtomicU64 = AtomicU64::new(0);
static CAPTURES: AtomicU64 = AtomicU64::new(0);
/// Disagreements printed in full, so that a failing check shows what differed.
const SHOWN: u64 = 3;

/// Every Nth capture: compares the stack interned as `id` with the reference walk from
/// here (`buf`: the thread's frame buffer, free again), and prints the first disagreements.
#[cold]
#[inline(never)]
fn check_stack(local: &capture::Local, id: u32, buf: &mut [u64]) {
    let every = config::CHECK_STACKS.load(Ordering::Relaxed);
    if !CAPTURES
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(every)
    {
        return;
    }
    let n = capture::reference(local, buf);
    let mut ours = [0; stacks::MAX_STACK_FRAMES];
    let ours = stacks::frames(id, &mut ours).unwrap_or(&[]);
    let checked = CHECKED.fetch_add(1, Ordering::Relaxed);
    // A cut stack agrees when the frames it kept do.
    let agree = match ours.split_last() {
        Some((&CUT_MARKER, kept)) => buf[..n].starts_with(kept),
        _ => ours == &buf[..n],
    };
    if agree {
        AGREED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if checked - AGREED.load(Ordering::Relaxed) < SHOWN {
        let mut out = Out::stderr();
        let _ = core::fmt::write(
            &mut out,
            format_args!(
                "mem-trace: stack check: stack {id} {ours:x?}\n    reference {:x?}\n",
                &buf[..n]
            ),
        );
    }
}

/// The check's line at exit, when it ran.
pub(super) fn report_check() {
    let checked = CHECKED.load(Ordering::Relaxed);
    if config::CHECK_STACKS.load(Ordering::Relaxed) == 0 {
        return;
    }
    let agreed = AGREED.load(Ordering::Relaxed);
    let pct = if checked == 0 {
        100.0
    } else {
        agreed as f64 * 100.0 / checked as f64
    };
    let _ = core::fmt::write(
        &mut Out::stderr(),
        format_args!(
            "mem-trace: stack check: {agreed} of {checked} stacks identical to framehop's ({pct:.2}%)\n"
        ),
    );
}
