//! The preload's entry points for a `Traced` allocator in the same process: when a program
//! that wraps its own allocator runs under `LD_PRELOAD=libmem_trace.so`, the preload's tables
//! are the process's (its hooks see every `malloc`), and the wrapper records into them through
//! this table instead of into its own copy of the tracer, so each block is counted once.
//!
//! The same goes for what a program asks of its own copy of the tracer: `print_trace` (from
//! gdb), and the profiler's peaks, reset and report (`mem_trace::peaks` ...). Under the
//! preload that copy's tables are empty, so it asks the preload instead.
//!
//! The table is a `#[repr(C)]` static the preload exports as `mem_trace_preload_entries`;
//! the wrapper finds it with `dlsym(RTLD_DEFAULT, ...)` and uses it only when its `version`
//! is the one it was built with (the two may come from different builds of this crate).

use core::ffi::c_void;

/// Bumped whenever [`Entries`] or the types it passes change.
pub(crate) const VERSION: u32 = 2;

/// The exported symbol's name.
const SYMBOL: &core::ffi::CStr = c"mem_trace_preload_entries";

/// The global numbers of `mem_trace::Peaks`, across the table.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct PeaksC {
    pub global: u64,
    pub live: u64,
}

/// One `mem_trace::ThreadPeak`, across the table (the name NUL-padded, as the kernel's).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ThreadPeakC {
    pub tid: u32,
    pub exited: u32,
    pub peak: u64,
    pub live: u64,
    pub name: [u8; 16],
}

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

/// Where the stack of a record starts: the registers the wrapper read on entry (its own frame
/// is skipped, as in a wrapper recording into its own tables).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Start {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

#[cfg(feature = "global-alloc")]
impl Start {
    /// The registers here, where this is inlined.
    #[inline(always)]
    pub(crate) fn here() -> Start {
        let (pc, sp, bp) = mem_trace_core::record::registers();
        Start { pc, sp, bp }
    }
}

/// What a wrapper calls, each the same step as in the preload's own hooks.
#[repr(C)]
pub(crate) struct Entries {
    pub version: u32,
    /// The wrapper's allocator returned `p` for `size` bytes.
    pub allocated: unsafe extern "C" fn(p: *mut c_void, size: usize, start: Start),
    /// The program frees `p`: false for a double or invalid free (reported), which the
    /// wrapper must not pass on.
    pub free: unsafe extern "C" fn(p: *mut c_void, start: Start) -> bool,
    /// Before a `realloc` of `p`: takes its record out into `*out`; false if none.
    pub take: unsafe extern "C" fn(p: *mut c_void, out: *mut Taken) -> bool,
    /// After it: `old` is what `take` wrote (or null), `q` the result for `size` bytes.
    pub reallocated: unsafe extern "C" fn(
        old: *const Taken,
        p: *mut c_void,
        q: *mut c_void,
        size: usize,
        start: Start,
    ),
    /// From now on this thread's stacks start at `*start` (null: where they are captured
    /// again): around a call into `malloc`, which the preload's hooks record.
    pub start: unsafe extern "C" fn(start: *const Start),
    /// The preload's `print_trace`.
    pub print_trace: extern "C" fn(addr: usize),
    /// The profiler's reset (absent only in builds from before the counters were always kept).
    pub reset_peaks: Option<extern "C" fn()>,
    /// The profiler's report to a descriptor, when the preload keeps counters.
    pub report_to: Option<extern "C" fn(fd: i32)>,
    /// The profiler's peaks: the global ones into `*out`, up to `cap` threads into
    /// `threads`; returns how many threads there are (call again with room for more).
    pub peaks: Option<unsafe extern "C" fn(*mut PeaksC, *mut ThreadPeakC, usize) -> usize>,
}

/// The preload's entries as looked up: 0 before the lookup, [`ABSENT`] when there are none,
/// else their address.
static LOOKED_UP: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
/// Looked up, and none: never a table's address (tables are aligned).
const ABSENT: usize = 1;

/// The preload's entries, if `libmem_trace.so` is loaded, speaks this version, and is not
/// this very copy; looked up once (`dlsym`, which may allocate: not for code gdb calls, which
/// uses [`preload_if_known`]).
pub(crate) fn preload() -> Option<&'static Entries> {
    use core::sync::atomic::Ordering;
    if LOOKED_UP.load(Ordering::Acquire) == 0 {
        let found = look_up().map_or(ABSENT, |p| p as usize);
        LOOKED_UP.store(found, Ordering::Release);
    }
    preload_if_known()
}

