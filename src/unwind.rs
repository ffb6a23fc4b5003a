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

mod cfi;

use crate::config;
use crate::guard::ThreadState;
use crate::modules::{self, ModuleSet};
use cfi::{Kind, Rule};
use core::sync::atomic::Ordering;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};

/// The upper bound on `MEM_TRACE_FRAMES`.
pub const MAX_FRAMES: usize = 128;

/// The three registers an unwind starts from, read at one point of one function.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
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
pub fn capture(state: &ThreadState, out: &mut [u64]) -> usize {
    capture_with(state, out, registers(), false).frames
}

/// A capture for interning: either frames in `out`, or the stack id they were given last
/// time (see [`capture_interned`]).
pub struct Captured {
    /// Frames written to `out` (when `id` is 0), or the count the stack has.
    pub frames: usize,
    /// The stack's interned id, when this capture repeats a kept walk whose id is known;
    /// `out` is then not written. 0 otherwise: intern `out` and pass the id to
    /// [`remember_id`].
    pub id: u32,
}

/// Like [`capture`], but a capture that repeats a kept walk returns the stack id noted for
/// it with [`remember_id`] instead of the frames: a program allocating from one place over
/// and over skips copying, hashing and comparing its frames (most captures on churn and
/// python3).
#[inline(never)]
pub fn capture_interned(state: &ThreadState, out: &mut [u64]) -> Captured {
    let w = capture_with(state, out, registers(), true);
    Captured {
        frames: w.frames,
        id: w.id,
    }
}

/// Notes that the frames of the capture just made by [`capture_interned`] (into a buffer of
/// `len` frames) were interned as `id`.
pub fn remember_id(state: &ThreadState, id: u32, len: usize) {
    if let Some(cache) = cache_if_made(state) {
        if let Some(k) = cache.memo.take() {
            let kept = &mut cache.kept[k];
            kept.stack_id = id;
            kept.id_len = len as u32;
        }
    }
}

#[inline(always)]
fn capture_with(
    state: &ThreadState,
    out: &mut [u64],
    regs: (u64, u64, u64),
    want_id: bool,
) -> Walk {
    let hi = state.stack_hi.get();
    if hi == 0 || regs.1 < state.stack_lo.get() || regs.1 >= hi {
        return Walk::default();
    }
    let Some(set) = modules::current() else {
        return Walk::default();
    };
    let fp = config::UNWIND_FP.load(Ordering::Relaxed);
    let w = walk(set, state, regs, out, fp, want_id);
    if w.outside {
        // Code outside every known module: a library loaded since the set was built?
        if let Some(newer) = modules::refresh_if_changed(set) {
            return walk(newer, state, regs, out, fp, want_id);
        }
    }
    w
}

/// What a walk found.
#[derive(Default)]
struct Walk {
    frames: usize,
    /// It stopped at an address outside every known module.
    outside: bool,
    /// The frames' stack id, when known from a kept walk (then not written).
    id: u32,
}

/// Walks from `regs` with the thread's rule cache, or with framehop alone once the thread is
/// exiting (its cache is gone).
fn walk(
    set: &ModuleSet,
    state: &ThreadState,
    regs: (u64, u64, u64),
    out: &mut [u64],
    fp: bool,
    want_id: bool,
) -> Walk {
    let stack = Stack {
        lo: regs.1,
        hi: state.stack_hi.get(),
    };
    match cache_for(state) {
        Some(cache) => {
            let how = How {
                own: Own::Skip,
                fp,
                want_id,
            };
            cache.walk(set, stack, regs, out, how)
        }
        None => walk_framehop(set, stack, regs, out, Own::Skip, &mut CacheX86_64::new()),
    }
}

/// The readable stack, `[lo, hi)`: from the capture's own stack pointer to the thread's top.
#[derive(Clone, Copy)]
struct Stack {
    lo: u64,
    hi: u64,
}

impl Stack {
    /// The word at `addr`, if it lies inside the stack.
    #[inline(always)]
    fn read(self, addr: u64) -> Option<u64> {
        // One comparison: addr - lo wraps to a huge value below lo.
        if addr.wrapping_sub(self.lo) <= self.hi.wrapping_sub(8).wrapping_sub(self.lo) {
            // SAFETY: `[lo, hi)` is the live part of this thread's stack (callers pass the
            // stack pointer of a frame still running and the thread's stack top), mapped and
            // readable; unaligned because a wrong rule can produce any address.
            Some(unsafe { (addr as *const u64).read_unaligned() })
        } else {
            None
        }
    }
}

/// How to walk: which frames to keep, by which method, and whether a known stack id may
/// stand for the frames.
#[derive(Clone, Copy)]
struct How {
    own: Own,
    /// Follow the rbp chain past the tracer's own frames (`MEM_TRACE_UNWIND=fp`).
    fp: bool,
    /// Return the stack id a kept walk knows instead of writing the frames.
    want_id: bool,
}

/// What to do with mem-trace's own frames.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Own {
    /// Skip the leading ones; stop at the next (our thread-start trampoline: beyond it lie
    /// `start_thread` and `clone`).
    Skip,
    /// Keep them (unit tests, where the test binary is "our own code").
    #[cfg_attr(not(test), allow(dead_code))]
    Keep,
}

/// Records `pc` in `out[*n]` unless it is one of our own frames; `false` when the walk must
/// stop (the buffer is full, or our trampoline is reached).
#[inline(always)]
fn record(set: &ModuleSet, own: Own, pc: u64, out: &mut [u64], n: &mut usize) -> bool {
    if own == Own::Skip && set.is_own(pc) {
        return *n == 0;
    }
    out[*n] = pc;
    *n += 1;
    *n < out.len()
}

/// Sets in the rule cache (two entries each): 128 KiB per thread. A capture of churn touches
/// ~30 distinct addresses and a large program a few thousand; two ways make the conflict
/// misses of a direct-mapped table (each one a gimli evaluation, ~1 µs) rare.
const SET_BITS: u32 = 12;
const SETS: usize = 1 << SET_BITS;
/// Key bit marking the first frame, whose rule is looked up at its pc rather than at pc-1
/// (user-space addresses never have it).
const FIRST: u64 = 1 << 63;

/// The set for a key: bits 2..14 of the address, xor the next 12 bits. Nearby return
/// addresses (the call sites of one function, the functions of one small program) land in
/// nearby sets, so a capture touches a few cache lines of the table rather than one per frame:
/// a line missed in a busy program's caches costs more than the rest of the frame. Bits 14..26
/// separate modules, whose bases are page-aligned. Not a multiplication: the index is on the
/// walk's critical path (return address → set → rule → next return address).
#[inline(always)]
fn set_index(key: u64) -> usize {
    (((key >> 2) ^ (key >> (2 + SET_BITS))) as usize) & (SETS - 1)
}

#[derive(Clone, Copy)]
struct Entry {
    /// A code address (| [`FIRST`]); 0 for an empty entry.
    key: u64,
    rule: Rule,
}

/// Two entries in one cache line; the newer one first.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Set([Entry; 2]);

const EMPTY: Set = Set([Entry {
    key: 0,
    rule: Rule::FRAMEHOP,
}; 2]);

/// Steps kept of a walk: every frame it may record, and the tracer's own leading frames.
const MAX_STEPS: usize = MAX_FRAMES + 32;

/// One frame of a walk, as the registers stood there, and how the walk left it.
#[derive(Clone, Copy, Default)]
struct Step {
    pc: u64,
    sp: u64,
    bp: u64,
    /// Where the caller's rbp was read, relative to the next step's sp (the CFA).
    bp_offset: i16,
    flags: u16,
}

/// The step restored rbp from the stack.
const RESTORES_BP: u16 = 1;
/// The step computed its CFA from rbp.
const USES_BP: u16 = 2;
/// framehop unwound the step: what it read is not known.
const OPAQUE: u16 = 4;
/// Some step from here on reads rbp as it was on entry to this one (set when the walk ends).
const BP_NEEDED: u16 = 8;
/// A frame was recorded before this one (the tracer's own leading frames are behind).
const AFTER_OWN: u16 = 16;

/// How a walk ended, for reusing it.
#[derive(Clone, Copy, PartialEq, Eq)]
// A primitive representation makes all-zero bytes a valid `Ending` (`Fixed`), which lets
// kept walks start as zeroed memory (`zeroed_box`).
#[repr(u8)]
enum Ending {
    /// On something that depends only on the last step's pc: an `End` rule, an address
    /// outside every module (`outside`), our own trampoline (`recorded` false).
    Fixed { outside: bool, recorded: bool },
    /// The output buffer was full.
    Full,
    /// On a memory read or a check: not reused (rare: such a walk is already wrong).
    Other,
}

