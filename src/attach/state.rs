//! How this library came into the process ([`MEM_TRACE_ATTACH_STATE`]), and the questions
//! the rest of the library asks of it: the allocator's choice, the constructor and destructor,
//! the `dlopen` hook. A leaf: `attach` moves the state, everyone else only reads it.

use core::sync::atomic::{AtomicU32, Ordering};

/// How this library came into the process, for `mem-trace attach` and `detach` to read
/// before they act: [`PRELOADED`] (also when linked into the program), [`LOADED`],
/// [`ATTACHED`] or [`DETACHED`]. Exported under this name; the command reads it from the
/// process's memory.
#[no_mangle]
#[used]
pub static MEM_TRACE_ATTACH_STATE: AtomicU32 = AtomicU32::new(PRELOADED);

/// Preloaded, or linked: the hooks won symbol lookup, there is nothing to attach.
pub const PRELOADED: u32 = 0;
/// Loaded into a running process by `dlopen` (`mem-trace attach`), not attached yet.
pub const LOADED: u32 = 1;
/// Attached: the GOT entries point at the hooks.
pub const ATTACHED: u32 = 2;
/// Detached: the GOT entries are back, the hooks pass blocks straight to glibc.
pub const DETACHED: u32 = 3;

/// Whether the tracer was attached to this process and is not detached.
pub(crate) fn attached() -> bool {
    MEM_TRACE_ATTACH_STATE.load(Ordering::Acquire) == ATTACHED
}

/// Whether the library was `dlopen`ed by `mem-trace attach` (whether attached now or not).
pub(crate) fn loaded_late() -> bool {
    MEM_TRACE_ATTACH_STATE.load(Ordering::Acquire) != PRELOADED
}

/// Whether the tracer runs in this process: preloaded, or attached now.
pub(crate) fn tracing() -> bool {
    matches!(
        MEM_TRACE_ATTACH_STATE.load(Ordering::Acquire),
        PRELOADED | ATTACHED
    )
}
