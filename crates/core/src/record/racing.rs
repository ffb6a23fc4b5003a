//! Frees of one block racing in several threads (a double free in a thread pool): the first
//! takes the block, and each of the others must be told it is a double free.
//!
//! Between the moment the winning free takes the block (out of the table, or its tag erased)
//! and the moment its free is written down (the history record, the freed tag, the
//! quarantine), a losing free finds the block nowhere: it used to judge the pointer unknown
//! and read glibc's chunk header before it, which the winner may have handed glibc by then.
//! A 2 MiB block is an mmapped chunk, unmapped by that `free`: 16 threads freeing one died of
//! SIGSEGV in ~1% of runs, and in most others some losers were called wild pointers or not
//! reported at all (their free passed to glibc, which had already unmapped the block).
//!
//! So a free in debug mode says which block it is freeing in a slot of its own, for as long
//! as it runs, and a free that finds no block looks there before judging: another thread
//! freeing the same address means a double free, known from the tracer's own records once
//! that thread is done. Each thread writes only its own slot (a cache line of its own), so
//! the free path pays two plain stores; the rare losing free reads every slot.

use core::sync::atomic::{
    compiler_fence, fence, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// Slots: threads freeing at the same moment beyond this many go without one (a loser then
/// judges as before, with checked reads only).
const SLOTS: usize = 256;

#[repr(align(64))]
struct Slot {
    /// The kernel thread id owning the slot (0: free).
    owner: AtomicU32,
    /// The block the owner is freeing (0: none).
    addr: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        owner: AtomicU32::new(0),
        addr: AtomicU64::new(0),
    }
}; SLOTS];

/// A thread's slot: its index plus one (0: none yet; `u32::MAX`: none to be had).
pub struct Local {
    slot: core::cell::Cell<u32>,
}

impl Local {
    pub const fn new() -> Self {
        Local {
            slot: core::cell::Cell::new(0),
        }
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}

fn tid() -> u32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// This thread's slot, claimed at its first free.
fn slot(local: &Local) -> Option<&'static Slot> {
    match local.slot.get() {
        0 => {}
        u32::MAX => return None,
        n => return Some(&TABLE[n as usize - 1]),
    }
    let me = tid();
    for (i, s) in TABLE.iter().enumerate() {
        if s.owner.load(Relaxed) == 0 && s.owner.compare_exchange(0, me, Relaxed, Relaxed).is_ok() {
            local.slot.set(i as u32 + 1);
            return Some(s);
        }
    }
    local.slot.set(u32::MAX);
    None
}

/// A free of `addr` in progress in this thread, until the result is dropped.
pub struct Freeing(Option<&'static Slot>);

/// Says that this thread frees `addr` from now until the result is dropped: before the
/// block is taken (its tag erased or its table entry removed, both with release ordering,
/// which publishes this store to whoever finds the block gone).
#[inline(always)]
pub fn freeing(local: &Local, addr: u64) -> Freeing {
    let s = slot(local);
    if let Some(s) = s {
        s.addr.store(addr, Relaxed);
        // Kept before the take by the compiler; x86-64 (the one target) keeps stores in
        // order, so a loser that sees the take (an erased tag, a table shard emptied) sees
        // this store too, with no fence instruction on the free path.
        compiler_fence(SeqCst);
    }
    Freeing(s)
}

impl Drop for Freeing {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            // After everything the free wrote down: a loser that sees the slot cleared sees
            // the records.
            s.addr.store(0, Release);
        }
    }
}

/// At the thread's exit: its slot goes back.
pub(crate) fn thread_exiting(local: &Local) {
    if let n @ 1..=256 = local.slot.replace(u32::MAX) {
        let s = &TABLE[n as usize - 1];
        s.addr.store(0, Relaxed);
        s.owner.store(0, Release);
    }
}

/// In a forked child: only the forking thread is left; every other slot is free again.
pub(crate) fn forked(local: &Local) {
    let mine = local.slot.get();
    for (i, s) in TABLE.iter().enumerate() {
        if i as u32 + 1 != mine {
            s.addr.store(0, Relaxed);
            s.owner.store(0, Relaxed);
        }
    }
}

/// Whether another thread is freeing `addr` now; if so, waits (at most about a second) until
/// it is done, so that its records can be read. Called by a free that found no block at
/// `addr`, after its own look (which saw the block gone).
pub(crate) fn another_frees(local: &Local, addr: u64) -> bool {
    // The look that found the block gone may have been a plain read of its tag: what the
    // winner stored before taking it is visible from here on.
    fence(Acquire);
    let mine = local.slot.get() as usize;
    // This free took nothing: it is no winner for others to wait for (two losers waiting on
    // each other's slots would each wait out the whole second).
    if let Some(s) = TABLE.get(mine.wrapping_sub(1)) {
        s.addr.store(0, Relaxed);
    }
    // Every other free of `addr` in flight is waited for, not only the first found: the
    // others are losers on their way here (each clears its slot on arrival), and the winner
    // may be any of them.
    let others = || {
        TABLE
            .iter()
            .enumerate()
            .find(|&(i, s)| i + 1 != mine && s.addr.load(Acquire) == addr)
            .map(|(_, s)| s)
    };
    let Some(mut s) = others() else {
        return false;
    };
    let start = crate::clock::monotonic_ns();
    let mut spins = 0u32;
    loop {
        while s.addr.load(Acquire) == addr {
            if spins < 100 {
                spins += 1;
                core::hint::spin_loop();
                continue;
            }
            // Bounded: a winner stopped by a debugger (or a slot whose free never returned, a
            // signal handler's `longjmp`) must not hang every loser.
            if crate::clock::monotonic_ns().saturating_sub(start) > 1_000_000_000 {
                return true;
            }
            // SAFETY: sched_yield has no preconditions; the winner may be waiting for a core
            // (16 threads on 2 cores).
            unsafe { libc::sched_yield() };
        }
        match others() {
            Some(next) => s = next,
            None => return true,
        }
    }
}
