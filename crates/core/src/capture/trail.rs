//! A walk's steps, kept so that the next capture can take over its upper part (`Trail`), and
//! the check-and-copy that does it (`take_over`).

use super::frames::Walk;
use super::stack::Stack;
use crate::arena::{zeroed_box, ArenaBox};
use crate::config::MAX_FRAMES;

/// Steps kept of a walk: every frame it may record, and the tracer's own leading frames.
pub(super) const MAX_STEPS: usize = MAX_FRAMES + 32;

/// One frame of a walk, as the registers stood there, and how the walk left it.
#[derive(Clone, Copy, Default)]
pub(super) struct Step {
    pub(super) pc: u64,
    pub(super) sp: u64,
    pub(super) bp: u64,
    /// Where the caller's rbp was read, relative to the next step's sp (the CFA).
    pub(super) bp_offset: i16,
    pub(super) flags: u16,
    /// The call-tree node of the walk from this step on (see `tree`), for recorded steps of
    /// a finished walk; 0 when not named.
    pub(super) node: u32,
}

/// The step restored rbp from the stack.
pub(super) const RESTORES_BP: u16 = 1;
/// The step computed its CFA from rbp.
pub(super) const USES_BP: u16 = 2;
/// framehop unwound the step: what it read is not known.
pub(super) const OPAQUE: u16 = 4;
/// Some step from here on reads rbp as it was on entry to this one (set when the walk ends).
pub(super) const BP_NEEDED: u16 = 8;
/// A frame was recorded before this one (the tracer's own leading frames are behind).
pub(super) const AFTER_OWN: u16 = 16;
/// In the record, the flags' top byte counts the pairs of consecutive steps outwards of
/// this one, up to it, that need the exact check ([`still_holds`]): the inner step of the
/// pair was unwound by framehop, or restores an rbp whose value is used, or the two do not
/// go up the stack in order. Kept by [`Trail::finish_record`], so that the branch-free
/// check ([`window_holds`]) learns whether its window has such a pair by one subtraction
/// instead of working it out from two steps' flags at every step of every capture.
const EXACT_BEFORE_SHIFT: u32 = 8;
const _: () = assert!(MAX_STEPS < 1 << (16 - EXACT_BEFORE_SHIFT));
/// The flags below that count: the step's own.
const OWN_FLAGS: u16 = (1 << EXACT_BEFORE_SHIFT) - 1;

/// Pairs needing the exact check among the record's pairs outwards of `s` (see
/// `EXACT_BEFORE_SHIFT`).
#[inline(always)]
fn exact_before(s: &Step) -> u16 {
    s.flags >> EXACT_BEFORE_SHIFT
}

/// How a walk ended, for reusing it.
#[derive(Clone, Copy, PartialEq, Eq)]
// A primitive representation makes all-zero bytes a valid `Ending` (`Fixed`), which lets
// kept walks start as zeroed memory (`zeroed_box`).
#[repr(u8)]
pub(super) enum Ending {
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
/// Two orientations: the walk being made (and a kept walk) holds its steps innermost first,
/// in the order they are walked; the last walk, the *record*, holds them outermost first, so
/// that a capture joining it at step `d` leaves steps `..=d` where they are and writes only
/// its own new steps above them (see [`take_over_record`]). `first` counts from the innermost
/// step in both.
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
pub(super) struct Trail {
    pub(super) steps: ArenaBox<[Step; MAX_STEPS]>,
    /// In the record, each named step's path hash (`tree::path_hash`), beside its node.
    pub(super) paths: ArenaBox<[u64; MAX_STEPS]>,
    pub(super) len: usize,
    pub(super) ending: Ending,
    /// The first step recorded as a frame: the steps before it are the tracer's own.
    pub(super) first: usize,
}

/// A whole walk, to take over: its steps, how it ended, its first recorded step.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub(super) steps: &'a [Step],
    pub(super) ending: Ending,
    pub(super) first: usize,
}

impl Trail {
    /// An empty trail, its steps in the arena; `None` when no memory is left.
    pub(super) fn new() -> Option<Trail> {
        // SAFETY: a step is integers only; zero is `Step::default()`.
        let steps = unsafe { zeroed_box() }?;
        // SAFETY: integers only.
        let paths = unsafe { zeroed_box() }?;
        Some(Trail {
            steps,
            paths,
            len: 0,
            ending: Ending::Other,
            first: 0,
        })
    }

