//! Walks kept for later captures of the same stack (`Kept`), found without walking by the
//! stack's layout (`Shape`), and checked flat when only their stack id is wanted (`Checks`).

use super::stack::Stack;
use super::trail::{recorded_from, Ending, Step, AFTER_OWN, BP_NEEDED, OPAQUE, RESTORES_BP};

/// Walks kept besides the last one: sets of [`KEPT_WAYS`] walks each, chosen by a hash of the
/// stack words at a shape's return-address slots (see [`Shape`]). Churn's 100 stacks (50
/// paths, malloc and free) overflowed some of 32 sets: 93% of captures found their walk with
/// one thread, 84% with two; with 64 sets, 99%.
pub(super) const KEPT_SETS: usize = 64;
pub(super) const KEPT_WAYS: usize = 4;
/// Steps a kept walk may have: the tracer's own frames and ~36 of the program's (a step is 32
/// bytes: with 256 walks, ≈330 KiB a thread). Longer walks are only ever the last one.
pub(super) const KEPT_STEPS: usize = 40;
/// Shapes: direct-mapped by the capture's first pc and stack pointer. With 16, and an index
/// of xors of shifted bits, two of the `live` benchmark's four call paths shared a slot and
/// took it in turn: a quarter of its captures walked and kept anew (callgrind: 10% of its
/// instructions; the Rust workload's debug mode 6%). A shape is ~160 bytes, touched as used.
pub(super) const SHAPES: usize = 64;
/// Return-address slots a shape names (the first ones of its walk).
pub(super) const SHAPE_SLOTS: usize = 32;
/// The most a shape's score counts up to.
pub(super) const SHAPE_SCORE: u32 = 8;

/// A walk kept for a later capture of the same stack: taken over from its first step.
#[derive(Clone, Copy)]
pub(super) struct Kept {
    pub(super) len: usize,
    pub(super) ending: Ending,
    pub(super) first: usize,
    /// The id its frames were interned as (0: not known), for captures into a buffer of
    /// `id_len` frames (a shorter one may cut them).
    pub(super) stack_id: u32,
    pub(super) id_len: u32,
    /// The same walk as a list of the words to check, for captures that only want its id.
    pub(super) checks: Checks,
    pub(super) steps: [Step; KEPT_STEPS],
}

/// Words checked per kept walk: one return address a step, and the few saved rbp values that
/// are used later.
pub(super) const CHECKS: usize = KEPT_STEPS + 8;

/// What [`take_over`] would check to repeat a kept walk from its first step with nothing
/// recorded before, flattened when the walk is kept: the stack offset and value of each word,
/// the rbp the first step needs, how far the reads reach. A capture that only wants the walk's
/// stack id then runs one loop over ~20 (offset, value) pairs in 12 bytes each, instead of
/// going through 32-byte steps and their flags (A/B, defaults: sqlite3 1.34x -> 1.24x,
/// python3 5.85x -> 5.66x, churn 2.07x -> 2.00x).
#[derive(Clone, Copy)]
pub(super) struct Checks {
    /// Pairs in use; 0 when the walk can only be taken over step by step (a step framehop
    /// unwound, an ending other than a fixed one inside the known modules, too many checks).
    pub(super) n: u32,
    /// Every word the walk read lies below `sp + reach`.
    pub(super) reach: u32,
    /// Frames the walk records from its first step (`take_over`'s `count`).
    pub(super) count: u32,
    /// Whether its first step needs rbp to be `bp` (`BP_NEEDED`). Not an `Option`: kept
    /// walks start as zeroed memory, and only a `bool`'s zero is defined.
    pub(super) needs_bp: bool,
    pub(super) bp: u64,
    pub(super) offsets: [u32; CHECKS],
    pub(super) values: [u64; CHECKS],
}

impl Checks {
    /// The checks of the walk `steps` that ended with `ending`, first recording at step
    /// `first`; `n == 0` when it has none.
    pub(super) fn of(steps: &[Step], ending: Ending, first: usize) -> Checks {
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
    pub(super) fn hold(&self, stack: Stack, sp: u64, bp: u64) -> bool {
        if (self.needs_bp && self.bp != bp) || u64::from(self.reach) > stack.hi - sp {
            return false;
        }
        let n = self.n as usize;
        // Every word compared, their differences or-ed, with no branch per word: a repeat is
        // the common case, and the early exit of `all` cost a compare and a branch a word.
        let mut differ = 0u64;
        for (&o, &v) in self.offsets[..n].iter().zip(&self.values[..n]) {
            // SAFETY: `sp + reach <= hi` (checked above) and every offset is below `reach`,
            // so each word lies in `[sp, hi)`, the live part of this thread's stack.
            differ |= unsafe { ((sp + u64::from(o)) as *const u64).read_unaligned() } ^ v;
        }
        differ == 0
    }
}

/// Where a walk starting at `(pc, sp)` read its return addresses, relative to `sp`: hashing
/// the words there now tells the kept walks of the stacks that share this layout apart
/// without walking (churn's 50 call paths all have one layout). Only a way to pick a
/// candidate: a kept walk is taken over only after `take_over` checked every word it read.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub(super) pc: u64,
    pub(super) sp: u64,
    pub(super) slots: usize,
    /// Kept walks found minus walks of another layout, saturating: a shape is replaced at 0.
    pub(super) score: u32,
    /// Every slot lies below `sp + reach`: one bounds check covers the key's reads.
    pub(super) reach: u32,
    pub(super) offsets: [u32; SHAPE_SLOTS],
}

