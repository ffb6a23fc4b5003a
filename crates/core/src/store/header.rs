//! `MEM_TRACE_HEADER`: the one exported static from which a reader outside the process (the
//! gdb commands, live or on a core file; the `mem-trace` command) finds every table without
//! calling any code.
//!
//! Its type and byte layout are `mem-trace-format`'s (docs/LAYOUT.md). The static itself is
//! defined by the crate that links this one ([`crate::define_header!`], from
//! [`super::initial::value`]), so that this rlib exports no symbol; the tracer reaches it by
//! name. A leaf: every table and counter that writes to the header imports this module, and
//! the header's value, which points at them, is in `initial`, which none imports.

use mem_trace_format::Header;

extern "Rust" {
    /// Defined by [`crate::define_header!`] in the crate that links this one.
    static MEM_TRACE_HEADER: Header;
}

/// The exported header.
#[inline(always)]
pub fn header() -> &'static Header {
    // SAFETY: `define_header!` defines the static with this type in whatever links this crate
    // (a missing definition fails to link); it lives for the whole program and is only ever
    // changed through its atomics.
    unsafe { &MEM_TRACE_HEADER }
}