/// A walk's steps, kept so that the next capture can take over its upper part.
///
/// Why this is exact: a walk is a function of the registers at a frame and of the stack words
/// it reads from there on. If the new walk reaches a frame with the same pc and sp as step
/// `j` of the last one (and the same rbp, when a later step depends on it), and every word
/// the last walk read from step `j` on — each return address, each saved rbp — still holds
/// the same value, the new walk would repeat the old one step for step. Those reads have
/// known addresses, so checking them is a run of independent loads instead of the chain of
/// dependent ones (address → rule → next address) a walk is. Steps framehop unwound read
/// unknown words and are never taken over. A saved rbp is compared only where its value is
/// used later (`BP_NEEDED` on the step it restores rbp for); elsewhere only its readability
/// is checked, because a value never read cannot change what the walk computes — and code
/// built without frame pointers saves rbp as an ordinary register whose value changes
/// between calls (churn's `run` keeps its checksum there), which would fail every take-over
/// from below that frame.
///
/// Frames: only steps from `first` on were recorded; a take-over at a step before it (the
/// tracer's own frames) writes none of the ones before. (It used to write them: a capture
/// taken over at the hook's frame from the same call site began with the tracer's frames.)
///
/// What it buys: a program allocating and freeing in the same function, or in a loop, has
/// the same callers above it at each call; in churn each free's stack shares all but its
/// first frame with the allocation just before.
struct Trail {
    steps: Box<[Step; MAX_STEPS]>,
    len: usize,
    ending: Ending,
    /// The first step recorded as a frame: the steps before it are the tracer's own.
    first: usize,
}

/// A whole walk, to take over: its steps, how it ended, its first recorded step.
#[derive(Clone, Copy)]
struct View<'a> {
    steps: &'a [Step],
    ending: Ending,
    first: usize,
}

impl Trail {
    fn new() -> Trail {
        let steps: Box<[Step]> = vec![Step::default(); MAX_STEPS].into_boxed_slice();
        let Ok(steps) = steps.try_into() else {
            unreachable!("the vector has MAX_STEPS elements")
        };
        Trail {
            steps,
            len: 0,
            ending: Ending::Other,
            first: 0,
        }
    }

    /// Ends a walk of `len` steps: marks, from step `fresh` backwards, the steps whose
    /// continuation reads their entry rbp (steps from `fresh` on are marked already).
    fn finish(&mut self, len: usize, fresh: usize, ending: Ending) {
        self.len = len;
        self.ending = ending;
        let mut needed = self.steps[..len]
            .get(fresh)
            .is_some_and(|s| s.flags & BP_NEEDED != 0);
        for s in self.steps[..fresh.min(len)].iter_mut().rev() {
            needed = s.flags & USES_BP != 0 || (s.flags & RESTORES_BP == 0 && needed);
            if needed {
                s.flags |= BP_NEEDED;
            }
        }
    }
}

/// Completes the walk now at step `j` of `last`, with registers `bp`, `i` steps in `next`
/// and `n` frames in `out`, from `last` if the stack still holds what it read. Copies the
/// steps taken over into `next`, which is then a whole walk: `Ok(true)` says so, and
/// `Ok(false)` that `out` could not hold them all (then `next` is not a walk).
///
/// `Err(k)`: walk on, and try no step of `last` below `k` again. A word that no longer holds
/// what the old walk read between steps `m` and `m + 1` fails every take-over at a step up to
/// `m` the same way (same address, same value), so a failed attempt is not repeated one frame
/// further up: the checks of one capture cost at most one pass over the old walk.
///
/// `WRITE`: write the frames (not when the caller knows their stack id already).
#[inline(never)]
fn take_over<const COPY: bool, const WRITE: bool>(
    View {
        steps: last,
        ending,
        first,
    }: View,
    next: &mut [Step],
    (i, j): (usize, usize),
    stack: Stack,
    bp: u64,
    out: &mut [u64],
    n: usize,
) -> Result<(Walk, bool), usize> {
    let tail = &last[j..];
    let s = tail[0];
    if (s.flags & BP_NEEDED != 0 && s.bp != bp) || (s.flags & AFTER_OWN != 0) != (n > 0) {
        return Err(j + 1);
    }
    let (outside, recorded) = match ending {
        Ending::Fixed { outside, recorded } => (outside, recorded),
        // The old walk stopped for want of room: reuse it only if this one has no more.
        Ending::Full => (false, true),
        Ending::Other => return Err(last.len()),
    };
    // The frames it recorded from step j on: not the tracer's own leading steps.
    let skip = first.saturating_sub(j).min(tail.len());
    let count = recorded_from(tail.len(), skip, recorded);
    if (ending == Ending::Full && n + count < out.len()) || (COPY && i + tail.len() > next.len()) {
        return Err(j + 1);
    }
    // One pass: check every word the old walk read from step j on, copy the steps (unless
    // the old walk is kept as it is), write the frames. On a mismatch the copies are garbage
    // the walk overwrites.
    let copy = if COPY {
        &mut next[i..i + tail.len()]
    } else {
        &mut []
    };
    for (k, w) in tail.windows(2).enumerate() {
        let (from, to) = (w[0], w[1]);
        let mut same = from.flags & OPAQUE == 0 && stack.read(to.sp.wrapping_sub(8)) == Some(to.pc);
        if same && from.flags & RESTORES_BP != 0 {
            // The saved rbp matters only if a step from `to` on reads rbp before restoring
            // it again (`BP_NEEDED`); otherwise its value changes nothing the walk computes,
            // and only its readability (which ends a walk when lost) is checked.
            let at = to.sp.wrapping_add(from.bp_offset as i64 as u64);
            let v = stack.read(at);
            same = v.is_some() && (to.flags & BP_NEEDED == 0 || v == Some(to.bp));
        }
        if !same {
            return Err(j + k + 1);
        }
        if COPY {
            copy[k] = from;
        }
    }
    let take = count.min(out.len() - n);
    if COPY {
        copy[tail.len() - 1] = tail[tail.len() - 1];
    }
    if WRITE {
        for (o, s) in out[n..n + take].iter_mut().zip(&tail[skip..]) {
            *o = s.pc;
        }
    }
    let walk = Walk {
        frames: n + take,
        // A walk that fills the buffer stops before looking past its last frame.
        outside: outside && take == count && n + take < out.len(),
        id: 0,
    };
    Ok((walk, take == count))
}

/// Frames a walk records over `len` steps after skipping the first `skip` (the tracer's own):
/// one per step but the last, which counts only if the walk `recorded` it.
fn recorded_from(len: usize, skip: usize, recorded: bool) -> usize {
    (len - 1 + usize::from(recorded)).saturating_sub(skip)
}

/// Walks kept besides the last one: sets of [`KEPT_WAYS`] walks each, chosen by a hash of the
/// stack words at a shape's return-address slots (see [`Shape`]). Churn's 100 stacks (50
/// paths, malloc and free) overflowed some of 32 sets: 93% of captures found their walk with
/// one thread, 84% with two; with 64 sets, 99%.
const KEPT_SETS: usize = 64;
const KEPT_WAYS: usize = 4;
/// Steps a kept walk may have: the tracer's own frames and ~36 of the program's (a step is 32
/// bytes: with 256 walks, ≈330 KiB a thread). Longer walks are only ever the last one.
const KEPT_STEPS: usize = 40;
/// Shapes: direct-mapped by the capture's first stack pointer.
const SHAPES: usize = 16;
/// Return-address slots a shape names (the first ones of its walk).
const SHAPE_SLOTS: usize = 32;
/// The most a shape's score counts up to.
const SHAPE_SCORE: u32 = 8;

/// A walk kept for a later capture of the same stack: taken over from its first step.
#[derive(Clone, Copy)]
struct Kept {
    /// [`Shape::key`] of the stack it was walked on; 0 when empty.
    key: u64,
    len: usize,
    ending: Ending,
    first: usize,
    /// The id its frames were interned as (0: not known), for captures into a buffer of
    /// `id_len` frames (a shorter one may cut them).
    stack_id: u32,
    id_len: u32,
    /// The same walk as a list of the words to check, for captures that only want its id.
    checks: Checks,
    steps: [Step; KEPT_STEPS],
}

/// Words checked per kept walk: one return address a step, and the few saved rbp values that
/// are used later.
const CHECKS: usize = KEPT_STEPS + 8;