pub(super) const NO_SHAPE: Shape = Shape {
    pc: 0,
    sp: 0,
    slots: 0,
    score: 0,
    reach: 0,
    offsets: [0; SHAPE_SLOTS],
};

impl Shape {
    /// The slot of the shape of walks starting at `(pc, sp)`. By both: a walk starts at the
    /// caller of the hook, so a function's `malloc` and `free` calls start at one sp with two
    /// pcs, and by sp alone their shapes took one slot in turn (churn, debug mode: +19%).
    /// Multiplied, so that every bit of both reaches the index's top bits.
    #[inline(always)]
    pub(super) fn index(pc: u64, sp: u64) -> usize {
        let h = (sp ^ pc.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - SHAPES.trailing_zeros())) as usize
    }

    /// The key of the stack now at `(pc, sp)` (never 0): a hash of the words at the slots.
    #[inline(always)]
    pub(super) fn key(&self, stack: Stack) -> u64 {
        let mut h = self.pc ^ self.sp.rotate_left(29);
        let offsets = &self.offsets[..self.slots];
        // Each word rotated by its own position, not a rotate of the running hash: the words
        // are then independent and only one xor a slot is serial (a kept hit computes this
        // over up to 32 slots on every capture).
        if (stack.lo..=stack.hi).contains(&self.sp) && u64::from(self.reach) <= stack.hi - self.sp {
            // The common case, with one bounds check for all slots: a check per word was a
            // third of the key's instructions.
            for (i, &o) in offsets.iter().enumerate() {
                // SAFETY: `lo <= sp <= hi`, `sp + reach <= hi` (just checked), and every offset
                // is below `reach` (`Shape::of`): the word lies in `[lo, hi)`, the live part
                // of this thread's stack (see `Stack::read`).
                let w = unsafe { ((self.sp + u64::from(o)) as *const u64).read_unaligned() };
                h ^= w.rotate_left(i as u32 * 7 + 1);
            }
        } else {
            for (i, &o) in offsets.iter().enumerate() {
                let w = stack.read(self.sp + u64::from(o)).unwrap_or(0);
                h ^= w.rotate_left(i as u32 * 7 + 1);
            }
        }
        (h ^ (h >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
    }

    /// The layout of the walk `steps`, which started at `(steps[0].pc, steps[0].sp)`.
    pub(super) fn of(steps: &[Step]) -> Shape {
        let mut shape = NO_SHAPE;
        shape.pc = steps[0].pc;
        shape.sp = steps[0].sp;
        for s in &steps[1..steps.len().min(SHAPE_SLOTS + 1)] {
            let Ok(o) = u32::try_from(s.sp.wrapping_sub(8).wrapping_sub(shape.sp)) else {
                break;
            };
            let Some(reach) = o.checked_add(8) else {
                break;
            };
            shape.offsets[shape.slots] = o;
            shape.reach = shape.reach.max(reach);
            shape.slots += 1;
        }
        shape
    }

    pub(super) fn same_layout(&self, other: &Shape) -> bool {
        self.offsets[..self.slots] == other.offsets[..other.slots]
    }
}

/// The kept walk for `key`, if any: its index, found in the kept walks' `keys`.
#[inline(always)]
pub(super) fn find_kept(keys: &[u64; KEPT_SETS * KEPT_WAYS], key: u64) -> Option<usize> {
    let set = (key >> (64 - KEPT_SETS.trailing_zeros())) as usize * KEPT_WAYS;
    // The ways compared all at once into a mask: `find` over the range was a call to an
    // iterator's `try_fold` on every capture (~50 instructions on `live`).
    let ways: &[u64; KEPT_WAYS] = keys[set..set + KEPT_WAYS].try_into().ok()?;
    let mut found = 0u32;
    for (w, &k) in ways.iter().enumerate() {
        found |= u32::from(k == key) << w;
    }
    (found != 0).then(|| set + found.trailing_zeros() as usize)
}