    /// Ends the record (outermost first) at `len` steps: marks, from step `fresh` on (the
    /// steps this capture walked; those below are marked already), the steps whose
    /// continuation reads their entry rbp, then counts the pairs needing the exact check
    /// from pair `pairs` on (see `EXACT_BEFORE_SHIFT`; the pairs below are unchanged).
    pub(super) fn finish_record(&mut self, len: usize, fresh: usize, pairs: usize) {
        self.len = len;
        let mut needed = fresh
            .checked_sub(1)
            .is_some_and(|d| self.steps[d].flags & BP_NEEDED != 0);
        for s in &mut self.steps[fresh..len] {
            needed = s.flags & USES_BP != 0 || (s.flags & RESTORES_BP == 0 && needed);
            if needed {
                s.flags |= BP_NEEDED;
            }
        }
        // Pair `k` is steps `k` (outer) and `k + 1`; step `k + 1` counts the pairs up to `k`.
        let pairs = pairs.min(len.saturating_sub(1));
        let mut before = match pairs {
            0 => {
                self.steps[0].flags &= OWN_FLAGS;
                0
            }
            p => exact_before(&self.steps[p]),
        };
        for k in pairs..len.saturating_sub(1) {
            let (to, from) = (self.steps[k], self.steps[k + 1]);
            let exact = from.flags & OPAQUE != 0
                || (from.flags & RESTORES_BP != 0 && to.flags & BP_NEEDED != 0)
                || to.sp <= from.sp;
            before += u16::from(exact);
            let flags = &mut self.steps[k + 1].flags;
            *flags = (*flags & OWN_FLAGS) | (before << EXACT_BEFORE_SHIFT);
        }
    }
}

/// What [`take_over`] made of the old walk from step `j`.
pub(super) enum Taken {
    /// The walk is complete: `walk`, from `steps` steps of the old walk, ending as `ending`
    /// says. With `COPY`, `next` holds the steps; `named` says whether they keep the old
    /// walk's call-tree nodes (they do unless the walk was cut shorter than the old one).
    Done {
        walk: Walk,
        steps: usize,
        ending: Ending,
        named: bool,
    },
    /// Walk on, and try no step of the old walk below this one again.
    Retry(usize),
}

/// Completes the walk now at step `j` of `last`, with registers `bp`, `i` steps in `next`
/// and `n` frames counted (those `out` has room for written), from `last` if the stack
/// still holds what it read (see [`Taken`]).
///
/// `Retry(k)`: a word that no longer holds what the old walk read between steps `m` and
/// `m + 1` fails every take-over at a step up to `m` the same way (same address, same
/// value), so a failed attempt is not repeated one frame further up: the checks of one
/// capture cost at most one pass over the old walk.
///
/// `WRITE`: write the frames (not when the caller knows their stack id already). `COPY`:
/// copy the steps into `next` (not when the old walk is kept as it is). For kept walks, which
/// are innermost first; the record is taken over by [`take_over_record`].
#[inline(never)]
pub(super) fn take_over<const COPY: bool, const WRITE: bool>(
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
) -> Taken {
    let tail = &last[j..];
    let s = tail[0];
    if (s.flags & BP_NEEDED != 0 && s.bp != bp) || (s.flags & AFTER_OWN != 0) != (n > 0) {
        return Taken::Retry(j + 1);
    }
    let (outside, recorded) = match ending {
        Ending::Fixed { outside, recorded } => (outside, recorded),
        // The old walk stopped at the most steps a walk keeps.
        Ending::Full => (false, true),
        Ending::Other => return Taken::Retry(last.len()),
    };
    // With more steps below than the old walk, this one stops at the most steps kept too.
    let steps = match COPY {
        true => tail.len().min(next.len().saturating_sub(i)),
        false => tail.len(),
    };
    if steps == 0 {
        return Taken::Retry(last.len());
    }
    let cut = steps < tail.len();
    let tail = &tail[..steps];
    // The frames it recorded from step j on: not the tracer's own leading steps.
    let skip = first.saturating_sub(j).min(steps);
    let count = recorded_from(steps, skip, recorded || cut);
    // One pass: check every word the old walk read from step j on, copy the steps (unless
    // the old walk is kept as it is), write the frames. On a mismatch the copies are garbage
    // the walk overwrites.
    let copy = if COPY {
        &mut next[i..i + steps]
    } else {
        &mut []
    };
    for (k, w) in tail.windows(2).enumerate() {
        let (from, to) = (w[0], w[1]);
        if !still_holds(stack, from, to) {
            return Taken::Retry(j + k + 1);
        }
        if COPY {
            copy[k] = from;
        }
    }
    if COPY {
        copy[steps - 1] = tail[steps - 1];
    }
    if WRITE && n < out.len() {
        for (o, s) in out[n..].iter_mut().zip(&tail[skip..skip + count]) {
            *o = s.pc;
        }
    }
    let walk = Walk {
        frames: (n + count).min(out.len()),
        // An address outside every module past the frames kept changes nothing they show.
        outside: outside && !cut && n + count <= out.len(),
        ..Walk::default()
    };
    Taken::Done {
        walk,
        steps,
        ending: if cut { Ending::Full } else { ending },
        named: !cut,
    }
}