/// What [`take_over`] would check to repeat a kept walk from its first step with nothing
/// recorded before, flattened when the walk is kept: the stack offset and value of each word,
/// the rbp the first step needs, how far the reads reach. A capture that only wants the walk's
/// stack id then runs one loop over ~20 (offset, value) pairs in 12 bytes each, instead of
/// going through 32-byte steps and their flags (A/B, defaults: sqlite3 1.34x -> 1.24x,
/// python3 5.85x -> 5.66x, churn 2.07x -> 2.00x).
#[derive(Clone, Copy)]
struct Checks {
    /// Pairs in use; 0 when the walk can only be taken over step by step (a step framehop
    /// unwound, an ending other than a fixed one inside the known modules, too many checks).
    n: u32,
    /// Every word the walk read lies below `sp + reach`.
    reach: u32,
    /// Frames the walk records from its first step (`take_over`'s `count`).
    count: u32,
    /// Whether its first step needs rbp to be `bp` (`BP_NEEDED`). Not an `Option`: kept
    /// walks start as zeroed memory, and only a `bool`'s zero is defined.
    needs_bp: bool,
    bp: u64,
    offsets: [u32; CHECKS],
    values: [u64; CHECKS],
}

impl Checks {
    /// The checks of the walk `steps` that ended with `ending`, first recording at step
    /// `first`; `n == 0` when it has none.
    fn of(steps: &[Step], ending: Ending, first: usize) -> Checks {
        let mut c = Checks {
            n: 0,
            reach: 0,
            count: 0,
            needs_bp: false,
            bp: 0,
            offsets: [0; CHECKS],
            values: [0; CHECKS],
        };
        let Ending::Fixed {
            outside: false,
            recorded,
        } = ending
        else {
            return c;
        };
        let s0 = steps[0];
        if s0.flags & AFTER_OWN != 0 {
            return c;
        }
        let mut n = 0;
        let mut reach = 0u64;
        let mut check = |at: u64, value: Option<u64>| -> Option<()> {
            // Below the first sp, or farther than 4 GiB: not a word this scheme can name.
            let off = u32::try_from(at.wrapping_sub(s0.sp)).ok()?;
            reach = reach.max(u64::from(off) + 8);
            if let Some(v) = value {
                *c.offsets.get_mut(n)? = off;
                c.values[n] = v;
                n += 1;
            }
            Some(())
        };
        for w in steps.windows(2) {
            let (from, to) = (w[0], w[1]);
            if from.flags & OPAQUE != 0 || check(to.sp.wrapping_sub(8), Some(to.pc)).is_none() {
                return c;
            }
            if from.flags & RESTORES_BP != 0 {
                let at = to.sp.wrapping_add(from.bp_offset as i64 as u64);
                let value = (to.flags & BP_NEEDED != 0).then_some(to.bp);
                if check(at, value).is_none() {
                    return c;
                }
            }
        }
        let Ok(reach) = u32::try_from(reach) else {
            return c;
        };
        c.count = recorded_from(steps.len(), first.min(steps.len()), recorded) as u32;
        c.needs_bp = s0.flags & BP_NEEDED != 0;
        c.bp = s0.bp;
        c.reach = reach;
        c.n = n as u32;
        c
    }

    /// Whether the stack from `sp` (with rbp `bp`) still holds every checked word.
    #[inline(always)]
    fn hold(&self, stack: Stack, sp: u64, bp: u64) -> bool {
        if (self.needs_bp && self.bp != bp) || u64::from(self.reach) > stack.hi - sp {
            return false;
        }
        let n = self.n as usize;
        self.offsets[..n]
            .iter()
            .zip(&self.values[..n])
            // SAFETY: `sp + reach <= hi` (checked above) and every offset is below `reach`,
            // so each word lies in `[sp, hi)`, the live part of this thread's stack.
            .all(|(&o, &v)| unsafe { ((sp + u64::from(o)) as *const u64).read_unaligned() } == v)
    }
}

/// Where a walk starting at `(pc, sp)` read its return addresses, relative to `sp`: hashing
/// the words there now tells the kept walks of the stacks that share this layout apart
/// without walking (churn's 50 call paths all have one layout). Only a way to pick a
/// candidate: a kept walk is taken over only after `take_over` checked every word it read.
#[derive(Clone, Copy)]
struct Shape {
    pc: u64,
    sp: u64,
    slots: usize,
    /// Kept walks found minus walks of another layout, saturating: a shape is replaced at 0.
    score: u32,
    offsets: [u32; SHAPE_SLOTS],
}

const NO_SHAPE: Shape = Shape {
    pc: 0,
    sp: 0,
    slots: 0,
    score: 0,
    offsets: [0; SHAPE_SLOTS],
};

impl Shape {
    #[inline(always)]
    fn index(sp: u64) -> usize {
        ((sp >> 4) ^ (sp >> 9)) as usize & (SHAPES - 1)
    }

