//! `exit` and `__libc_start_main`: where the program's own stack ends when it exits, for the
//! exit report's leak check (`mem_trace_core::profile::exit_begins`).
//!
//! The exit report runs in the library's destructor, deep below the program's last frame
//! (`exit` → `__run_exit_handlers` → `_dl_fini` → the destructor). The stack between holds
//! dead slots of the program's earlier, deeper calls that the exit chain's frames did not
//! overwrite, and a scan from the report's own frame takes them for pointers: blocks the
//! program lost look reachable, differently from run to run with ASLR (docs/FINDINGS.md).
//! memcheck never sees them: it scans only defined words, and the exit chain's fresh frames
//! are undefined to it. So the scan starts where the program's stack ends instead:
//! - at an explicit `exit(3)` (from any thread): the caller's stack pointer, which this hook
//!   sees as the address of a local of its own frame, a few words below it, and the caller's
//!   callee-saved registers, which the exit chain would have saved below (memcheck sees
//!   them there: the caller's pointers held in registers across the call);
//! - on a return from `main`: glibc calls its own `exit` without the PLT, where no preload
//!   can see it. The program's `_start` calls `__libc_start_main` through the PLT, though:
//!   this hook notes its own stack pointer, the top of glibc's start frames, and hands over
//!   to glibc's. After `main` returned, nothing of the program's is live below; the two
//!   glibc frames between (`__libc_start_main`, `__libc_start_call_main`) hold no heap
//!   pointers of the program's. `main` is not wrapped: a frame of this library between the
//!   program's would end every stack walk there (the walk stops at the tracer's own code, as
//!   at its thread trampoline), and stacks would lose `main`'s callers.
//!
//! An `exit` that glibc calls itself from the program's frames (`error(3)`) is not seen: in
//! the main thread the scan then starts above them all (blocks only they hold may be called
//! lost), in another thread from the report's frame as before. Allocations made by `atexit`
//! handlers after an explicit `exit` have stacks that end at `exit` (this hook's frame is the
//! tracer's own code).

use crate::next::Next;
use core::ffi::{c_char, c_int, c_void};
use mem_trace_core::guard::Guard;
use mem_trace_core::profile;

static EXIT: Next = Next::new(c"exit");
static START_MAIN: Next = Next::new(c"__libc_start_main");

type Main = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;

/// The stack pointer of the calling frame (a few words below its caller's). Read from the
/// register, not as a local's address: a local whose address escapes would keep the compiler
/// from turning `__libc_start_main`'s call into a jump.
#[inline(always)]
fn here() -> u64 {
    let sp: u64;
    // SAFETY: only copies rsp into an output; no memory, stack or flags touched.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// The callee-saved registers (`rbx`, `rbp`, `r12` to `r15`) as they are now: at the start
/// of a hook, still the caller's, which may hold the program's pointers.
#[inline(always)]
fn callee_saved() -> [u64; 6] {
    #[cfg(target_arch = "x86_64")]
    {
        let mut out = [0u64; 6];
        // The registers are stored straight to memory through rdi, which is no callee-saved
        // register: with six register outputs the compiler may give an output one of the
        // registers the template reads, so that a later `mov` reads a value the template
        // wrote (seen: r14 and r15 read as copies of rbx and rbp).
        // SAFETY: writes six words into `out`, which is ours and that long; reads only
        // registers; no stack or flags touched.
        unsafe {
            core::arch::asm!(
                "mov [rdi], rbx", "mov [rdi + 8], rbp", "mov [rdi + 16], r12",
                "mov [rdi + 24], r13", "mov [rdi + 32], r14", "mov [rdi + 40], r15",
                in("rdi") out.as_mut_ptr(),
                options(nostack, preserves_flags),
            );
        }
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    [0; 6]
}

#[cfg_attr(not(test), no_mangle)]
/// `exit(3)`: notes the caller's stack pointer, then glibc's `exit`.
///
/// # Safety
/// As for glibc's `exit`.
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    let registers = callee_saved();
    profile::exit_begins(here(), registers);
    let real = {
        let _g = Guard::enter();
        EXIT.get()
    };
    if real == 0 {
        // SAFETY: ends the process; nothing to run without glibc's exit.
        unsafe { libc::_exit(status) }
    }
    // SAFETY: glibc's exit, found with RTLD_NEXT.
    let f: unsafe extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(real) };
    // SAFETY: forwarded contract.
    unsafe { f(status) }
}

#[cfg_attr(not(test), no_mangle)]
/// `__libc_start_main`: notes where the program's stack begins, then glibc's.
///
/// # Safety
/// As for glibc's `__libc_start_main` (called by the program's `_start` only).
pub unsafe extern "C" fn __libc_start_main(
    main: Main,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    type Real = unsafe extern "C" fn(
        Main,
        c_int,
        *mut *mut c_char,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
    ) -> c_int;
    let real = {
        let _g = Guard::enter();
        START_MAIN.get()
    };
    if real == 0 {
        // SAFETY: no glibc to start the program: nothing else can be done.
        unsafe { libc::abort() }
    }
    profile::program_starts(here());
    // SAFETY: glibc's __libc_start_main, found with RTLD_NEXT, of this signature.
    let real: Real = unsafe { core::mem::transmute(real) };
    // SAFETY: forwarded contract. A call in tail position with the same arguments: the
    // compiler makes it a jump, so that no frame of ours stays below glibc's.
    unsafe { real(main, argc, argv, init, fini, rtld_fini, stack_end) }
}
