//! # mem-trace
//!
//! A heap tracer loaded into an unmodified program with `LD_PRELOAD`. It records, for every
//! live heap block, its size, the thread and the stack that allocated it, and a global sequence
//! number, in tables that a debugger can read without running any code in the process — live,
//! or from a core dump. In gdb:
//!
//! ```text
//! (gdb) call mem_trace::print_trace(p)      # in-process, prints to the program's stderr
//! (gdb) mtrace-why p                        # gdb/mem_trace.py, reads memory only
//! ```
//!
//! This crate is the preload library itself, `libmem_trace.so`: what must live in the object
//! that is preloaded. The machinery is in the workspace's crates (docs/ARCHITECTURE.md):
//! - `hooks`: the exported malloc family, `pthread_create` and `dlclose`; each calls glibc
//!   ([`glibc`]) and hands the block to `mem_trace_core::record`;
//! - [`print_trace`] (`print`): the in-process answer gdb calls;
//! - the exported header `MEM_TRACE_HEADER` (docs/LAYOUT.md), defined here from
//!   `mem_trace_core`'s tables;
//! - the `#[global_allocator]`: the tracer's arena, so nothing the tracer allocates comes from
//!   the program's heap;
//! - `gdb_script`: the gdb commands, embedded for auto-loading.
//!
//! Two packages build this source. crates/preload (`mem-trace-preload`) builds it with
//! feature `tracer` as `libmem_trace.so`, the preload: the hooks, the global allocator and the
//! ELF constructor. The root package `mem-trace` builds it without them, for Rust programs:
//! feature `global-alloc` gives [`Traced`], a `GlobalAlloc` wrapper that records into the same
//! tables from inside the program, which then defines its own `MEM_TRACE_HEADER`. The
//! per-stack counters are in every build; feature `profiler` only turns the reports on by
//! default (`MEM_TRACE_PROFILE`). Blocks allocated before the library is initialised are not
//! recorded, and freeing them is harmless; initialisation happens at the first hooked call,
//! before `main`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "tracer")]
pub mod allocator;
#[cfg(feature = "tracer")]
mod attach;
#[cfg(feature = "tracer")]
mod dl;
mod entries;
mod gdb_script;
#[cfg(feature = "tracer")]
mod hooks;
#[cfg(feature = "tracer")]
mod next;
mod own_peaks;
mod profile;
#[cfg(feature = "global-alloc")]
mod traced;

pub use own_peaks::{Peaks, ThreadPeak};
pub use profile::{peaks, report, report_to_file, reset_peaks};
#[cfg(feature = "global-alloc")]
pub use traced::Traced;
// Not named `print_trace`: a module of the same name as the exported function is a debug-info
// namespace that stops gdb from calling it (see `print_trace` below).
mod print;

mem_trace_core::define_header!();

/// The preload's header, under a name only the preload exports. A Rust program that links
/// the `Traced` wrapper defines a `MEM_TRACE_HEADER` of its own, which it leaves
/// uninitialised under the preload; debuggers resolve that name to the executable's, and find
/// the preload's tables through this pointer (docs/LAYOUT.md, "Finding the header").
#[cfg(feature = "tracer")]
#[no_mangle]
#[used]
pub static MEM_TRACE_PRELOAD_HEADER: &mem_trace_core::format::Header = &MEM_TRACE_HEADER;

/// The tracer's own allocations come from anonymous mappings, never from the hooked `malloc`.
#[cfg(feature = "tracer")]
#[global_allocator]
static ALLOCATOR: mem_trace_core::arena::Arena = mem_trace_core::arena::Arena;

/// Prints the block containing `addr` — size, offset, thread, and the allocation stack with
/// function names and `file:line` — to the process's standard error. Safe to call from gdb
/// at any stop: it never waits on a lock and never allocates from the program's heap.
///
/// Defined at the crate root, a one-line wrapper: gdb resolves `mem_trace::print_trace` by its
/// debug-info path, and a body with closures or nested items makes rustc emit a debug-info
/// namespace of the same name, after which gdb fails to call it (docs/FINDINGS.md, "gdb
/// calling an exported function").
///
/// In a program that links the `Traced` wrapper and runs under the preload, the preload's
/// tables are the process's, and its `print_trace` answers.
#[no_mangle]
pub extern "C" fn print_trace(addr: usize) {
    if let Some(e) = entries::preload_if_known() {
        return (e.print_trace)(addr);
    }
    print::print_trace(addr)
}

/// Starts a new phase of the program: every peak (global, per thread, and the stacks held at
/// the global peak) becomes what is live now, so the next report's peaks are the new phase's
/// own. For C programs through `dlsym(RTLD_DEFAULT, "mem_trace_reset_peaks")`, and from gdb
/// with `call mem_trace_reset_peaks()`: it never waits on a lock and never allocates.
#[no_mangle]
pub extern "C" fn mem_trace_reset_peaks() {
    profile::reset_peaks_known()
}

/// Keeps `print_trace` in a program that links the `Traced` wrapper, for gdb to call: nothing
/// else refers to it, and the linker drops what nothing refers to.
#[cfg(feature = "global-alloc")]
#[used]
static PRINT_TRACE: extern "C" fn(usize) = print_trace;

/// Initialises before `main` even if nothing allocated yet, and registers the fork handlers.
#[cfg(all(feature = "tracer", not(test)))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Prints the statistics line at exit, when asked for.
#[cfg(all(feature = "tracer", not(test)))]
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

#[cfg(all(feature = "tracer", not(test)))]
extern "C" fn on_load() {
    // `dlopen`ed by `mem-trace attach` into a running process: nothing to do until it calls
    // `mem_trace_attach` with its settings (initialising now would read the program's
    // environment, and record nothing: no module calls the hooks yet).
    if attach::loaded_by_dlopen() {
        return;
    }
    allocator::ensure_chosen();
    mem_trace_core::record::on_load()
}

#[cfg(all(feature = "tracer", not(test)))]
extern "C" fn on_unload() {
    // Loaded but never attached, or detached: nothing of the process's was recorded since.
    if attach::tracing() {
        mem_trace_core::record::on_unload()
    }
}
