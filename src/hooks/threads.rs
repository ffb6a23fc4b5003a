//! `pthread_create`: a new thread notes its stack bounds before running the program's code.

use crate::next;
use core::ffi::{c_int, c_void};
use mem_trace_core::guard::Guard;
use mem_trace_core::profile::last_thread;
use mem_trace_core::record;

type StartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut c_void,
) -> c_int;

struct Start {
    routine: StartRoutine,
    arg: *mut c_void,
    /// Whether the thread is counted among the program's (`last_thread`).
    counted: bool,
}

extern "C" fn thread_trampoline(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box made in `pthread_create` below, handed over to this thread.
    let start = unsafe { Box::from_raw(p as *mut Start) };
    record::thread_started();
    let Start {
        routine,
        arg,
        counted,
    } = *start;
    if counted {
        last_thread::thread_begins();
    }
    routine(arg)
}

#[cfg_attr(not(test), no_mangle)]
/// `pthread_create(3)`: the new thread first notes its stack bounds (the unwinder reads only
/// within them; asking glibc for them from inside a hook can deadlock), then runs `routine`.
///
/// # Safety
/// As for glibc's `pthread_create`.
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartRoutine,
    arg: *mut c_void,
) -> c_int {
    let real = {
        let _g = Guard::enter();
        next::PTHREAD_CREATE.get()
    };
    if real == 0 {
        return libc::EAGAIN;
    }
    // SAFETY: glibc's pthread_create, found with RTLD_NEXT.
    let real: PthreadCreate = unsafe { core::mem::transmute(real) };
    let start = {
        // The tracer's own thread, made inside the guard, is not the program's.
        let g = Guard::enter();
        let counted = g.is_some() && last_thread::thread_coming();
        Box::into_raw(Box::new(Start {
            routine,
            arg,
            counted,
        }))
    };
    // SAFETY: forwarded contract; the trampoline takes ownership of `start`.
    let rc = unsafe { real(thread, attr, thread_trampoline, start.cast()) };
    if rc == 0 && !thread.is_null() {
        // SAFETY: glibc wrote the new thread's id there.
        mem_trace_core::profile::thread_created(unsafe { *thread });
    }
    if rc != 0 {
        let _g = Guard::enter();
        // SAFETY: the thread was not created, so the Box is still ours.
        let start = unsafe { Box::from_raw(start) };
        if start.counted {
            last_thread::thread_not_made();
        }
    }
    rc
}
