//! Stack capture on the allocation path: instruction pointers only.
//!
//! CFI unwinding, because the programs we trace are built without frame pointers (Debian's
//! glibc, sqlite3, python3, Rust's std) and a frame-pointer walk returns two correct frames
//! there. Frame-pointer walking is opt-in (`MEM_TRACE_UNWIND=fp`) for programs built for it.
//!
//! ## The algorithm
//! Each thread owns a rule cache (made on its first capture, freed at its exit): 4096 sets of
//! two entries, keyed by code address, each holding a compact `cfi::Rule` — CFA = rsp or rbp
//! plus a constant, return address at CFA−8, rbp restored from CFA+k or unchanged. A frame is
//! then a few ALU operations (the set index), one cache line, and one or two stack loads. On a
//! miss the rule is computed from the module's `.eh_frame_hdr`/`.eh_frame` with gimli
//! (`cfi::rule_for`) and stored; rows of another shape, and code without CFI, are stored as
//! "ask framehop", which unwinds that one frame in full. Rules name no module, so the cache
//! remembers which module set it was filled from and is emptied when the set changes
//! (`dlopen`/`dlclose`); an entry can also say "outside every module", where the walk records
//! the address and stops, as it stops at our own thread-start trampoline. The first frame
//! (this function's own pc) is keyed apart from return addresses, because its row is looked
//! up at the pc itself rather than at pc−1.
//!
//! Each walk is also kept, step by step (a `Trail`): when the next capture reaches a frame
//! of the last walk — same pc, same stack address — and the stack still holds every word the
//! last walk read from there up, the rest of the stack is taken from it after that check (a
//! run of independent loads) instead of being walked (a chain of dependent ones). Exact, not
//! a heuristic: see `Trail`.
//!
//! A walk goes on past the frames the capture keeps (`MEM_TRACE_FRAMES`, 64), up to the
//! thread's first frame or 160 steps: the frames it does not write still let the next
//! capture take over. Walks used to stop where the buffer filled, and an interpreter 40-80
//! frames deep then never took over from a walk made at another depth: it walked all 64
//! frames again on every capture on the way back up.
//!
//! Each finished walk is named in the call tree (`tree`: a node per caller's node and
//! return address, heaptrack's trace tree): the steps taken over keep the old walk's nodes,
//! and only the new inner frames are looked up. The walk's node remembers the stack id its
//! frames were interned as, so a capture taken over from an earlier walk gets its id without
//! hashing and comparing its frames (on `deep`: the hash, the intern table and its `memcmp`
//! were a quarter of the run; with the tree, the `deep` benchmark went from 4.9 s to 3.9 s,
//! plain 0.22 s; python3 unchanged within noise).
//!
//! The last walk serves only when consecutive allocations share callers. Programs that
//! allocate from several call paths in turn (churn: 50 paths, chosen at random) get little
//! from it, so up to 256 recent walks of at most 40 steps are kept as well (`Kept`: ≈330 KiB a
//! thread, 64 sets of 4, mapped but resident only as used), and a capture first looks for one
//! of its very stack, to take over from its first step — the whole stack checked, nothing
//! walked. Finding it without walking: stacks reaching the capture at one stack pointer mostly
//! have one layout (their frames are at the same addresses) and differ in the return
//! addresses there. So a `Shape`, per capture stack pointer, remembers where a walk from there
//! read its return addresses, and the words now at those addresses, hashed, choose the kept
//! walk. The hash only chooses: the kept walk is used only after `take_over` has checked
//! every word it read, as for the last walk (or, when only its stack id is wanted, the same
//! words listed flat: `Checks`). A shape is replaced when walks of another layout keep
//! missing it.
//!
//! Measured (`churn 1 5000000`, medians of 7 runs alternating with the previous build, 2-core
//! VM, plain 0.85 s): allocations only 2.58 s → 1.84 s (−29%); with the defaults (free
//! stacks, history, quarantine) 3.76 s → 3.23 s (−14%). 98% of churn's captures are then
//! served whole from a kept walk; the rest miss for want of room (sets holding more than four
//! of the 50 stacks). sqlite3 (`bench/run`'s script, 5 runs, plain 1.38 s): 1.80 s → 1.66 s
//! allocations only, 2.15 s → 2.03 s with the defaults.
//!
//! Measured on this 2-core VM (thread CPU time): framehop with its per-thread cache, the
//! previous unwinder, ≈12 ns a frame in a tight loop and ≈400 ns per capture in the churn
//! benchmark (its cache probe: a 64-bit modulo, a module search, a generation check, then a
//! rule dispatch); this walk ≈7 ns a frame in a tight loop (a chain of dependent loads: return
//! address → rule → next return address), ≈3 ns a frame taken over, and ≈150 ns per capture
//! in churn, where the rule table and stack lines compete with the program's and the tracer's
//! data for the caches. `_Unwind_Backtrace` was ≈2,100 ns for 20 frames.
//!
//! ## Safety of the walk
//! Memory is read only inside the current thread's stack, `[sp, stack_hi)`: a wrong rule then
//! truncates a stack instead of faulting. No lock, no allocation in the steady state, no
//! symbolization. The tracer's own frames (the hook, the recorder, this function) are
//! skipped, so frame 0 is the program's caller of `malloc`.

