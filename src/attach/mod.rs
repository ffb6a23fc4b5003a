//! The library's side of `mem-trace attach PID` and `mem-trace detach PID`: the two entry
//! points the command calls in the running process after loading the library there with
//! `dlopen`, and the state the command reads before it does anything.
//!
//! - `got`: the GOT entries of every module pointed at the hooks, and put back;
//! - `state`: how the library came into the process, exported for the command to read.
//!
//! The command stops one thread at a point where it is not inside the allocator or the loader
//! and calls `dlopen`, then [`mem_trace_attach`], on it; the process's other threads run on.

// The constructor and destructor that ask whether the library was loaded by an attach are
// not in unit tests.
#![cfg_attr(test, allow(dead_code))]

mod got;
mod state;

pub(crate) use got::patch_new_modules;
pub(crate) use state::{attached, loaded_late};
// Asked by the destructor, which is not in unit tests.
#[cfg(not(test))]
pub(crate) use state::tracing;

use core::ffi::{c_char, CStr};
use core::sync::atomic::Ordering;
use mem_trace_core::guard::Guard;
use mem_trace_core::record;
use state::{ATTACHED, DETACHED, LOADED, MEM_TRACE_ATTACH_STATE, PRELOADED};

/// [`mem_trace_attach`]'s and [`mem_trace_detach`]'s failures, as negative return values
/// (the command names each).
pub mod error {
    /// The library was preloaded or linked, not loaded by `mem-trace attach`.
    pub const NOT_LOADED_BY_ATTACH: i64 = -1;
    /// The tracer could not start (out of memory for its tables).
    pub const NO_START: i64 = -2;
    /// Detach of a process that is not attached.
    pub const NOT_ATTACHED: i64 = -3;
    /// The settings were null or not UTF-8.
    pub const BAD_SETTINGS: i64 = -4;
}

/// Whether the library was loaded by `dlopen` into a process that was already running: then
/// the process's modules bound `malloc` to glibc's, not to our hook. Asked by the ELF
/// constructor, which must then leave everything to [`mem_trace_attach`].
pub(crate) fn loaded_by_dlopen() -> bool {
    // Not "where does `malloc` resolve": a non-PIE program that takes `malloc`'s address
    // makes its own PLT stub the symbol's address (seen: Debian's /usr/bin/python3, whose
    // `malloc` is 0x41f610 under the preload). The loader's list says it: a preloaded (or
    // linked) library comes before libc.so.6, one `dlopen`ed later comes after it.
    let mut order = Order {
        own: loaded_by_dlopen as *const () as usize,
        index: 0,
        own_at: None,
        libc_at: None,
    };
    // SAFETY: the callback gets `order` back as `data` and only reads the module's headers.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut order).cast()) };
    let loaded = matches!((order.own_at, order.libc_at), (Some(o), Some(l)) if o > l);
    if loaded {
        MEM_TRACE_ATTACH_STATE.store(LOADED, Ordering::Release);
    }
    loaded
}

/// Where this library and libc.so.6 are in the loader's list.
struct Order {
    own: usize,
    index: usize,
    own_at: Option<usize>,
    libc_at: Option<usize>,
}

unsafe extern "C" fn each(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut core::ffi::c_void,
) -> core::ffi::c_int {
    // SAFETY: `data` is the `Order` passed to dl_iterate_phdr, alive for the iteration.
    let order = unsafe { &mut *data.cast::<Order>() };
    // SAFETY: glibc hands a valid entry for the duration of the call.
    let info = unsafe { &*info };
    // SAFETY: the program headers of a loaded module.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    let holds_own = phdrs.iter().any(|p| {
        p.p_type == 1
            && (base + p.p_vaddr as usize..base + (p.p_vaddr + p.p_memsz) as usize)
                .contains(&order.own)
    });
    if holds_own {
        order.own_at = Some(order.index);
    }
    if !info.dlpi_name.is_null() {
        // SAFETY: a NUL-terminated name from glibc.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        if order.libc_at.is_none() && name.ends_with(b"/libc.so.6") {
            order.libc_at = Some(order.index);
        }
    }
    order.index += 1;
    0
}

/// Starts tracing a running process this library was `dlopen`ed into: initialises the
/// tracer with `settings` (`NAME=VALUE` lines of `MEM_TRACE_*` names, written by the
/// command from its options; the process's environment is not read), then points every
/// module's GOT entries for the malloc family at the hooks. Returns the number of entries
/// patched, 1 or more, or a negative [`error`]. A second call after [`mem_trace_detach`]
/// resumes with the first call's settings.
///
/// # Safety
/// `settings` is null or a NUL-terminated string. Called by `mem-trace attach`, on a thread
/// stopped outside the allocator and the loader.
#[no_mangle]
pub unsafe extern "C" fn mem_trace_attach(settings: *const c_char) -> i64 {
    let state = MEM_TRACE_ATTACH_STATE.load(Ordering::Acquire);
    if state == PRELOADED {
        return error::NOT_LOADED_BY_ATTACH;
    }
    if settings.is_null() {
        return error::BAD_SETTINGS;
    }
    // SAFETY: forwarded contract.
    let Ok(settings) = unsafe { CStr::from_ptr(settings) }.to_str() else {
        return error::BAD_SETTINGS;
    };
    // Before the tracer starts: on another allocator, it starts without what needs glibc's.
    crate::allocator::ensure_chosen();
    if record::attached::attach(settings).is_err() {
        return error::NO_START;
    }
    MEM_TRACE_ATTACH_STATE.store(ATTACHED, Ordering::Release);
    got::patch_all(&crate::hooks::redirected()) as i64
}

/// Stops tracing: puts back every GOT entry that still points at a hook and forgets the live
/// blocks (an attached tracer holds no quarantine to hand back). The library stays mapped
/// (a pointer to a hook may have been taken meanwhile; the hooks then pass straight to
/// glibc). Returns the number of entries restored, or a negative [`error`].
#[no_mangle]
pub extern "C" fn mem_trace_detach() -> i64 {
    if MEM_TRACE_ATTACH_STATE.load(Ordering::Acquire) != ATTACHED {
        return error::NOT_ATTACHED;
    }
    let restored = got::restore();
    MEM_TRACE_ATTACH_STATE.store(DETACHED, Ordering::Release);
    if let Some(g) = Guard::enter() {
        record::attached::detach(&g, &crate::allocator::Underneath);
    }
    restored as i64
}