/// Whether the stack still holds what the walk read to go from step `from` to its caller's
/// step `to`: the return address, and the saved rbp where its value matters.
#[inline(always)]
fn still_holds(stack: Stack, from: Step, to: Step) -> bool {
    if from.flags & OPAQUE != 0 || stack.read(to.sp.wrapping_sub(8)) != Some(to.pc) {
        return false;
    }
    if from.flags & RESTORES_BP == 0 {
        return true;
    }
    // The saved rbp matters only if a step from `to` on reads rbp before restoring it again
    // (`BP_NEEDED`); otherwise its value changes nothing the walk computes, and only its
    // readability (which ends a walk when lost) is checked.
    let v = stack.read(to.sp.wrapping_add(from.bp_offset as i64 as u64));
    v.is_some() && (to.flags & BP_NEEDED == 0 || v == Some(to.bp))
}

/// Whether the stack provably still holds every word the record's `window` (outermost
/// first; the junction last) read — in one pass without a branch per step: the return
/// addresses are compared by xor into one accumulator. `false` when a word differs, or when
/// the window has a pair this pass cannot judge (a step framehop unwound, a saved rbp whose
/// value is used, steps out of order: see `EXACT_BEFORE_SHIFT`): the caller's exact check,
/// pair by pair with [`still_holds`], then decides.
///
/// Without such a pair the steps go up the stack in order, so the words read lie between
/// the innermost one's and the outermost one's: checking those two against the stack's
/// bounds keeps every read inside it, with no clamp per word.
#[inline(always)]
fn window_holds(stack: Stack, window: &[Step]) -> bool {
    let (outer, inner, junction) = match window {
        [] | [_] => return true,
        [only, junction] => (only, only, junction),
        [outer, .., inner, junction] => (outer, inner, junction),
    };
    let pairs = &window[..window.len() - 1];
    if exact_before(junction) != exact_before(outer) {
        return false;
    }
    let (high, low) = (outer.sp.wrapping_sub(8), inner.sp.wrapping_sub(8));
    if stack.hi < stack.lo + 8 || low < stack.lo || high > stack.hi - 8 || low > high {
        return false;
    }
    let mut differ = 0u64;
    for to in pairs {
        // SAFETY: the window's steps go up the stack in order (no exact pair in it, checked
        // above), so `to.sp - 8` lies in `[low, high]`, inside `[lo, hi)`: the live part of
        // this thread's stack (see `Stack::read`).
        let word = unsafe { (to.sp.wrapping_sub(8) as *const u64).read_unaligned() };
        differ |= word ^ to.pc;
    }
    differ == 0
}

/// What [`take_over_record`] made of the record from step `d`.
pub(super) enum FromRecord {
    /// The walk is complete: `walk`; the record's steps `..=d` are its outer part as they
    /// stand, and `Outer` says which of them are its frames, still to be written. The
    /// pairs of steps below the `usize` (outwards of the frames kept) were not checked.
    Done(Walk, Outer, usize),
    /// Walk on, and try no step of the record at or above this index again (a word it
    /// read no longer holds, see [`take_over`]'s `Retry`).
    Retry(usize),
}