mod cache;
mod cfi;
mod fallback;
mod fp;
mod frames;
mod kept;
mod local;
pub mod modules;
mod rules;
mod signal;
mod stack;
#[cfg(test)]
mod tests;
mod trail;
mod tree;
mod walker;

pub use cache::drop_cache;
pub use local::Local;
pub(crate) use signal::alt_stack;
pub use stack::Bounds;
pub(crate) use tree::{
    count as tree_nodes, lock_all, path as tree_path, stop_growing as stop_naming, unlock_all, TREE,
};

use crate::config;
use cache::{cache_for, cache_if_made};
use core::sync::atomic::Ordering;
use fallback::walk_framehop;
use framehop::x86_64::CacheX86_64;
use frames::{How, Looked, Own, Walk};
use modules::ModuleSet;
use stack::Stack;

/// The three registers an unwind starts from, read at one point of one function.
#[inline(always)]
pub(crate) fn registers() -> (u64, u64, u64) {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads rip, rsp and rbp into registers; touches no memory.
    unsafe {
        core::arch::asm!(
            "lea {0}, [rip]",
            "mov {1}, rsp",
            "mov {2}, rbp",
            out(reg) pc,
            out(reg) sp,
            out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (pc, sp, bp)
}

/// Captures the calling thread's stack into `out`; returns the number of frames.
/// 0 when the stack cannot be walked safely (unknown bounds, an alternate signal stack).
#[inline(never)]
pub fn capture(local: &Local, out: &mut [u64]) -> usize {
    let start = Start {
        regs: registers(),
        entry: 0,
        at_return: false,
    };
    capture_with(local, out, start, false).frames
}

/// A capture for interning: either frames in `out`, or the stack id they were given last
/// time (see [`capture_interned`]).
pub(crate) struct Captured {
    /// Frames written to `out` (when `id` is 0), or the count the stack has.
    pub frames: usize,
    /// The stack's interned id, when this capture repeats a kept walk whose id is known;
    /// `out` is then not written. 0 otherwise: intern `out` and pass the id to
    /// [`remember_id`].
    pub id: u32,
    /// When `out` was written: the call-tree node whose path, innermost first, begins with
    /// exactly those frames (0: none), for the stack store to refer to.
    pub node: u32,
}

/// Like [`capture`], but a capture that repeats a kept walk returns the stack id noted for
/// it with [`remember_id`] instead of the frames: a program allocating from one place over
/// and over skips copying, hashing and comparing its frames (most captures on churn and
/// python3).
#[inline(never)]
pub(crate) fn capture_interned(local: &Local, out: &mut [u64]) -> Captured {
    let start = start_regs(local);
    let sp = start.regs.1;
    let hi = local.bounds.hi.get();
    let w = match modules::current() {
        Some(set) if hi != 0 && (local.bounds.lo.get()..hi).contains(&sp) => {
            let stack = Stack { lo: sp, hi };
            let kept = match repeat_kept(local, set, stack, start.regs, out.len()) {
                Ok(repeat) => return repeat,
                Err(kept) => kept,
            };
            walk_from(set, local, out, start, true, kept)
        }
        _ => capture_with(local, out, start, true),
    };
    let id = match (w.id, w.node) {
        (0, 0) => 0,
        (0, node) => tree::stack_of(node),
        (id, _) => id,
    };
    if let Some(cache) = cache_if_made(local) {
        cache.node = w.node;
        if w.id == 0 && id != 0 {
            // Named by the tree: the walk kept for this capture (if any) learns its id here,
            // as it would from `remember_id`, so that its next repeat is checked flat.
            cache.remember_kept(id, out.len());
        }
    }
    Captured {
        frames: w.frames,
        id,
        node: w.node,
    }
}

/// The common capture, first and alone: a stack that repeats a kept walk whose id is known,
/// checked by its flat list of words (see `kept::Checks`), with none of the walk's setup.
/// Most captures of most programs are such repeats (98% on churn), and the calls down to
/// the walk cost them as much again as the check: ~350 instructions a capture on `live`,
/// ~200 this way. `Err` tells the walk what was found, so that it does not look again.
#[inline(always)]
fn repeat_kept(
    local: &Local,
    set: &ModuleSet,
    stack: Stack,
    regs: (u64, u64, u64),
    len: usize,
) -> Result<Captured, Looked> {
    let Some(cache) = cache_if_made(local) else {
        return Err(Looked::Not);
    };
    // Rules and kept walks of another module set are dropped by the walk; the rbp chain
    // takes nothing over.
    if !core::ptr::eq(cache.set, set) || config::UNWIND_FP.load(Ordering::Relaxed) {
        return Err(Looked::Not);
    }
    // The walk the last capture repeated first, then the one the shape's key chooses.
    let last = cache.last_for(regs.0, regs.1);
    let w = match last.and_then(|k| cache.repeat_flat(k, stack, regs, len).flatten()) {
        Some(w) => w,
        None => {
            let k = cache
                .kept_for(stack, regs.0, regs.1)
                .ok_or(Looked::Missing)?;
            match cache.repeat_flat(k, stack, regs, len) {
                None => return Err(Looked::At(k)),
                Some(None) => return Err(Looked::Missing),
                Some(Some(w)) => w,
            }
        }
    };
    cache.node = 0;
    Ok(Captured {
        frames: w.frames,
        id: w.id,
        node: 0,
    })
}

/// Where a capture starts.
#[derive(Clone, Copy)]
struct Start {
    regs: (u64, u64, u64),
    /// The pc of a frame to skip at the start, like the tracer's own (0: none).
    entry: u64,
    /// `regs`' pc is a return address (see `How::at_return`).
    at_return: bool,
}

/// Where this thread's captures start: here; at a wrapper's registers, skipping its own
/// frame (at their pc) like the tracer's; or at a hook's caller, nothing to skip.
#[inline(always)]
fn start_regs(local: &Local) -> Start {
    match (local.start.get(), local.start_returns.get()) {
        ((0, _, _), _) => Start {
            regs: registers(),
            entry: 0,
            at_return: false,
        },
        (regs, true) => Start {
            regs,
            entry: 0,
            at_return: true,
        },
        (regs, false) => Start {
            regs,
            entry: regs.0,
            at_return: false,
        },
    }
}

/// The stack here as framehop alone walks it with a fresh cache: the reference the fast
/// walk is checked against (`MEM_TRACE_CHECK_STACKS`). From the same registers and skipping
/// the same frames as [`capture_interned`], so the two agree frame for frame when both are
/// right. Slow (a fresh cache computes every rule) and ~10 KiB of stack: a diagnostic.
/// Like the capture, it goes on through signal frames, and from a handler on the alternate
/// signal stack into the interrupted frames on the thread's own.
#[inline(never)]
pub(crate) fn reference(local: &Local, out: &mut [u64]) -> usize {
    let Start {
        regs,
        entry,
        at_return,
    } = start_regs(local);
    let (lo, hi) = (local.bounds.lo.get(), local.bounds.hi.get());
    if hi == 0 {
        return 0;
    }
    let (stack, home) = if (lo..hi).contains(&regs.1) {
        (Stack { lo: regs.1, hi }, None)
    } else {
        match signal::alt_stack() {
            Some((alt_lo, alt_hi)) if (alt_lo..alt_hi).contains(&regs.1) => (
                Stack {
                    lo: regs.1,
                    hi: alt_hi,
                },
                Some(Stack { lo, hi }),
            ),
            _ => return 0,
        }
    };
    let Some(set) = modules::current() else {
        return 0;
    };
    let own = Own::Skip { entry };
    let first = (regs, at_return);
    walk_framehop(set, stack, first, out, own, &mut CacheX86_64::new(), home).frames
}

/// Makes the thread's captures start from `regs` (read by the caller at its own entry) until
/// [`start_here`]: for an allocator wrapper linked into the program, whose frames cannot be
/// told from the program's by module.
#[inline(always)]
pub(crate) fn start_at(local: &Local, regs: (u64, u64, u64)) {
    local.start.set(regs);
    local.start_returns.set(false);
}

/// Makes the thread's captures start at the frame a hook returns to, until [`start_here`]:
/// `sp` is the caller's stack pointer after the hook returns and `bp` its rbp, both read at
/// the hook's first instruction. Walking from there, rather than from the capture's own
/// frame up through the hook's, saves the ~4 steps of the tracer's own frames on every
/// capture, and the frames recorded are the same. `false`, changing nothing, when a start
/// is set already: an allocator wrapper in the program that calls `malloc` set it at its
/// own entry, and its frames, which lie between, are skipped from there.
///
/// # Safety
/// `sp` is where the calling thread's stack held the hook's return address (at `sp - 8`)
/// when it was entered, and that frame is still live.
#[inline(always)]
pub(crate) unsafe fn start_at_return(local: &Local, sp: u64, bp: u64) -> bool {
    if local.start.get().0 != 0 {
        return false;
    }
    // SAFETY: the caller's contract: the return address slot is readable.
    let pc = unsafe { (sp.wrapping_sub(8) as *const u64).read() };
    local.start.set((pc, sp, bp));
    local.start_returns.set(true);
    true
}

/// Captures start from where they are made again.
#[inline(always)]
pub(crate) fn start_here(local: &Local) {
    local.start.set((0, 0, 0));
    local.start_returns.set(false);
}

/// Notes that the frames of the capture just made by [`capture_interned`] (into a buffer of
/// `len` frames) were interned as `id`.
pub(crate) fn remember_id(local: &Local, id: u32, len: usize) {
    if let Some(cache) = cache_if_made(local) {
        if cache.node != 0 {
            tree::set_stack(cache.node, id);
        }
        cache.remember_kept(id, len);
    }
}

#[inline(always)]
fn capture_with(local: &Local, out: &mut [u64], start: Start, want_id: bool) -> Walk {
    let (regs, at_return) = (start.regs, start.at_return);
    let hi = local.bounds.hi.get();
    if hi == 0 {
        return Walk::default();
    }
    if regs.1 < local.bounds.lo.get() || regs.1 >= hi {
        let own = Own::Skip { entry: start.entry };
        return on_alt_stack(local, out, (regs, at_return), own).unwrap_or_default();
    }
    let Some(set) = modules::current() else {
        return Walk::default();
    };
    walk_from(set, local, out, start, want_id, Looked::Not)
}

/// [`capture_with`] once the stack pointer is known to be on the thread's stack and the
/// module set is `set`.
#[inline(always)]
fn walk_from(
    set: &ModuleSet,
    local: &Local,
    out: &mut [u64],
    Start {
        regs,
        entry,
        at_return,
    }: Start,
    want_id: bool,
    kept: Looked,
) -> Walk {
    let how = How {
        own: Own::Skip { entry },
        fp: config::UNWIND_FP.load(Ordering::Relaxed),
        want_id,
        at_return,
        kept,
    };
    let w = walk(set, local, regs, out, how);
    if w.outside {
        // Code outside every known module: a library loaded since the set was built?
        if let Some(newer) = modules::refresh_if_changed(set) {
            let how = How {
                kept: Looked::Not,
                ..how
            };
            return walk(newer, local, regs, out, how);
        }
    }
    w
}

/// A capture in a signal handler running on the alternate signal stack: walked there up to
/// the kernel's signal frame, then on the thread's own stack from the frame the signal
/// interrupted. `None` when `regs` is on neither stack (nothing can be read safely).
///
/// Two walks with the thread's cache: the first ends at the interrupted frame (its stack
/// ends there), which is also the second's first frame, so that frame is written once. The
/// stack gets no id from the call tree or a kept walk (it is interned by its frames), and
/// no kept walk learns its id: those would name half of it.
#[cold]
#[inline(never)]
fn on_alt_stack(
    local: &Local,
    out: &mut [u64],
    (regs, at_return): ((u64, u64, u64), bool),
    own: Own,
) -> Option<Walk> {
    let (lo, hi) = signal::alt_stack()?;
    if !(lo..hi).contains(&regs.1) {
        return None;
    }
    let set = modules::current()?;
    let cache = cache_for(local)?;
    let how = How {
        own,
        fp: false,
        want_id: false,
        at_return,
        kept: Looked::Not,
    };
    cache.floor = lo;
    let first = cache.walk(set, Stack { lo: regs.1, hi }, regs, out, how);
    cache.memo = None;
    let alone = Walk {
        id: 0,
        node: 0,
        ..first
    };
    let n = first.frames;
    let Some(last) = cache.outermost() else {
        return Some(alone);
    };
    if n == 0 || out[n - 1] != last.pc || !local.bounds.contains(last.sp) {
        return Some(alone);
    }
    // `floor` stays the alternate stack's: it measures the room left where this code runs.
    let stack = Stack {
        lo: last.sp,
        hi: local.bounds.hi.get(),
    };
    // The interrupted frame's pc is the instruction the signal stopped, no return address.
    let how = How {
        own: Own::Skip { entry: 0 },
        at_return: false,
        ..how
    };
    let rest = cache.walk(
        set,
        stack,
        (last.pc, last.sp, last.bp),
        &mut out[n - 1..],
        how,
    );
    cache.memo = None;
    Some(Walk {
        frames: n - 1 + rest.frames,
        outside: rest.outside,
        id: 0,
        node: 0,
    })
}

/// Walks from `regs` with the thread's rule cache, or with framehop alone once the thread is
/// exiting (its cache is gone).
fn walk(set: &ModuleSet, local: &Local, regs: (u64, u64, u64), out: &mut [u64], how: How) -> Walk {
    let stack = Stack {
        lo: regs.1,
        hi: local.bounds.hi.get(),
    };
    let floor = local.bounds.lo.get();
    match cache_for(local) {
        Some(cache) => {
            cache.floor = floor;
            cache.walk(set, stack, regs, out, how)
        }
        // Framehop's cache is made here, on the stack.
        None if cache::room(floor) < cache::FRAMEHOP_ROOM => Walk::default(),
        None => walk_framehop(
            set,
            stack,
            (regs, how.at_return),
            out,
            how.own,
            &mut CacheX86_64::new(),
            None,
        ),
    }
}