    /// The key of the stack now at `(pc, sp)` (never 0): a hash of the words at the slots.
    #[inline(always)]
    fn key(&self, stack: Stack) -> u64 {
        let mut h = self.pc ^ self.sp.rotate_left(29);
        // Each word rotated by its own position, not a rotate of the running hash: the words
        // are then independent and only one xor a slot is serial (a kept hit computes this
        // over up to 32 slots on every capture).
        for (i, &o) in self.offsets[..self.slots].iter().enumerate() {
            let w = stack.read(self.sp + u64::from(o)).unwrap_or(0);
            h ^= w.rotate_left(i as u32 * 7 + 1);
        }
        (h ^ (h >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
    }

    /// The layout of the walk `steps`, which started at `(steps[0].pc, steps[0].sp)`.
    fn of(steps: &[Step]) -> Shape {
        let mut shape = NO_SHAPE;
        shape.pc = steps[0].pc;
        shape.sp = steps[0].sp;
        for s in &steps[1..steps.len().min(SHAPE_SLOTS + 1)] {
            let Ok(o) = u32::try_from(s.sp.wrapping_sub(8).wrapping_sub(shape.sp)) else {
                break;
            };
            shape.offsets[shape.slots] = o;
            shape.slots += 1;
        }
        shape
    }

    fn same_layout(&self, other: &Shape) -> bool {
        self.offsets[..self.slots] == other.offsets[..other.slots]
    }
}

/// The kept walk for `key` in `kept`, if any: its index.
#[inline(always)]
fn find_kept(kept: &[Kept], key: u64) -> Option<usize> {
    let set = (key >> (64 - KEPT_SETS.trailing_zeros())) as usize * KEPT_WAYS;
    (set..set + KEPT_WAYS).find(|&k| kept[k].key == key)
}

/// A thread's unwinder state (see the module documentation).
struct ThreadCache {
    /// The module set the rules were computed from.
    set: *const ModuleSet,
    sets: Box<[Set; SETS]>,
    /// The last full walk, and the one being made (swapped at its end).
    last: Trail,
    next: Trail,
    /// Recent walks by stack (see [`Shape`]), the way of each set used last, and the kept
    /// walk that is the last one when a capture was wholly taken from one.
    kept: Box<[Kept; KEPT_SETS * KEPT_WAYS]>,
    kept_recent: [u8; KEPT_SETS],
    shapes: Box<[Shape; SHAPES]>,
    last_kept: Option<usize>,
    /// The kept walk the last capture repeated or was kept as, for [`remember_id`].
    memo: Option<usize>,
    /// Framehop's own cache, for the frames it unwinds.
    framehop: CacheX86_64,
    gimli: Box<cfi::Context>,
    /// Rules computed, frames handed to framehop, walks completed from the last one (for
    /// tests and tuning).
    misses: u64,
    framehop_frames: u64,
    taken_over: u64,
    /// Captures wholly taken from a kept walk (for tests and tuning).
    kept_hits: u64,
}

/// `[value; N]` made on the heap, never on the stack.
fn boxed_array<T: Copy, const N: usize>(value: T) -> Box<[T; N]> {
    let v: Box<[T]> = vec![value; N].into_boxed_slice();
    let Ok(a) = v.try_into() else {
        unreachable!("the vector has N elements")
    };
    a
}

/// A boxed `T` made of zero bytes. The per-thread tables (the rule cache, the kept walks)
/// are large enough that the arena maps fresh pages for them, which the kernel backs only
/// where an entry is stored: a thread that runs little code and allocates from a few stacks
/// pays for a few pages instead of ~300 KiB. In both tables zero bytes mean "empty": an
/// entry is found by its key, keys are never 0, and an unfound entry's other fields are
/// never read.
///
/// # Safety
/// - all-zero bytes must be a valid `T`.
unsafe fn zeroed_box<T>() -> Box<T> {
    let layout = std::alloc::Layout::new::<T>();
    // SAFETY: `T` is a large table, so the layout is not zero-sized.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: allocated above with the global allocator and `T`'s layout; zero bytes are a
    // valid `T` (the caller's obligation).
    unsafe { Box::from_raw(p) }
}

impl ThreadCache {
    fn new() -> ThreadCache {
        // SAFETY: a zeroed entry has key 0 (never looked up) and a rule of integers, a bool
        // and `Kind` tag 0 (`CfaRsp`): all valid.
        let sets: Box<[Set; SETS]> = unsafe { zeroed_box() };
        ThreadCache {
            set: core::ptr::null(),
            sets,
            last: Trail::new(),
            next: Trail::new(),
            // SAFETY: a zeroed kept walk has key 0 (never found); its fields are integers,
            // `bool`s and `Ending`, whose primitive representation makes tag 0
            // `Fixed { false, false }`.
            kept: unsafe { zeroed_box() },
            kept_recent: [0; KEPT_SETS],
            shapes: boxed_array(NO_SHAPE),
            last_kept: None,
            memo: None,
            framehop: CacheX86_64::new(),
            gimli: Box::new(cfi::Context::new()),
            misses: 0,
            framehop_frames: 0,
            taken_over: 0,
            kept_hits: 0,
        }
    }

    /// The rule for `key`, from the cache or computed.
    #[inline(always)]
    fn rule(&mut self, set: &ModuleSet, key: u64) -> Rule {
        let i = set_index(key);
        let s = &self.sets[i];
        if s.0[0].key == key {
            s.0[0].rule
        } else if s.0[1].key == key {
            s.0[1].rule
        } else {
            self.miss(set, key, i)
        }
    }

    #[cold]
    #[inline(never)]
    fn miss(&mut self, set: &ModuleSet, key: u64, i: usize) -> Rule {
        self.misses += 1;
        let pc = key & !FIRST;
        let lookup = if key & FIRST != 0 { pc } else { pc - 1 };
        let rule = match set.find(pc) {
            Some(m) => cfi::rule_for(m, &mut self.gimli, lookup),
            None => Rule::OUTSIDE,
        };
        let s = &mut self.sets[i];
        s.0[1] = s.0[0];
        s.0[0] = Entry { key, rule };
        rule
    }

    /// A frame whose rule is not a CFA rule: the end of the stack, an unknown module (both
    /// end the walk), or a frame framehop unwinds; `Ok` holds the caller's registers.
    #[cold]
    #[inline(never)]
    fn uncommon(
        &mut self,
        set: &ModuleSet,
        kind: Kind,
        first: bool,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
    ) -> Result<(u64, u64, u64), Ending> {
        let outside = match kind {
            Kind::End => false,
            Kind::Outside => true,
            _ => {
                self.framehop_frames += 1;
                let address = if first {
                    FrameAddress::InstructionPointer(pc)
                } else {
                    // Never None: a return address of 0 ended the walk before.
                    FrameAddress::from_return_address(pc).ok_or(Ending::Other)?
                };
                let mut regs = UnwindRegsX86_64::new(pc, sp, bp);
                let mut read = |a| stack.read(a).ok_or(());
                return match set.unwinder.unwind_frame(
                    address,
                    &mut regs,
                    &mut self.framehop,
                    &mut read,
                ) {
                    Ok(Some(ra)) if ra != 0 => Ok((ra, regs.sp(), regs.bp())),
                    _ => Err(Ending::Other),
                };
            }
        };
        Err(Ending::Fixed {
            outside,
            recorded: true,
        })
    }

    /// Forgets every walk: the next capture walks the whole stack.
    fn forget(&mut self) {
        self.last.len = 0;
        self.last_kept = None;
        self.memo = None;
        for k in self.kept.iter_mut() {
            k.key = 0;
        }
        self.shapes.fill(NO_SHAPE);
    }

    /// The last walk, to take over from.
    #[inline(always)]
    fn last_view<'a>(last: &'a Trail, kept: &'a [Kept], last_kept: Option<usize>) -> View<'a> {
        match last_kept {
            Some(k) => View {
                steps: &kept[k].steps[..kept[k].len],
                ending: kept[k].ending,
                first: kept[k].first,
            },
            None => View {
                steps: &last.steps[..last.len],
                ending: last.ending,
                first: last.first,
            },
        }
    }

    /// The walk kept for the stack now at `(pc, sp, bp)`, taken over whole if the stack still
    /// holds every word it read; `None` otherwise.
    #[inline(always)]
    fn take_kept(
        &mut self,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
        out: &mut [u64],
        want_id: bool,
    ) -> Option<Walk> {
        let shape = &self.shapes[Shape::index(sp)];
        if shape.sp != sp || shape.pc != pc {
            return None;
        }
        let k = find_kept(&self.kept[..], shape.key(stack))?;
        let kept = &self.kept[k];
        if kept.steps[0].sp != sp || kept.steps[0].pc != pc {
            return None;
        }
        if want_id && kept.stack_id != 0 && kept.id_len as usize == out.len() && kept.checks.n != 0
        {
            // Exactly what `take_over` checks for this walk from step 0 (see `Checks`).
            if !kept.checks.hold(stack, sp, bp) {
                return None;
            }
            let count = kept.checks.count as usize;
            let id = kept.stack_id;
            self.repeated(k, sp, count <= out.len());
            return Some(Walk {
                frames: count.min(out.len()),
                outside: false,
                id,
            });
        }
        let view = View {
            steps: &kept.steps[..kept.len],
            ending: kept.ending,
            first: kept.first,
        };
        // Its frames are those interned as `stack_id` when the buffer is as long.
        let id = match want_id && kept.id_len as usize == out.len() {
            true => kept.stack_id,
            false => 0,
        };
        let (mut w, whole) = match id {
            0 => take_over::<false, true>(view, &mut [], (0, 0), stack, bp, out, 0),
            _ => take_over::<false, false>(view, &mut [], (0, 0), stack, bp, out, 0),
        }
        .ok()?;
        w.id = id;
        self.repeated(k, sp, whole);
        Some(w)
    }

    /// Notes that a capture from `sp` repeated kept walk `k` (`whole`: all of it).
    #[inline(always)]
    fn repeated(&mut self, k: usize, sp: u64, whole: bool) {
        self.memo = Some(k);
        self.taken_over += 1;
        self.kept_hits += 1;
        if whole {
            let shape = &mut self.shapes[Shape::index(sp)];
            shape.score = (shape.score + 1).min(SHAPE_SCORE);
            self.kept_recent[k / KEPT_WAYS] = (k % KEPT_WAYS) as u8;
            self.last_kept = Some(k);
        }
    }

    /// Keeps the whole walk now in `next` for later captures of the same stack (see [`Shape`]).
    fn keep(&mut self, stack: Stack) {
        let next = &self.next;
        if next.len == 0 || next.len > KEPT_STEPS || next.ending == Ending::Other {
            return;
        }
        let steps = &next.steps[..next.len];
        let (pc, sp) = (steps[0].pc, steps[0].sp);
        let shape = &mut self.shapes[Shape::index(sp)];
        if shape.sp != sp || shape.pc != pc || shape.slots == 0 {
            // Another start, or none yet: replace it once it stops serving.
            shape.score = shape.score.saturating_sub(1);
            if shape.score > 0 {
                return;
            }
            *shape = Shape::of(steps);
            shape.score = SHAPE_SCORE / 2;
        } else {
            let mine = Shape::of(steps);
            if !mine.same_layout(shape) {
                shape.score = shape.score.saturating_sub(1);
                if shape.score == 0 {
                    *shape = mine;
                    shape.score = SHAPE_SCORE / 2;
                }
            }
        }
        let key = shape.key(stack);
        let set = (key >> (64 - KEPT_SETS.trailing_zeros())) as usize;
        let k = find_kept(&self.kept[..], key)
            .unwrap_or(set * KEPT_WAYS + (usize::from(self.kept_recent[set]) + 1) % KEPT_WAYS);
        let kept = &mut self.kept[k];
        kept.key = key;
        kept.stack_id = 0;
        kept.len = next.len;
        kept.ending = next.ending;
        kept.first = next.first;
        kept.steps[..next.len].copy_from_slice(steps);
        kept.checks = Checks::of(steps, next.ending, next.first);
        self.kept_recent[set] = (k % KEPT_WAYS) as u8;
        self.memo = Some(k);
    }

    /// Walks the stack from `(pc, sp, bp)`; with `fp`, only the tracer's own frames use CFI
    /// and the program's frames follow the rbp chain.
    fn walk(
        &mut self,
        set: &ModuleSet,
        stack: Stack,
        (mut pc, mut sp, mut bp): (u64, u64, u64),
        out: &mut [u64],
        How { own, fp, want_id }: How,
    ) -> Walk {
        if !core::ptr::eq(self.set, set) {
            // A fresh cache is empty already: emptying it again would touch, and so make the
            // kernel back, every page of its ~300 KiB (measured: 360 KiB of RSS per thread).
            if !self.set.is_null() {
                self.sets.fill(EMPTY);
                self.forget();
            }
            self.set = set;
        }
        self.memo = None;
        if !fp {
            if let Some(w) = self.take_kept(stack, (pc, sp, bp), out, want_id) {
                return w;
            }
        }
        let mut n = 0;
        let mut i = 0;
        // The first step recorded as a frame (MAX_STEPS: none yet).
        let mut first_recorded = MAX_STEPS;
        // Cursor into the last walk: its first step at or above the current sp, and the first
        // step a take-over may start from.
        let mut j = 1;
        let mut from = 1;
        let mut key = pc | FIRST;
        let ending = loop {
            if i > 0 {
                let last = Self::last_view(&self.last, &self.kept[..], self.last_kept);
                while j < last.steps.len() && last.steps[j].sp < sp {
                    j += 1;
                }
                if j >= from
                    && j < last.steps.len()
                    && last.steps[j].sp == sp
                    && last.steps[j].pc == pc
                {
                    let next = &mut self.next;
                    match take_over::<true, true>(
                        last,
                        &mut next.steps[..],
                        (i, j),
                        stack,
                        bp,
                        out,
                        n,
                    ) {
                        Ok((w, whole)) => {
                            self.taken_over += 1;
                            if whole {
                                // This walk becomes the last one: its own steps, then the old
                                // walk's from step j (valid for it: just checked).
                                next.first = if n > 0 {
                                    first_recorded
                                } else {
                                    i + last.first - j
                                };
                                next.finish(i + last.steps.len() - j, i, last.ending);
                                self.keep(stack);
                                core::mem::swap(&mut self.last, &mut self.next);
                                self.last_kept = None;
                            }
                            return w;
                        }
                        Err(k) => from = k,
                    }
                }
            }
            if i == MAX_STEPS {
                break Ending::Other;
            }
            self.next.steps[i] = Step {
                pc,
                sp,
                bp,
                bp_offset: 0,
                flags: if n > 0 { AFTER_OWN } else { 0 },
            };
            i += 1;
            let recorded_before = n;
            if !record(set, own, pc, out, &mut n) {
                break if n == out.len() {
                    Ending::Full
                } else {
                    Ending::Fixed {
                        outside: false,
                        recorded: false,
                    }
                };
            }
            if recorded_before == 0 && n > 0 {
                first_recorded = i - 1;
            }
            if fp && n > 0 {
                return fp_chain(set, stack, (pc, sp, bp), out, n);
            }
            let rule = self.rule(set, key);
            let first = key & FIRST != 0;
            if !rule.kind.is_cfa() {
                // The rare kinds, out of the way of the common path (which a jump table on
                // the kind made slower: the kind is loaded on the walk's critical path).
                match self.uncommon(set, rule.kind, first, stack, (pc, sp, bp)) {
                    Ok(regs) => {
                        self.next.steps[i - 1].flags |= OPAQUE;
                        (pc, sp, bp) = regs;
                        key = pc;
                        continue;
                    }
                    Err(ending) => break ending,
                }
            }
            let uses_bp = rule.kind == Kind::CfaRbp;
            let base = if uses_bp { bp } else { sp };
            let cfa = base.wrapping_add(rule.cfa_offset as i64 as u64);
            // A frame-pointer rule with rbp = 0 is the outermost frame; a CFA that does not
            // move up the stack is a wrong rule (framehop's checks, kept so stacks agree).
            if uses_bp && (base == 0 || cfa <= sp) {
                break Ending::Other;
            }
            let Some(ra) = stack.read(cfa.wrapping_sub(8)) else {
                break Ending::Other;
            };
            let step = &mut self.next.steps[i - 1];
            if uses_bp {
                step.flags |= USES_BP;
            }
            if rule.restores_bp {
                let at = cfa.wrapping_add(rule.bp_offset as i64 as u64);
                match stack.read(at) {
                    Some(v) => bp = v,
                    // An epilogue may describe a slot already popped (below sp): framehop
                    // keeps rbp then, in the first frame only.
                    None if first && at < sp => {}
                    None => break Ending::Other,
                }
                step.flags |= RESTORES_BP;
                step.bp_offset = rule.bp_offset;
            }
            if ra == 0 || (cfa == sp && ra == pc) {
                break Ending::Other;
            }
            (pc, sp) = (ra, cfa);
            key = pc;
        };
        let outside = matches!(ending, Ending::Fixed { outside: true, .. });
        self.next.first = first_recorded.min(i);
        self.next.finish(i, i, ending);
        self.keep(stack);
        core::mem::swap(&mut self.last, &mut self.next);
        self.last_kept = None;
        Walk {
            frames: n,
            outside,
            id: 0,
        }
    }
}

/// The module of the last frame looked up: consecutive frames are mostly in one module, so
/// it is tried before searching the module set.
#[derive(Default)]
struct KnownModule(core::ops::Range<u64>);

impl KnownModule {
    /// Whether `pc` lies in a known module (remembering which).
    #[inline(always)]
    fn holds(&mut self, set: &ModuleSet, pc: u64) -> bool {
        if self.0.contains(&pc) {
            return true;
        }
        match set.find(pc) {
            Some(m) => {
                self.0 = m.start..m.end;
                true
            }
            None => false,
        }
    }
}

/// Follows the rbp chain from the program's first frame, `(pc, sp, bp)`, whose `pc` is already
/// `out[n - 1]`: `[bp]` is the caller's rbp and `[bp + 8]` the return address into it. Stops
/// when a link does not move up the stack, leaves it, or is 0.
fn fp_chain(
    set: &ModuleSet,
    stack: Stack,
    (pc, sp, mut bp): (u64, u64, u64),
    out: &mut [u64],
    mut n: usize,
) -> Walk {
    let mut known = KnownModule::default();
    let mut low = sp;
    let mut a = pc;
    loop {
        // Consecutive frames are mostly in one module: try the last one before searching.
        if !known.holds(set, a) {
            return Walk {
                frames: n,
                outside: true,
                id: 0,
            };
        }
        if n == out.len() || bp < low {
            break;
        }
        let (Some(next), Some(ra)) = (stack.read(bp), stack.read(bp.wrapping_add(8))) else {
            break;
        };
        if ra == 0 || set.is_own(ra) {
            break;
        }
        out[n] = ra;
        n += 1;
        a = ra;
        low = bp + 16;
        bp = next;
    }
    Walk {
        frames: n,
        outside: false,
        id: 0,
    }
}

/// The walk with framehop alone: for a thread whose cache is gone, and the tests' reference.
fn walk_framehop(
    set: &ModuleSet,
    stack: Stack,
    (pc, sp, bp): (u64, u64, u64),
    out: &mut [u64],
    own: Own,
    cache: &mut CacheX86_64,
) -> Walk {
    let mut read_stack = |a| stack.read(a).ok_or(());
    let mut frames = set.unwinder.iter_frames(
        pc,
        UnwindRegsX86_64::new(pc, sp, bp),
        cache,
        &mut read_stack,
    );
    let mut n = 0;
    let mut known = KnownModule::default();
    while let Ok(Some(frame)) = frames.next() {
        let a = frame.address();
        if !record(set, own, a, out, &mut n) {
            break;
        }
        if !known.holds(set, a) {
            // Past an unknown module framehop falls back to frame pointers: stop here rather
            // than record guesses.
            return Walk {
                frames: n,
                outside: true,
                id: 0,
            };
        }
    }
    Walk {
        frames: n,
        outside: false,
        id: 0,
    }
}

/// The thread's unwinder state if a capture made it.
fn cache_if_made(state: &ThreadState) -> Option<&'static mut ThreadCache> {
    let p = state.unwind_cache.get() as *mut ThreadCache;
    // SAFETY: made by `cache_for` on this thread, freed only by this thread's exit handler,
    // which also sets `exiting`; the state is thread-local so no one else sees it, and
    // captures do not nest (the reentrancy guard) nor overlap `remember_id`, which runs
    // between them under the same guard, so this is the only reference.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// The thread's unwinder state, made on first use. `None` once the thread is exiting (its
/// state was freed by the exit handler; framehop alone serves those last allocations).
fn cache_for(state: &ThreadState) -> Option<&'static mut ThreadCache> {
    if let Some(cache) = cache_if_made(state) {
        return Some(cache);
    }
    if state.exiting.get() {
        return None;
    }
    let p = Box::into_raw(Box::new(ThreadCache::new()));
    state.unwind_cache.set(p.cast());
    // SAFETY: just made; exclusively this thread's.
    Some(unsafe { &mut *p })
}

/// Frees the thread's unwinder state (thread exit).
pub fn drop_cache(state: &ThreadState) {
    let p = state.unwind_cache.replace(core::ptr::null_mut()) as *mut ThreadCache;
    if !p.is_null() {
        // SAFETY: made by `cache_for` with Box::into_raw on this thread; no reference survives
        // (the state is only borrowed during a capture, and captures do not nest).
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Sets the current thread's stack bounds from pthread's attributes (threads other than the
/// main one; glibc answers those without reading /proc or allocating under its lock).
pub fn set_bounds_from_pthread(state: &ThreadState) {
    // SAFETY: attr is initialised by pthread_getattr_np before use and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        if libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0 {
            state.stack_lo.set(addr as u64);
            state.stack_hi.set(addr as u64 + size as u64);
        }
        libc::pthread_attr_destroy(&mut attr);
    }
}

extern "C" {
    /// Set by the dynamic loader to the initial stack pointer of the main thread.
    static __libc_stack_end: *mut libc::c_void;
}

/// Sets the main thread's stack bounds without `pthread_getattr_np`, which for the main thread
/// reads `/proc/self/maps` with `malloc` under a glibc lock (and deadlocked a Rust program's
/// start-up when called from a hook).
pub fn set_bounds_main(state: &ThreadState) {
    // SAFETY: a plain read of a loader-initialised variable.
    let end = unsafe { __libc_stack_end } as u64;
    if end == 0 {
        return;
    }
    // Everything from the initial stack pointer to the end of its page is mapped.
    let hi = (end + 8 + 4095) & !4095;
    let mut lim: libc::rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct.
    unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) };
    let size = if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur == 0 {
        1 << 30
    } else {
        lim.rlim_cur.min(1 << 30)
    };
    state.stack_lo.set(hi.saturating_sub(size));
    state.stack_hi.set(hi);
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::{c_int, c_void};
    use std::cell::RefCell;

