//! `unshare`, `setns` and `clone` into new namespaces: calls that need the process to be the
//! program's alone.
//!
//! The kernel refuses `unshare(CLONE_NEWUSER)` (which implies `CLONE_THREAD`) and `setns`
//! into a user namespace with `EINVAL` to a process with more than one thread, so every
//! sandbox built on user namespaces (bubblewrap, rootless containers, browsers' sandboxes)
//! would fail under the tracer if its profiler thread were there. These hooks run the real
//! call with that thread joined, and make it again afterwards from the calling thread, in its
//! new namespaces (`mem_trace_core::profile::single_threaded`). `clone` with a `CLONE_NEW*`
//! flag is treated alike, so that the new process is made from a process that has only the
//! program's threads.
//!
//! Not covered: the raw system calls (`syscall(SYS_unshare, ...)`, `syscall(SYS_clone3,
//! ...)`, glibc's internal `clone3`, which it does not export), which bubblewrap and Chromium
//! use for their `clone`s: the kernel accepts a `clone` into a new user namespace from a
//! process with several threads, and `unshare` and `setns`, which it does not, go through
//! glibc. A program that counts its threads with no such call before (Chromium's zygote,
//! `/proc/self/task`) is served by the thread not being made there in the first place
//! (crates/core/src/profile/reporter.rs).

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use mem_trace_core::guard::Guard;
use mem_trace_core::profile;

/// Every `CLONE_NEW*` flag: a `clone` with one of them makes new namespaces.
const NEW_NAMESPACES: c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET;

/// glibc's definition of `name` (the next after ours), cached in `slot`; 0 if there is none.
fn next(slot: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    let a = slot.load(Relaxed);
    if a != 0 {
        return a;
    }
    // Inside the guard: what dlsym allocates is not the program's.
    let _g = Guard::enter();
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips our own definition.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(a, Relaxed);
    a
}

/// -1 with `ENOSYS`: glibc has no such function.
fn missing() -> c_int {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

#[cfg_attr(not(test), no_mangle)]
/// `unshare(2)`, as glibc's, with no thread of the tracer's while it runs.
///
/// # Safety
/// As for glibc's `unshare`.
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let real = next(&REAL, c"unshare");
    if real == 0 {
        return missing();
    }
    // SAFETY: glibc's `unshare`, found with RTLD_NEXT, of this signature.
    let real: unsafe extern "C" fn(c_int) -> c_int = unsafe { core::mem::transmute(real) };
    // Every flag, not only CLONE_NEWUSER: the thread made again afterwards is then in the
    // caller's new namespaces, and writes its reports where the program now lives.
    // SAFETY: forwarded contract.
    profile::single_threaded(|| unsafe { real(flags) })
}

#[cfg_attr(not(test), no_mangle)]
/// `setns(2)`, as glibc's, with no thread of the tracer's while it runs.
///
/// # Safety
/// As for glibc's `setns`.
pub unsafe extern "C" fn setns(fd: c_int, nstype: c_int) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let real = next(&REAL, c"setns");
    if real == 0 {
        return missing();
    }
    // SAFETY: glibc's `setns`, found with RTLD_NEXT, of this signature.
    let real: unsafe extern "C" fn(c_int, c_int) -> c_int = unsafe { core::mem::transmute(real) };
    // Whatever `nstype` says: 0 accepts a user namespace too.
    // SAFETY: forwarded contract.
    profile::single_threaded(|| unsafe { real(fd, nstype) })
}

/// The child's entry point, as glibc's `clone` takes it.
type CloneFn = extern "C" fn(*mut c_void) -> c_int;
/// glibc's `clone`, with its optional arguments (`parent_tid`, `tls`, `child_tid`) spelled out.
type Clone = unsafe extern "C" fn(
    CloneFn,
    *mut c_void,
    c_int,
    *mut c_void,
    *mut libc::pid_t,
    *mut c_void,
    *mut libc::pid_t,
) -> c_int;

/// `clone(2)`'s glibc wrapper, as glibc's; with a `CLONE_NEW*` flag, with no thread of the
/// tracer's while it runs.
///
/// `clone` is variadic in C (`parent_tid`, `tls` and `child_tid` follow `arg` only when
/// `flags` asks for them). On x86-64 and AArch64 the variadic arguments travel where fixed
/// ones would, so this takes all seven and passes them on: glibc's own `clone` reads the same
/// registers and stack slot whatever the caller passed, and uses only those `flags` names.
///
/// # Safety
/// As for glibc's `clone`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn clone(
    child: CloneFn,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    parent_tid: *mut libc::pid_t,
    tls: *mut c_void,
    child_tid: *mut libc::pid_t,
) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let real = next(&REAL, c"clone");
    if real == 0 {
        return missing();
    }
    // SAFETY: glibc's `clone`, found with RTLD_NEXT; its variadic tail passed as fixed
    // arguments, which is the same call on these architectures (see above).
    let real: Clone = unsafe { core::mem::transmute(real) };
    // SAFETY: forwarded contract, all seven arguments as the caller left them.
    let call = || unsafe { real(child, stack, flags, arg, parent_tid, tls, child_tid) };
    if flags & NEW_NAMESPACES == 0 {
        return call();
    }
    profile::single_threaded(call)
}