/// Completes the walk now at step `d` of the record `rec` (outermost first), with register
/// `bp` and `n` frames counted, from the record if the stack still holds what it read. The
/// frames it takes are not written: [`write_outer`] does, when they are needed.
///
/// Only the words that reach the frames the capture keeps are checked: the rest of the
/// record (an interpreter's outer frames, past the 64 kept) is neither read nor copied. That
/// is exact for what the capture returns: the frames written are checked word by word, and
/// the stack id the call tree gives is that of the same frames, because a node names the
/// record's steps from the outermost on and the kept frames are a prefix, innermost first,
/// of that path. Steps past the window may be stale, which only makes a later capture that
/// reaches them check them then. They are checked before a node is made under them
/// ([`outer_holds`]): the tree would otherwise name every pairing of a stale outer part with
/// a new inner one.
#[inline(never)]
pub(super) fn take_over_record(
    rec: &Trail,
    d: usize,
    stack: Stack,
    bp: u64,
    out: &mut [u64],
    n: usize,
) -> FromRecord {
    let steps = &rec.steps[..=d];
    let s = steps[d];
    if (s.flags & BP_NEEDED != 0 && s.bp != bp) || (s.flags & AFTER_OWN != 0) != (n > 0) {
        return FromRecord::Retry(d);
    }
    let (outside, recorded) = match rec.ending {
        Ending::Fixed { outside, recorded } => (outside, recorded),
        Ending::Full => (false, true),
        Ending::Other => return FromRecord::Retry(0),
    };
    let len = d + 1;
    // The junction as an index from the record's innermost step, and the frames recorded
    // from it outwards: not the tracer's own leading steps.
    let j = rec.len - 1 - d;
    let skip = rec.first.saturating_sub(j).min(len);
    let count = recorded_from(len, skip, recorded);
    let room = out.len().saturating_sub(n);
    if rec.ending == Ending::Full && count < room {
        // The record stopped at the most steps a walk has, short of the thread's first
        // frame, and the frames it holds from here do not fill the capture: the stack goes
        // on past them. A walk from here has fewer steps below, and goes farther.
        return FromRecord::Retry(0);
    }
    // The steps checked, as offsets outwards from the junction: all of them when the frames
    // fit (how the walk ended then shows), else up to the last frame written.
    let reach = match count.min(room) {
        w if w == count => len - 1,
        // No frame left to write: nothing past the junction shows.
        0 => 0,
        w => skip + w - 1,
    };
    if !window_holds(stack, &steps[d - reach..=d]) {
        // Whether a word changed, which one, and so where the walk may join the record again.
        for k in 1..=reach {
            if !still_holds(stack, steps[d + 1 - k], steps[d - k]) {
                return FromRecord::Retry(d - k + 1);
            }
        }
    }
    let walk = Walk {
        frames: (n + count).min(out.len()),
        // An address outside every module past the frames kept changes nothing they show.
        outside: outside && n + count <= out.len(),
        ..Walk::default()
    };
    let outer = Outer {
        top: d - skip.min(d),
        count: count.min(room),
    };
    FromRecord::Done(walk, outer, d - reach)
}

/// Whether the stack still holds what the record's `steps` (its outermost ones) read, pair
/// by pair: the part a take-over left unchecked (see [`take_over_record`]). A step framehop
/// unwound read words nobody knows, and counts as holding: no frame a capture keeps comes
/// from this part, so a stale step here costs only nodes, where failing would make every
/// capture that names a new stack below it walk the whole stack again.
pub(super) fn outer_holds(steps: &[Step], stack: Stack) -> bool {
    steps
        .windows(2)
        .all(|w| w[1].flags & OPAQUE != 0 || still_holds(stack, w[1], w[0]))
}

/// The frames a take-over found in the record: steps `top`, `top - 1`, ... (`count` of
/// them), outermost first. Written only when the call tree has no stack id for the walk
/// yet (see [`write_outer`]): copying up to 64 return addresses on every capture cost the
/// `deep` benchmark ~8% of its instructions, for frames nobody read.
#[derive(Clone, Copy)]
pub(super) struct Outer {
    top: usize,
    count: usize,
}

/// Writes the frames `outer` names from the record `rec` after the first `n` of `out`.
#[inline(always)]
pub(super) fn write_outer(rec: &Trail, outer: Outer, out: &mut [u64], n: usize) {
    let written = n.min(out.len());
    let steps = &rec.steps[..=outer.top];
    for (o, s) in out[written..]
        .iter_mut()
        .zip(steps.iter().rev().take(outer.count))
    {
        *o = s.pc;
    }
}

/// Frames a walk records over `len` steps after skipping the first `skip` (the tracer's own):
/// one per step but the last, which counts only if the walk `recorded` it.
pub(super) fn recorded_from(len: usize, skip: usize, recorded: bool) -> usize {
    (len - 1 + usize::from(recorded)).saturating_sub(skip)
}
