//! # mem-trace-read: reading the tables from outside the writer
//!
//! Everything that turns mem-trace's raw tables into answers, with no part in recording:
//! - [`memory`]: where the bytes come from — this process, or another one read with
//!   `process_vm_readv` without stopping it;
//! - [`layout`]: the decoder of `docs/LAYOUT.md` over a memory source, built on the types of
//!   `mem-trace-format`: the one decoder of every reader (the `mem-trace` command, and gdb's
//!   commands through `crates/gdb`);
//! - [`profile`]: the profiler's counters, peaks and per-thread numbers, summed as the
//!   contract says;
//! - [`target`]: a running process or a core file: its memory, modules, mappings, threads
//!   and header;
//! - [`symbolize`]: return addresses → functions, inlined frames and `file:line`, from the ELF
//!   files and their DWARF (separate debug files too), taking no lock;
//! - [`text`]: the frame lines every report prints;
//! - [`deferred`]: reports written with return addresses only (under `mem-trace run`),
//!   symbolized afterwards outside the process;
//! - [`answer`]: the answers of the gdb commands, line for line, from outside the process;
//! - [`leaks`]: the leak check's classification, shared by the profiler's exit report and
//!   the command, and the roots of a target read from outside.
//!
//! It allocates through the global allocator of whatever links it: inside the preload library
//! that is the tracer's arena (in its lock-free scratch mode while `print_trace` runs), in a
//! command-line reader the system's.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The layout's types and constants, for callers that locate a table's fields themselves
/// (tests that scribble over them).
pub use mem_trace_format as format;

pub mod addr_map;
pub mod answer;
pub mod deferred;
pub mod exp;
pub mod layout;
pub mod leaks;
pub mod memory;
pub mod profile;
pub mod sample;
pub mod suppress;
pub mod symbolize;
pub mod target;
pub mod text;
pub mod units;

#[cfg(test)]
mod test_image;