    /// How the tests walk: keeping every frame (the test binary is "our own code").
    const KEEP: How = How {
        own: Own::Keep,
        fp: false,
        want_id: false,
    };
    const KEEP_ID: How = How {
        want_id: true,
        ..KEEP
    };

    fn state() -> &'static ThreadState {
        let state = crate::guard::current();
        if state.stack_hi.get() == 0 {
            set_bounds_from_pthread(state);
        }
        state
    }

    /// The cached walk from `regs`, keeping our own frames: in the unit-test binary the tracer's
    /// code is the test binary itself. With `fresh`, the last walk is forgotten first, so the
    /// whole stack is walked frame by frame.
    fn fast_walk(regs: (u64, u64, u64), out: &mut [u64], fresh: bool) -> usize {
        let state = state();
        let stack = Stack {
            lo: regs.1,
            hi: state.stack_hi.get(),
        };
        let set = modules::current().unwrap();
        let cache = cache_for(state).unwrap();
        if fresh {
            cache.forget();
        }
        cache.walk(set, stack, regs, out, KEEP).frames
    }

    #[inline(never)]
    fn level3(out: &mut [u64]) -> usize {
        std::hint::black_box(fast_walk(registers(), out, false))
    }
    #[inline(never)]
    fn level2(out: &mut [u64]) -> usize {
        std::hint::black_box(level3(out)) + 1
    }
    #[inline(never)]
    fn level1(out: &mut [u64]) -> usize {
        std::hint::black_box(level2(out)) + 1
    }

    /// Which of our test functions a return address falls in: the one with the greatest
    /// start at or below it (they are small and laid out near each other).
    fn owner(a: u64) -> Option<usize> {
        let starts = [
            level1 as fn(&mut [u64]) -> usize as usize as u64,
            level2 as fn(&mut [u64]) -> usize as usize as u64,
            level3 as fn(&mut [u64]) -> usize as usize as u64,
        ];
        starts
            .iter()
            .enumerate()
            .filter(|&(_, &s)| s < a && a - s < 512)
            .max_by_key(|&(_, &s)| s)
            .map(|(i, _)| i + 1)
    }

    #[test]
    fn walks_through_callers_in_order() {
        let mut out = [0u64; 64];
        let n = level1(&mut out) - 2;
        let frames = &out[..n];
        assert!(n >= 4, "only {n} frames: {frames:x?}");
        let owners: Vec<usize> = frames.iter().filter_map(|&a| owner(a)).collect();
        // level3 (the walk's own first frame), then the return addresses into level2, level1.
        let l2 = owners
            .iter()
            .position(|&o| o == 2)
            .expect("a frame in level2");
        let l1 = owners
            .iter()
            .position(|&o| o == 1)
            .expect("a frame in level1");
        assert!(l2 < l1, "callers come after callees: {owners:?}");
    }

    #[test]
    fn no_bounds_no_stack() {
        let state = crate::guard::current();
        let saved = (state.stack_lo.get(), state.stack_hi.get());
        state.stack_hi.set(0);
        let mut out = [0u64; 8];
        assert_eq!(capture(state, &mut out), 0);
        state.stack_lo.set(saved.0);
        state.stack_hi.set(saved.1);
    }

    // ---- accuracy against reference unwinders ------------------------------------------------

    #[derive(Default)]
    struct Tally {
        samples: usize,
        /// Stacks identical, frame by frame, to framehop's with a fresh cache (every frame
        /// evaluated from `.eh_frame`, none of our rules involved).
        same_as_framehop: usize,
        /// Stacks identical to libgcc's `_Unwind_Backtrace` (an unwinder sharing no code with
        /// ours), from the sampling function's caller up.
        same_as_libgcc: usize,
        frames: usize,
        /// Walks completed from the previous one (`take_over`).
        taken_over: usize,
        mismatches: Vec<String>,
    }

    thread_local! {
        static TALLY: RefCell<Tally> = RefCell::default();
    }

    extern "C" {
        fn _Unwind_Backtrace(
            trace: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
            arg: *mut c_void,
        ) -> c_int;
        fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
    }

    extern "C" fn libgcc_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the Vec passed by `libgcc_stack`; `ctx` is libgcc's, valid here.
        let (out, ip) = unsafe { (&mut *(arg as *mut Vec<u64>), _Unwind_GetIP(ctx)) };
        if ip == 0 || out.len() == MAX_FRAMES {
            return 5; // _URC_END_OF_STACK
        }
        out.push(ip as u64);
        0
    }

    /// libgcc's stack from its caller's frame up: [return address into the caller, ...].
    #[inline(never)]
    fn libgcc_stack() -> Vec<u64> {
        let mut out = Vec::with_capacity(MAX_FRAMES);
        // SAFETY: the callback only pushes to `out`, which outlives the call.
        unsafe { _Unwind_Backtrace(libgcc_frame, (&mut out as *mut Vec<u64>).cast()) };
        // Frame 0 is inside libgcc_stack itself.
        out.remove(0);
        out
    }

    /// Captures the stack here with our walk and with both references, and tallies.
    #[inline(never)]
    fn sample() {
        let regs = registers();
        let state = state();
        let stack = Stack {
            lo: regs.1,
            hi: state.stack_hi.get(),
        };
        let set = modules::current().unwrap();
        let mut slow = [0u64; MAX_FRAMES];
        let fresh = &mut CacheX86_64::new();
        let ns = walk_framehop(set, stack, regs, &mut slow, Own::Keep, fresh).frames;
        let slow = &slow[..ns];
        let gcc = libgcc_stack();
        // Twice: continuing from the previous sample's walk where it can, then frame by frame
        // (rules from the cache) after forgetting it. That leaves this walk as the next
        // sample's "last walk", so both paths are checked on every call path.
        for fresh in [false, true] {
            let taken_before = cache_for(state).unwrap().taken_over;
            let mut fast = [0u64; MAX_FRAMES];
            let nf = fast_walk(regs, &mut fast, fresh);
            let fast = &fast[..nf];
            let taken = cache_for(state).unwrap().taken_over > taken_before;
            TALLY.with_borrow_mut(|t| {
                t.samples += 1;
                t.frames += nf;
                t.taken_over += usize::from(taken);
                if fast == slow {
                    t.same_as_framehop += 1;
                } else {
                    t.mismatches.push(format!(
                        "framehop (taken over: {taken}): ours {fast:x?}\n    framehop {slow:x?}"
                    ));
                }
                // Frame 0 differs by construction: our pc inside sample(), libgcc's return
                // address into it (from the call to libgcc_stack).
                if nf > 1 && fast[1..] == gcc[1..] {
                    t.same_as_libgcc += 1;
                } else {
                    t.mismatches
                        .push(format!("libgcc: ours {fast:x?}\n    libgcc {gcc:x?}"));
                }
            });
        }
    }

    #[inline(never)]
    fn recurse(depth: usize) {
        if depth == 0 {
            sample();
        } else {
            recurse(std::hint::black_box(depth - 1));
        }
        std::hint::black_box(depth);
    }

    #[inline(never)]
    fn mutual_a(depth: usize) {
        if depth == 0 {
            sample()
        } else {
            mutual_b(std::hint::black_box(depth - 1), [depth as u64; 6])
        }
        std::hint::black_box(depth);
    }

    #[inline(never)]
    fn mutual_b(depth: usize, pad: [u64; 6]) {
        std::hint::black_box(&pad);
        mutual_a(depth);
        std::hint::black_box(depth);
    }

    /// Over-aligned locals make rustc realign the stack and address the frame through rbp:
    /// CFA = rbp + 16, the `CfaRbp` rules.
    #[repr(align(128))]
    struct Aligned([u8; 128]);

    #[inline(never)]
    fn realigned(depth: usize) {
        let block = Aligned([depth as u8; 128]);
        std::hint::black_box(&block);
        if depth == 0 {
            sample();
        } else {
            realigned(depth - 1);
        }
        std::hint::black_box(&block.0);
    }

    /// A comparator glibc calls from inside `qsort`/`bsearch`: samples through libc frames.
    extern "C" fn compare_and_sample(a: *const c_void, b: *const c_void) -> c_int {
        sample();
        // SAFETY: qsort and bsearch pass pointers to elements of the u32 arrays below.
        let (a, b) = unsafe { (*(a as *const u32), *(b as *const u32)) };
        a.cmp(&b) as c_int
    }

    #[inline(never)]
    fn through_libc(depth: usize) {
        if depth > 0 {
            return through_libc(std::hint::black_box(depth - 1));
        }
        let mut v: Vec<u32> = (0..24u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 97)
            .collect();
        // SAFETY: `v` holds `v.len()` u32 elements; the comparator reads two of them.
        unsafe {
            libc::qsort(v.as_mut_ptr().cast(), v.len(), 4, Some(compare_and_sample));
            let key = v[7];
            libc::bsearch(
                (&key as *const u32).cast(),
                v.as_ptr().cast(),
                v.len(),
                4,
                Some(compare_and_sample),
            );
        }
        std::hint::black_box(&v);
    }

    fn all_paths() {
        for depth in [0, 1, 2, 5, 13, 40] {
            recurse(depth);
            mutual_a(depth);
            realigned(depth.min(10));
            through_libc(depth.min(6));
        }
        let boxed: Box<dyn Fn(usize)> = Box::new(recurse);
        (0..4).for_each(&boxed);
        // Twice: the second pass is served from the cache.
        for depth in [3, 9] {
            recurse(depth);
            through_libc(depth);
        }
    }

    fn check(t: &Tally, who: &str) {
        let pct = |k: usize| 100.0 * k as f64 / t.samples as f64;
        let shown: Vec<&String> = t.mismatches.iter().take(4).collect();
        eprintln!(
            "{who}: {} samples, {} frames, {} taken over: {:.2}% identical to framehop, {:.2}% \
             to libgcc",
            t.samples,
            t.frames,
            t.taken_over,
            pct(t.same_as_framehop),
            pct(t.same_as_libgcc)
        );
        assert!(t.samples >= 200, "{who}: only {} samples", t.samples);
        // Both ways of walking were checked, each on many stacks.
        assert!(t.taken_over * 5 >= t.samples, "{who}: few walks taken over");
        assert!(t.taken_over * 5 <= t.samples * 3, "{who}: few full walks");
        assert!(t.frames >= t.samples * 10, "{who}: shallow stacks");
        assert!(pct(t.same_as_framehop) >= 99.0, "{who}: {shown:#?}");
        assert!(pct(t.same_as_libgcc) >= 99.0, "{who}: {shown:#?}");
    }

    #[test]
    fn stacks_match_reference_unwinders() {
        all_paths();
        let t = TALLY.take();
        check(&t, "test thread");
        // The fast path must really be the fast path: nearly all frames from compact rules.
        let cache = cache_for(state()).unwrap();
        assert!(
            cache.framehop_frames * 20 < t.frames as u64,
            "{} of {} frames went to framehop",
            cache.framehop_frames,
            t.frames
        );
        // A fresh thread: an empty cache, another stack.
        let t = std::thread::spawn(|| {
            all_paths();
            TALLY.take()
        })
        .join()
        .unwrap();
        check(&t, "spawned thread");
    }

    #[test]
    fn a_new_module_set_empties_the_cache() {
        let state = state();
        let cache = cache_for(state).unwrap();
        let mut out = [0u64; 64];
        level1(&mut out);
        let stale = &*Box::leak(Box::new(modules::build_for_tests()));
        let regs = registers();
        let stack = Stack {
            lo: regs.1,
            hi: state.stack_hi.get(),
        };
        let before = cache.misses;
        let w = cache.walk(stale, stack, regs, &mut out, KEEP);
        assert!(w.frames > 3);
        assert!(cache.misses > before, "rules recomputed for the new set");
        assert!(core::ptr::eq(cache.set, stale));
    }

    #[inline(never)]
    fn inner(out: &mut [u64]) -> usize {
        std::hint::black_box(fast_walk(registers(), out, false))
    }

    /// The function that captures, at the top of the two call chains below.
    type Leaf = fn(&mut [u64]) -> usize;

    /// One function reached from two callers of one frame size: its frame sits at the same
    /// stack address under both, with a different caller above it.
    #[inline(never)]
    fn shared_middle(out: &mut [u64], leaf: Leaf) -> usize {
        let n = leaf(out);
        std::hint::black_box(out.len());
        n
    }
    #[inline(never)]
    fn via_a(out: &mut [u64], leaf: Leaf) -> usize {
        let n = shared_middle(out, leaf);
        std::hint::black_box(1);
        n
    }
    #[inline(never)]
    fn via_b(out: &mut [u64], leaf: Leaf) -> usize {
        let n = shared_middle(out, leaf);
        std::hint::black_box(2);
        n
    }
    type Caller = fn(&mut [u64], Leaf) -> usize;

    /// The case a take-over must refuse: the same function at the same stack address (frame
    /// 1: `shared_middle`, under two callers of one frame size, called from one place), but
    /// another caller above it.
    #[test]
    fn a_frame_at_the_same_place_with_other_callers_is_walked_again() {
        let mut stacks = [[0u64; 64]; 2];
        let mut lens = [0; 2];
        let callers: [Caller; 2] = [via_a, via_b];
        // One call site for both (a loop the compiler cannot unroll).
        for i in 0..std::hint::black_box(2) {
            lens[i] = std::hint::black_box(callers[i])(&mut stacks[i], inner);
        }
        let [a, b] = &stacks;
        let in_fn = |x: u64, start: usize| x > start as u64 && x - (start as u64) < 256;
        let middle = shared_middle as fn(&mut [u64], Leaf) -> usize as usize;
        assert!(in_fn(a[1], middle) && in_fn(b[1], middle));
        assert!(in_fn(a[2], callers[0] as usize), "{:x?}", &a[..lens[0]]);
        assert!(in_fn(b[2], callers[1] as usize), "{:x?}", &b[..lens[1]]);
        // Frame 3 is the return address into this test (the compiler may duplicate the call
        // site); above it, the stacks are the same.
        assert_eq!(a[4..lens[0]], b[4..lens[1]]);
    }

    /// Captures here with our walk (after checking it against framehop's).
    #[inline(never)]
    fn checked(out: &mut [u64]) -> usize {
        let regs = registers();
        let mut slow = [0u64; 64];
        let ns = reference_walk(regs, &mut slow);
        let n = fast_walk(regs, out, false);
        assert_eq!(&out[..n], &slow[..ns]);
        n
    }

    /// The readable stack of this thread for a walk from `regs`.
    fn stack_at(regs: (u64, u64, u64)) -> Stack {
        Stack {
            lo: regs.1,
            hi: state().stack_hi.get(),
        }
    }

    /// The frames framehop finds from `regs` with a fresh cache (the tests' reference).
    fn reference_walk(regs: (u64, u64, u64), out: &mut [u64]) -> usize {
        let set = modules::current().unwrap();
        let fresh = &mut CacheX86_64::new();
        walk_framehop(set, stack_at(regs), regs, out, Own::Keep, fresh).frames
    }
    /// Two stacks in turn: each capture's last walk is the other stack's, so only the kept
    /// walks can serve it whole; they must, and exactly.
    #[test]
    fn kept_walks_serve_alternating_stacks() {
        let cache = cache_for(state()).unwrap();
        let mut stacks = [[0u64; 64]; 2];
        let callers: [Caller; 2] = [via_a, via_b];
        let mut hits = 0;
        // One call site for both (a loop the compiler cannot unroll), through the same chains
        // as above; `checked` compares every capture with framehop's.
        for k in 0..std::hint::black_box(8) {
            let before = cache.kept_hits;
            std::hint::black_box(callers[k % 2])(&mut stacks[k % 2], checked);
            hits += cache.kept_hits - before;
        }
        assert!(hits >= 6, "{hits} of 8 captures served from kept walks");
        assert_ne!(stacks[0][2], stacks[1][2]);
    }

    /// A stand-in for interning: a checksum of the frames (never 0).
    fn fake_id(frames: &[u64]) -> u32 {
        (frames.iter().fold(0u64, |h, &f| h.rotate_left(5) ^ f) as u32) | 1
    }

    thread_local! {
        static IDS_GIVEN_BACK: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }

    /// Captures as `record` does (an id given back, or frames to intern and remember), and
    /// checks the id against the one framehop's frames would get.
    fn interned(out: &mut [u64]) -> usize {
        let regs = registers();
        let state = state();
        let mut slow = [0u64; 64];
        let ns = reference_walk(regs, &mut slow);
        let set = modules::current().unwrap();
        let cache = cache_for(state).unwrap();
        let w = cache.walk(set, stack_at(regs), regs, out, KEEP_ID);
        let id = if w.id != 0 {
            IDS_GIVEN_BACK.set(IDS_GIVEN_BACK.get() + 1);
            w.id
        } else {
            let id = fake_id(&out[..w.frames]);
            remember_id(state, id, out.len());
            id
        };
        assert_eq!(id, fake_id(&slow[..ns]), "another stack's id");
        assert_eq!(w.frames, ns);
        w.frames
    }

    /// Two stacks in turn from one call site: once each has been interned, its kept walk
    /// gives its id back, and never the other one's.
    #[test]
    fn kept_walks_give_back_their_own_stack_id() {
        let mut stacks = [[0u64; 64]; 2];
        let callers: [Caller; 2] = [via_a, via_b];
        IDS_GIVEN_BACK.set(0);
        for k in 0..std::hint::black_box(10) {
            std::hint::black_box(callers[k % 2])(&mut stacks[k % 2], interned);
        }
        let given = IDS_GIVEN_BACK.get();
        assert!(given >= 6, "{given} of 10 captures gave an id back");
        // A buffer of another length does not get an id made for this one.
        let mut short = [0u64; 16];
        let before = IDS_GIVEN_BACK.get();
        let state = state();
        let regs = registers();
        let set = modules::current().unwrap();
        let cache = cache_for(state).unwrap();
        for _ in 0..3 {
            let w = cache.walk(set, stack_at(regs), regs, &mut short, KEEP_ID);
            assert_eq!(w.id, 0);
            remember_id(state, 7, 64);
        }
        assert_eq!(IDS_GIVEN_BACK.get(), before);
    }

    /// A kept walk's checks are the words `take_over` would compare: return addresses and
    /// the saved rbp values a later step uses, within the stack; walks they cannot describe
    /// have none.
    #[test]
    fn checks_name_every_word_a_take_over_compares() {
        let mut mem = vec![0u64; 16];
        let base = mem.as_ptr() as u64;
        let step = |pc, slot: u64, bp, flags| Step {
            pc,
            sp: base + 8 * slot,
            bp,
            bp_offset: -16,
            flags,
        };
        // Step 0 restores rbp from 16 below step 1's sp; return addresses below steps 1, 2.
        let mut steps = [
            step(0x1000, 0, 0, RESTORES_BP),
            step(0x2000, 4, 0x77, 0),
            step(0x3000, 8, 0, 0),
        ];
        mem[3] = 0x2000;
        mem[2] = 0x77;
        mem[7] = 0x3000;
        let fixed = Ending::Fixed {
            outside: false,
            recorded: true,
        };
        let stack = |words: u64| Stack {
            lo: base,
            hi: base + 8 * words,
        };
        let c = Checks::of(&steps, fixed, 0);
        assert_eq!((c.n, c.reach, c.count), (2, 64, 3));
        assert!(c.hold(stack(16), base, 0));
        assert!(!c.hold(stack(7), base, 0), "a word beyond the stack's top");
        // The saved rbp is not used later: only its readability counts.
        mem[2] = 0x88;
        assert!(c.hold(stack(16), base, 0));
        mem[3] = 0x2001;
        assert!(!c.hold(stack(16), base, 0), "a return address changed");
        mem[3] = 0x2000;
        // Used later: its value is checked too.
        steps[1].flags = BP_NEEDED;
        steps[1].bp = 0x88;
        let c = Checks::of(&steps, fixed, 0);
        assert_eq!(c.n, 3);
        assert!(c.hold(stack(16), base, 0));
        mem[2] = 0x99;
        assert!(
            !c.hold(stack(16), base, 0),
            "a saved rbp a later step uses changed"
        );
        // The first step's own rbp, when a later step reads it.
        steps[0].flags |= BP_NEEDED;
        steps[0].bp = 0x42;
        mem[2] = 0x88;
        let c = Checks::of(&steps, fixed, 1);
        assert_eq!(c.count, 2, "frames from the first recorded step on");
        assert!(c.hold(stack(16), base, 0x42) && !c.hold(stack(16), base, 0x43));
        // Walks only a step-by-step take-over may repeat.
        let outside = Ending::Fixed {
            outside: true,
            recorded: true,
        };
        for ending in [Ending::Full, Ending::Other, outside] {
            assert_eq!(Checks::of(&steps, ending, 0).n, 0);
        }
        steps[1].flags |= OPAQUE;
        assert_eq!(Checks::of(&steps, fixed, 0).n, 0, "a step framehop unwound");
        drop(mem);
    }

    // ---- robustness and frame pointers ---------------------------------------------------------

    #[test]
    fn wrong_registers_truncate_instead_of_faulting() {
        let state = state();
        let set = modules::current().unwrap();
        let cache = cache_for(state).unwrap();
        let (pc, sp, _) = registers();
        let stack = Stack {
            lo: sp,
            hi: state.stack_hi.get(),
        };
        let mut out = [0u64; 64];
        for bp in [0, 1, sp - 4096, sp + 3, u64::MAX, 0xdead_beef] {
            for pc in [pc, level1 as fn(&mut [u64]) -> usize as usize as u64 + 3] {
                let w = cache.walk(set, stack, (pc, sp + 8, bp), &mut out, KEEP);
                assert!(w.frames <= out.len());
                let w = fp_chain(set, stack, (pc, sp, bp), &mut out, 1);
                assert!(w.frames <= out.len());
            }
        }
    }

    #[test]
    fn fp_chain_follows_records_within_bounds() {
        let set = modules::current().unwrap();
        // Return addresses inside libc: a known module that is not the test binary (which
        // counts as "our own code" here, where the walk would stop).
        let libc_pc =
            libc::malloc as unsafe extern "C" fn(usize) -> *mut c_void as usize as u64 + 16;
        let mut fake = vec![0u64; 64];
        let base = fake.as_ptr() as u64;
        let at = |i: usize| base + 8 * i as u64;
        // Three frame records: [next rbp, return address], the last with next rbp = 0.
        fake[10] = at(20);
        fake[11] = libc_pc + 1;
        fake[20] = at(30);
        fake[21] = libc_pc + 2;
        fake[30] = 0;
        fake[31] = libc_pc + 3;
        let stack = Stack {
            lo: base,
            hi: base + 8 * 64,
        };
        let mut out = [0u64; 16];
        out[0] = libc_pc;
        let w = fp_chain(set, stack, (libc_pc, at(2), at(10)), &mut out, 1);
        assert_eq!(
            &out[..w.frames],
            &[libc_pc, libc_pc + 1, libc_pc + 2, libc_pc + 3]
        );
        // A link pointing down the stack ends the walk (no loops).
        fake[20] = at(12);
        let w = fp_chain(set, stack, (libc_pc, at(2), at(10)), &mut out, 1);
        assert_eq!(w.frames, 3);
        // A link leaving the stack ends it too, without reading there.
        fake[20] = base + 8 * 64;
        let w = fp_chain(set, stack, (libc_pc, at(2), at(10)), &mut out, 1);
        assert_eq!(w.frames, 3);
        // So does a full buffer.
        fake[20] = at(30);
        let w = fp_chain(set, stack, (libc_pc, at(2), at(10)), &mut out[..2], 1);
        assert_eq!(w.frames, 2);
        std::hint::black_box(&fake);
    }
}
