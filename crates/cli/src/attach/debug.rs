//! `MEM_TRACE_ATTACH_DEBUG`: what the attach saw, a line at a time on stderr. The bottom of
//! `attach`'s layers (ptrace, the calls over it, the attach's steps over those), which all
//! write to it.

/// A line on stderr when `MEM_TRACE_ATTACH_DEBUG` is set: what the injector saw.
pub fn debug(what: std::fmt::Arguments) {
    if debugging() {
        eprintln!("mem-trace attach: {what}");
    }
}

/// Whether `MEM_TRACE_ATTACH_DEBUG` is set.
pub fn debugging() -> bool {
    std::env::var_os("MEM_TRACE_ATTACH_DEBUG").is_some()
}
