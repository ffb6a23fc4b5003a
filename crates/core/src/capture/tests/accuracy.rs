//! The walk against reference unwinders (libgcc's `_Unwind_Backtrace`, framehop with a fresh
//! cache) on stacks of every shape the walk must handle: recursion, mutual recursion with odd
//! frames, a realigned stack, frames inside libc (`qsort`'s callback), and a fresh thread.

use super::*;
use core::ffi::c_int;
use std::cell::RefCell;

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
        hi: state.bounds.hi.get(),
    };
    let set = modules::current().unwrap();
    let mut slow = [0u64; MAX_FRAMES];
    let fresh = &mut CacheX86_64::new();
    let ns = walk_framehop(set, stack, (regs, false), &mut slow, Own::Keep, fresh, None).frames;
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
