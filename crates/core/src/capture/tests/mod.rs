//! The unwinder: its accuracy against reference unwinders (`accuracy`), and each mechanism
//! on its own: take-overs, kept walks, their flat checks, the fp chain.

use super::cache::cache_for;
use super::fp::fp_chain;
use super::kept::Checks;
use super::trail::{Ending, Step, BP_NEEDED, OPAQUE, RESTORES_BP};
use super::*;
use crate::config::MAX_FRAMES;
use core::ffi::c_void;

mod accuracy;

/// How the tests walk: keeping every frame (the test binary is "our own code").
const KEEP: How = How {
    own: Own::Keep,
    fp: false,
    want_id: false,
    at_return: false,
    kept: Looked::Not,
};
const KEEP_ID: How = How {
    want_id: true,
    ..KEEP
};

fn state() -> &'static Local {
    let local = &crate::state::current().capture;
    if !local.bounds.known() {
        local.bounds.set_from_pthread();
    }
    local
}

/// The cached walk from `regs`, keeping our own frames: in the unit-test binary the tracer's
/// code is the test binary itself. With `fresh`, the last walk is forgotten first, so the
/// whole stack is walked frame by frame.
fn fast_walk(regs: (u64, u64, u64), out: &mut [u64], fresh: bool) -> usize {
    let state = state();
    let stack = Stack {
        lo: regs.1,
        hi: state.bounds.hi.get(),
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
    let state = &crate::state::current().capture;
    let saved = (state.bounds.lo.get(), state.bounds.hi.get());
    state.bounds.hi.set(0);
    let mut out = [0u64; 8];
    assert_eq!(capture(state, &mut out), 0);
    state.bounds.lo.set(saved.0);
    state.bounds.hi.set(saved.1);
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
        hi: state.bounds.hi.get(),
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
        hi: state().bounds.hi.get(),
    }
}

/// The frames framehop finds from `regs` with a fresh cache (the tests' reference).
fn reference_walk(regs: (u64, u64, u64), out: &mut [u64]) -> usize {
    let set = modules::current().unwrap();
    let fresh = &mut CacheX86_64::new();
    walk_framehop(
        set,
        stack_at(regs),
        (regs, false),
        out,
        Own::Keep,
        fresh,
        None,
    )
    .frames
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

/// Captures `n` times through `via_a` and `via_b` in turn, from one call site (a loop the
/// compiler cannot unroll), each stack into its own buffer.
fn alternate(n: usize, leaf: Leaf) -> [[u64; 64]; 2] {
    let mut stacks = [[0u64; 64]; 2];
    let callers: [Caller; 2] = [via_a, via_b];
    for k in 0..std::hint::black_box(n) {
        std::hint::black_box(callers[k % 2])(&mut stacks[k % 2], leaf);
    }
    stacks
}

/// Two stacks in turn from one call site: once each has been interned, its kept walk
/// gives its id back, and never the other one's.
#[test]
fn kept_walks_give_back_their_own_stack_id() {
    IDS_GIVEN_BACK.set(0);
    alternate(10, interned);
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

thread_local! {
    static REPEATS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Captures as `capture_interned` does first ([`repeat_kept`]), falling back to the walk and
/// its interning as [`interned`] does; checks every id against framehop's frames.
fn repeated_first(out: &mut [u64]) -> usize {
    let regs = registers();
    let state = state();
    let set = modules::current().unwrap();
    let kept = match repeat_kept(state, set, stack_at(regs), regs, out.len()) {
        Ok(c) => {
            let mut slow = [0u64; 64];
            let ns = reference_walk(regs, &mut slow);
            assert_eq!(c.id, fake_id(&slow[..ns]), "another stack's id");
            assert_eq!((c.frames, c.node), (ns, 0));
            REPEATS.set(REPEATS.get() + 1);
            return c.frames;
        }
        Err(kept) => kept,
    };
    let cache = cache_for(state).unwrap();
    let how = How { kept, ..KEEP_ID };
    let w = cache.walk(set, stack_at(regs), regs, out, how);
    if w.id == 0 {
        remember_id(state, fake_id(&out[..w.frames]), out.len());
    }
    w.frames
}

/// Two stacks in turn from one call site, so each capture starts where the last one did
/// with the other stack above: the walk the last capture repeated is a candidate whose
/// words differ, and the repeat must still find, by the shape's key, the walk of its own
/// stack, and give its id.
#[test]
fn a_repeat_from_a_shared_call_site_gives_its_own_stack_id() {
    REPEATS.set(0);
    let mut stacks = alternate(12, repeated_first);
    let repeats = REPEATS.get();
    assert!(
        repeats >= 8,
        "{repeats} of 12 captures repeated a kept walk"
    );
    assert_ne!(stacks[0][2], stacks[1][2]);
    // And one stack again and again (from another call site here: a new stack, walked and
    // kept the first time): the walk the last capture repeated is the candidate.
    let before = REPEATS.get();
    for _ in 0..std::hint::black_box(4) {
        via_a(&mut stacks[0], repeated_first);
    }
    assert_eq!(REPEATS.get(), before + 3);
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
        node: 0,
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
        hi: state.bounds.hi.get(),
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
    let libc_pc = libc::malloc as unsafe extern "C" fn(usize) -> *mut c_void as usize as u64 + 16;
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
