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
//! ## How the pieces fit (the data flows down)
//! - [`hooks`]: the exported `malloc` family; each calls glibc, then [`record`].
//! - [`guard`]: the per-thread reentrancy flag that lets nested calls pass through.
//! - [`unwind`] + [`modules`]: CFI stack capture, instruction pointers only.
//! - [`stacks`]: interned stacks; [`table`]: live blocks by address; [`threads`]: who is who;
//!   [`freed`]: the history of frees; [`quarantine`]: freed blocks held back from reuse;
//!   [`report`]: double and invalid frees.
//! - [`layout`]: `MEM_TRACE_HEADER`, the exported root of those tables (docs/LAYOUT.md).
//! - readers: [`print`](mod@print) (in-process `print_trace`, with [`symbolize`]), and the gdb package in
//!   `python/`, embedded in the `.so` by `gdb_script`.
//! - [`arena`]: the tracer's own memory, never glibc's heap; [`config`]: `MEM_TRACE_*`.
//!
//! Blocks allocated before the library is initialised are not recorded, and freeing them is
//! harmless; initialisation happens at the first hooked call, before `main`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod arena;
pub mod config;
pub mod freed;
mod gdb_script;
pub mod guard;
#[cfg(feature = "tracer")]
pub mod hooks;
pub mod layout;
pub mod modules;
pub mod prefetch;
pub mod print;
pub mod quarantine;
pub mod real;
pub mod record;
pub mod report;
pub mod stacks;
pub mod symbolize;
pub mod sync;
pub mod table;
pub mod threads;
pub mod unwind;

/// The tracer's own allocations come from anonymous mappings, never from the hooked `malloc`.
#[global_allocator]
static ALLOCATOR: arena::Arena = arena::Arena;

/// Prints the block containing `addr` — size, offset, thread, and the allocation stack with
/// function names and `file:line` — to the process's standard error. Safe to call from gdb
/// at any stop: it never waits on a lock and never allocates from the program's heap.
///
/// Kept a one-line wrapper: a body with closures or nested items makes rustc emit a debug-info
/// namespace of the same name, and gdb then fails to call it (DESIGN.md, fact 2).
#[no_mangle]
pub extern "C" fn print_trace(addr: usize) {
    print::print_trace(addr)
}

#[cfg(all(feature = "tracer", not(test)))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = record::on_load;

#[cfg(all(feature = "tracer", not(test)))]
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = record::on_unload;
