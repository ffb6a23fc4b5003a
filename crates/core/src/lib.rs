//! # mem-trace-core: what runs inside the traced process
//!
//! The machinery that the preload library (`libmem_trace.so`, the root package) wraps around
//! the malloc family: the data flows down this list.
//!
//! 1. [`guard`]: the per-thread reentrancy flag, so the tracer's own allocations, and glibc's
//!    nested calls, pass straight through; [`state`]: everything else a thread keeps, one part
//!    per module that owns it.
//! 2. [`capture`]: the stack, as return addresses only (CFI rules cached per thread, reuse of
//!    earlier walks, a frame-pointer walk, framehop as the fallback), within the thread's
//!    stack bounds.
//! 3. [`store`]: the tables a reader finds from the exported header — live blocks by address,
//!    interned stacks, threads, the freed-block history — and the quarantine of freed blocks.
//! 4. [`record`]: what an allocation or a free does with 2 and 3; the tracer's life cycle;
//!    with `MEM_TRACE_SAMPLE`, only the blocks `sample` picks.
//! 5. [`report`]: double and invalid frees on stderr, stacks symbolized in process.
//!
//! Beside the path: [`arena`], the tracer's own memory (anonymous `mmap`, called explicitly by
//! the stores, never the program's heap); [`config`], the `MEM_TRACE_*` variables; [`real`],
//! the allocator underneath, behind a trait; [`maps`] and [`glibc_heap`], what a pointer no
//! block holds points at.
//!
//! This crate is an rlib with no `#[global_allocator]` and no exported symbol. Whoever links it
//! defines the exported header with [`define_header!`]: the preload library does, and so will
//! a Rust program that wraps its own allocator. The crates it calls that take no allocator
//! parameter (framehop's module list and cache, gimli's unwind context) allocate through the
//! global allocator, which in the preload is [`arena::Arena`].

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod arena;
pub mod capture;
mod clock;
pub mod config;
pub mod glibc_heap;
pub mod guard;
pub mod maps;
mod narrow;
pub mod out;
mod prefetch;
pub mod profile;
pub mod real;
pub mod record;
pub mod report;
pub mod sample;
pub mod state;
pub mod store;
mod sync;

/// Re-exported so that [`define_header!`] names it from the defining crate.
pub use mem_trace_format as format;

/// The sampling rate as every reader says it ("one allocation per ~512 KiB"), written without
/// allocating: `print_trace` writes it.
pub fn format_rate(mean: u64) -> impl core::fmt::Display {
    mem_trace_read::sample::Rate(mean)
}

/// Defines `MEM_TRACE_HEADER`, the exported root of every table (docs/LAYOUT.md), in the crate
/// that links this one into a program or library. `#[no_mangle]` keeps it in the dynamic symbol
/// table, so a reader finds it even in a stripped `.so`; `#[used]` keeps the linker from
/// dropping it. This crate refers to it by name (see `store::header`); its value is
/// `store::initial`'s.
#[macro_export]
macro_rules! define_header {
    () => {
        /// The root of mem-trace's tables, read by gdb and other readers (docs/LAYOUT.md).
        #[no_mangle]
        #[used]
        pub static MEM_TRACE_HEADER: $crate::format::Header = $crate::store::initial::value();
    };
}

#[cfg(test)]
define_header!();
