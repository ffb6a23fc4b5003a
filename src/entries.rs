//! The preload's entry points for a `Traced` allocator in the same process: when a program
//! that wraps its own allocator runs under `LD_PRELOAD=libmem_trace.so`, the preload's tables
//! are the process's (its hooks see every `malloc`), and the wrapper records into them through
//! this table instead of into its own copy of the tracer, so each block is counted once.
//!
//! The table is a `#[repr(C)]` static the preload exports as `mem_trace_preload_entries`;
//! the wrapper finds it with `dlsym(RTLD_DEFAULT, ...)` and uses it only when its `version`
//! is the one it was built with (the two may come from different builds of this crate).

use core::ffi::c_void;

/// Bumped whenever [`Entries`] or [`Taken`] change.
pub(crate) const VERSION: u32 = 1;

/// The exported symbol's name.
#[cfg(feature = "global-alloc")]
pub(crate) const SYMBOL: &core::ffi::CStr = c"mem_trace_preload_entries";

/// A block taken out of the table before a `realloc`, handed back after it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Taken {
    pub addr: u64,
    pub size: u64,
    pub seq: u64,
    pub thread: u32,
    pub stack: u32,
}

/// What a wrapper calls, each the same step as in the preload's own hooks.
#[repr(C)]
pub(crate) struct Entries {
    pub version: u32,
    /// The wrapper's allocator returned `p` for `size` bytes.
    pub allocated: unsafe extern "C" fn(p: *mut c_void, size: usize),
    /// The program frees `p`: false for a double or invalid free (reported), which the
    /// wrapper must not pass on.
    pub free: unsafe extern "C" fn(p: *mut c_void) -> bool,
    /// Before a `realloc` of `p`: takes its record out into `*out`; false if none.
    pub take: unsafe extern "C" fn(p: *mut c_void, out: *mut Taken) -> bool,
    /// After it: `old` is what `take` wrote (or null), `q` the result for `size` bytes.
    pub reallocated:
        unsafe extern "C" fn(old: *const Taken, p: *mut c_void, q: *mut c_void, size: usize),
}

/// This build's own table (a build with both the preload's and the wrapper's features).
#[cfg(all(feature = "tracer", feature = "global-alloc"))]
pub(crate) fn preload_table() -> *const Entries {
    &preload::mem_trace_preload_entries
}

#[cfg(feature = "tracer")]
mod preload {
    use super::{Entries, Taken, VERSION};
    use core::ffi::c_void;
    use mem_trace_core::format::Block;
    use mem_trace_core::guard::Guard;
    use mem_trace_core::record::{self, Disposition};

    /// The table a `Traced` wrapper looks up (see the module documentation).
    #[cfg_attr(not(test), no_mangle)]
    #[used]
    #[allow(non_upper_case_globals)]
    pub static mem_trace_preload_entries: Entries = Entries {
        version: VERSION,
        allocated,
        free,
        take,
        reallocated,
    };

    unsafe extern "C" fn allocated(p: *mut c_void, size: usize) {
        if let Some(g) = Guard::enter() {
            record::allocated(&g, p, size);
        }
    }

    unsafe extern "C" fn free(p: *mut c_void) -> bool {
        match Guard::enter() {
            Some(g) => record::free_unheld(&g, p) != Disposition::Reject,
            None => true,
        }
    }

    unsafe extern "C" fn take(p: *mut c_void, out: *mut Taken) -> bool {
        let Some(b) = Guard::enter().and_then(|g| record::take(&g, p)) else {
            return false;
        };
        // SAFETY: the wrapper passes a pointer to its own `Taken`.
        unsafe {
            out.write(Taken {
                addr: b.addr,
                size: b.size,
                seq: b.seq,
                thread: b.thread,
                stack: b.stack,
            })
        };
        true
    }

    unsafe extern "C" fn reallocated(
        old: *const Taken,
        p: *mut c_void,
        q: *mut c_void,
        size: usize,
    ) {
        // SAFETY: null or the wrapper's `Taken`, filled by `take`.
        let old = unsafe { old.as_ref() }.map(|t| Block {
            addr: t.addr,
            size: t.size,
            thread: t.thread,
            seq: t.seq,
            stack: t.stack,
        });
        if let Some(g) = Guard::enter() {
            record::reallocated(&g, old, p, q, size);
        }
    }
}
