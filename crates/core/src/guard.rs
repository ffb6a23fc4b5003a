//! The reentrancy guard that lets nested calls pass straight through.
//!
//! A hook enters the guard before calling the real allocator and records only if it was the
//! outermost entry. Anything the tracer does while the guard is held — its own allocations,
//! `dlsym` calling `calloc`, glibc calling `malloc` from inside `posix_memalign` — reaches the
//! hooks again and goes straight to glibc untracked, so each block is counted once.
//! The flag lives in the thread's `state::ThreadState`.
//!
//! Signal handlers that allocate are the other way in while the guard is held. Two cases
//! need care, both common in programs that `malloc` in a handler (undefined behaviour, but
//! done) and measured with such a program (tests/fixtures/signal_longjmp.c):
//! - The handler interrupts glibc's allocator, called by a hook. glibc's heap is then half
//!   updated, and a nested call into glibc corrupts it (`malloc assertion failure in
//!   sysmalloc`). The tracer calls glibc's slow paths far more often than the program would
//!   (its quarantine keeps freed blocks out of glibc's thread cache, and grows the heap while
//!   it fills), so such programs crashed more often under it. Hooks mark those calls
//!   ([`Guard::in_glibc`]) and a nested allocation meanwhile is served from the tracer's
//!   arena instead (`record::nested`), leaving glibc's heap alone.
//! - The handler leaves with `siglongjmp`, abandoning the hook it interrupted: the guard is
//!   never dropped. Every later entry would pass through untracked, silently. A nested entry
//!   comes from below the guard's frame; an entry whose stack pointer is not (the same hook
//!   called again from the frame the handler jumped to, or any from an older one, on the
//!   thread's own stack) is no nested one, so the guard was abandoned ([`left`]). Calls from
//!   deeper frames go on passing through until the first that is not: a program that jumps
//!   out of `malloc` and calls it again from where it jumped to is noticed at once. The
//!   abandoned hook may have held one of the tracer's locks, so the thread does not take the
//!   tracer up again (it could wait for ever on that lock): it stays untraced, and stderr
//!   says so once.

use crate::capture;
use crate::state::{self, ThreadState};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};

/// Proof that the current thread is inside the tracer; dropping it leaves.
pub struct Guard {
    state: &'static ThreadState,
    /// `entry_sp` before this entry.
    outer_sp: usize,
    _not_send: PhantomData<*mut ()>,
}

impl Guard {
    /// Enters the tracer, or `None` when this thread is already inside it.
    #[inline(always)]
    pub fn enter() -> Option<Guard> {
        let sp = stack_pointer();
        let state = state::current();
        // Set before `busy`, and put back by `Drop`: a handler's hook that runs in between
        // leaves this entry's value in place.
        let outer_sp = state.entry_sp.replace(sp);
        if state.busy.replace(true) {
            state.entry_sp.set(outer_sp);
            left(state, sp, outer_sp);
            return None;
        }
        Some(Guard {
            state,
            outer_sp,
            _not_send: PhantomData,
        })
    }

    /// Runs `f`, a call into glibc's allocator, with a nested allocation meanwhile (a signal
    /// handler's) served by the tracer: glibc's heap is half updated while `f` runs.
    #[inline(always)]
    pub fn in_glibc<T>(&self, f: impl FnOnce() -> T) -> T {
        self.state.in_glibc.set(true);
        let out = f();
        self.state.in_glibc.set(false);
        out
    }

    /// The state of the thread holding the guard.
    #[inline(always)]
    pub(crate) fn state(&self) -> &'static ThreadState {
        self.state
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        self.state.busy.set(false);
        self.state.entry_sp.set(self.outer_sp);
        // The exit report's leak scan is stopping the threads: wait outside the tracer.
        if crate::profile::world::STOPPING.load(Ordering::Relaxed) != 0 {
            crate::profile::world::park();
        }
    }
}

/// The stack pointer of the caller (inlined).
#[inline(always)]
fn stack_pointer() -> usize {
    let sp: usize;
    // SAFETY: reads a register, touches nothing.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    sp
}

/// The one line [`left`] writes.
const LEFT_NOTE: &[u8] = b"mem-trace: a signal handler left the allocator with longjmp while the tracer was recording; that thread's later allocations and frees are not traced\n";

/// A nested entry at `sp`, the guard taken at `guard_sp`: if it comes from a frame that is not
/// below the guard's (see the module documentation), the guard was abandoned; the thread then
/// passes every call through. Only that is certain: the tracer's own calls out (a thread it
/// starts, `dlsym`) enter a few hundred bytes below the guard, no more than the hooks' own
/// frames differ (`free`'s is ~330 bytes larger than `malloc`'s), so no margin tells them from
/// a hook with a larger frame called from the frame the handler jumped to.
#[cold]
#[inline(never)]
fn left(state: &ThreadState, sp: usize, guard_sp: usize) {
    // (The alternate signal stack may lie anywhere, even above the frames it interrupted
    // when the program made it of a local array.)
    if state.left.get() || sp < guard_sp || capture::alt_stack().is_some() {
        return;
    }
    state.left.set(true);
    // Whatever the abandoned hook was doing is over: glibc is no longer being called, and
    // nested calls go to glibc from now on.
    state.in_glibc.set(false);
    state.nested_from_arena.set(false);
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::out::note(LEFT_NOTE);
    }
}

/// Marks the current thread busy (or not) regardless of the previous value; returns the
/// previous value so the caller can restore it. `print_trace` uses this because it may be
/// called by gdb on a thread that was stopped inside a hook.
///
/// Busy this way, with no guard's frame to compare with, every entry counts as nested (the
/// tracer's own work: starting its reporter thread, writing a report), never as a guard
/// abandoned (see [`left`]).
pub fn set_busy(busy: bool) -> bool {
    let state = state::current();
    if busy {
        state.entry_sp.set(usize::MAX);
    }
    state.busy.replace(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enters from well below the caller's frame, as a nested call does.
    #[inline(never)]
    fn enter_deeper() -> bool {
        let pad = core::hint::black_box([0u8; 256]);
        let nested = Guard::enter().is_none();
        core::hint::black_box(&pad);
        nested
    }

    #[test]
    fn nested_entry_passes_through() {
        let outer = Guard::enter().expect("first entry");
        assert!(enter_deeper());
        assert!(state::current().busy.get());
        assert!(
            !state::current().left.get(),
            "a nested entry, not an abandoned guard"
        );
        drop(outer);
        assert!(!state::current().busy.get());
        assert!(Guard::enter().is_some());
    }

    #[test]
    fn an_entry_from_the_guards_own_frame_finds_it_abandoned() {
        std::thread::spawn(|| {
            let g = Guard::enter().expect("first entry");
            let state = g.state();
            state.in_glibc.set(true);
            // Never dropped, as when a signal handler jumps out of the hook.
            core::mem::forget(g);
            assert!(Guard::enter().is_none(), "the thread passes calls through");
            assert!(state.left.get() && !state.in_glibc.get());
            assert!(Guard::enter().is_none(), "for good");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn state_is_per_thread() {
        let _g = Guard::enter().unwrap();
        std::thread::spawn(|| assert!(Guard::enter().is_some()))
            .join()
            .unwrap();
    }
}