/// [`preload`] as far as already looked up: never calls anything.
pub(crate) fn preload_if_known() -> Option<&'static Entries> {
    match LOOKED_UP.load(core::sync::atomic::Ordering::Acquire) {
        0 | ABSENT => None,
        // SAFETY: the exported table of the loaded preload, which is never unloaded.
        p => Some(unsafe { &*(p as *const Entries) }),
    }
}

fn look_up() -> Option<*mut Entries> {
    // SAFETY: dlsym with a NUL-terminated name (null when absent, as in a static binary).
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr()) } as *mut Entries;
    // A build with the preload's features too finds its own table: that is not a preload.
    #[cfg(feature = "tracer")]
    let p = match core::ptr::eq(p, preload_table()) {
        true => core::ptr::null_mut(),
        false => p,
    };
    // SAFETY: the exported table of a loaded library, which starts with its version.
    (!p.is_null() && unsafe { (*p).version } == VERSION).then_some(p)
}

/// This build's own table (a build with both the preload's and the wrapper's features).
#[cfg(feature = "tracer")]
fn preload_table() -> *const Entries {
    &preload::mem_trace_preload_entries
}

#[cfg(feature = "tracer")]
mod preload {
    use super::{Entries, Start, Taken, VERSION};
    use super::{PeaksC, ThreadPeakC};
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
        start,
        print_trace,
        reset_peaks: Some(reset_peaks),
        report_to: Some(report_to),
        peaks: Some(peaks),
    };

    unsafe extern "C" fn start(start: *const Start) {
        if let Some(g) = Guard::enter() {
            // SAFETY: null or the wrapper's own `Start`.
            let regs = unsafe { start.as_ref() }.map(|s| (s.pc, s.sp, s.bp));
            record::set_start(&g, regs);
        }
    }

    /// `print_trace` from this library's own tables, what a wrapper asks the table for. (The
    /// exported `crate::print_trace` answers the same here: it asks on only a preload it has
    /// looked up, and the preload looks up none; only a wrapper's copy does.)
    extern "C" fn print_trace(addr: usize) {
        crate::print::print_trace(addr)
    }

    /// The reset of this library's own peaks, as [`print_trace`] (`mem_trace_reset_peaks`).
    extern "C" fn reset_peaks() {
        mem_trace_core::profile::peaks::reset()
    }

    extern "C" fn report_to(fd: i32) {
        mem_trace_core::profile::report_to(fd)
    }

    unsafe extern "C" fn peaks(out: *mut PeaksC, threads: *mut ThreadPeakC, cap: usize) -> usize {
        let p = crate::own_peaks::own_peaks();
        // SAFETY: the caller passes its own `PeaksC`.
        unsafe {
            out.write(PeaksC {
                global: p.global,
                live: p.live,
            })
        };
        for (i, t) in p.threads.iter().take(cap).enumerate() {
            let mut name = [0u8; 16];
            let n = t.name.len().min(15);
            name[..n].copy_from_slice(&t.name.as_bytes()[..n]);
            let c = ThreadPeakC {
                tid: t.tid,
                exited: t.exited.into(),
                peak: t.peak,
                live: t.live,
                name,
            };
            // SAFETY: the caller passes room for `cap` entries.
            unsafe { threads.add(i).write(c) };
        }
        p.threads.len()
    }

    unsafe extern "C" fn allocated(p: *mut c_void, size: usize, start: Start) {
        if let Some(g) = Guard::enter() {
            let _start = record::start_at(&g, (start.pc, start.sp, start.bp));
            record::allocated(&g, p, size);
        }
    }

    unsafe extern "C" fn free(p: *mut c_void, start: Start) -> bool {
        match Guard::enter() {
            Some(g) => {
                let _start = record::start_at(&g, (start.pc, start.sp, start.bp));
                record::free_unheld(&g, p) != Disposition::Reject
            }
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
        start: Start,
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
            let _start = record::start_at(&g, (start.pc, start.sp, start.bp));
            record::reallocated(&g, old, p, q, size);
        }
    }
}
