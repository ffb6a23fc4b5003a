//! Where the program's stack ended when it began to exit, or where its start frames are: the
//! bounds of the exit report's scan of the exiting thread's stack, and the registers it scans
//! as loose words. Noted by the preload's `exit` and `__libc_start_main`; read by the report
//! (`mod`) and the leak scan (`leaks`).

/// Where the program's live stack ended when it began to exit, and in which thread
/// ([`exit_begins`]); 0: not known.
static EXIT_SP: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static EXIT_THREAD: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
/// The top of glibc's start frames in the main thread, and that thread
/// ([`program_starts`]); 0: not known.
static START_SP: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static START_THREAD: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
/// The callee-saved registers of the frame that called `exit` ([`exit_begins`]).
static EXIT_REGISTERS: [core::sync::atomic::AtomicU64; 6] =
    [const { core::sync::atomic::AtomicU64::new(0) }; 6];

/// The calling thread begins to exit the process (the preload's `exit`),
/// its live stack ending at `sp`, with `registers` the calling frame's callee-saved
/// registers: the exit report's leak check scans this thread's stack from there up, and those
/// registers as loose words, not the stack from the report's own frame far below, whose dead
/// slots in between (left by the program's earlier, deeper calls, never overwritten by
/// `exit`'s chain) would keep lost blocks "reachable" (docs/FINDINGS.md). The registers are
/// what the exit chain would have saved in its frames; memcheck reads them there.
pub fn exit_begins(sp: u64, registers: [u64; 6]) {
    use core::sync::atomic::Ordering::Relaxed;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    for (slot, r) in EXIT_REGISTERS.iter().zip(registers) {
        slot.store(r, Relaxed);
    }
    EXIT_SP.store(sp, Relaxed);
    EXIT_THREAD.store(me, Relaxed);
}

/// The program starts (the preload's `__libc_start_main`), in the main thread, with `sp` just
/// above glibc's start frames (`__libc_start_main`, `__libc_start_call_main`, then `main`):
/// when the main thread exits without [`exit_begins`] (a return from `main`, whose `exit`
/// glibc calls without the PLT), nothing of the program's is live below, and the exit
/// report's scan starts there.
pub fn program_starts(sp: u64) {
    use core::sync::atomic::Ordering::Relaxed;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    START_SP.store(sp, Relaxed);
    START_THREAD.store(me, Relaxed);
}

/// The registers [`exit_begins`] noted, when `own_sp` is the stack pointer it noted: loose
/// words of the leak check's roots.
pub(crate) fn exit_registers(own_sp: Option<u64>) -> [u64; 6] {
    use core::sync::atomic::Ordering::Relaxed;
    let at_exit = EXIT_SP.load(Relaxed);
    if at_exit == 0 || own_sp != Some(at_exit) {
        return [0; 6];
    }
    core::array::from_fn(|i| EXIT_REGISTERS[i].load(Relaxed))
}

/// Where the exit report's scan of thread `me`'s stack starts, the report's own frame being at
/// `sp`: where the program's stack ended when it began to exit ([`exit_begins`]), or above
/// glibc's start frames ([`program_starts`]), if noted by this thread above `sp`; else `sp`.
pub(super) fn scan_from(sp: u64, me: u64) -> u64 {
    use core::sync::atomic::Ordering::Relaxed;
    let at_exit = EXIT_SP.load(Relaxed);
    let at_start = START_SP.load(Relaxed);
    if EXIT_THREAD.load(Relaxed) == me && at_exit > sp {
        at_exit
    } else if START_THREAD.load(Relaxed) == me && at_start > sp {
        at_start
    } else {
        sp
    }
}
