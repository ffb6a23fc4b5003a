//! What a walk produces and how frames are recorded: the pieces every walker shares.

use super::modules::ModuleSet;

/// What a walk found.
#[derive(Default)]
pub(super) struct Walk {
    pub(super) frames: usize,
    /// It stopped at an address outside every known module.
    pub(super) outside: bool,
    /// The frames' stack id, when known from a kept walk (then not written).
    pub(super) id: u32,
    /// The call-tree node of the whole walk (its first recorded frame's), when named; 0
    /// otherwise.
    pub(super) node: u32,
}

/// How to walk: which frames to keep, by which method, and whether a known stack id may
/// stand for the frames.
#[derive(Clone, Copy)]
pub(super) struct How {
    pub(super) own: Own,
    /// Follow the rbp chain past the tracer's own frames (`MEM_TRACE_UNWIND=fp`).
    pub(super) fp: bool,
    /// Return the stack id a kept walk knows instead of writing the frames.
    pub(super) want_id: bool,
    /// The first pc is a return address (a hook's caller, see `start_at_return`), whose
    /// rule is that of the call before it; else the instruction executing there.
    pub(super) at_return: bool,
    /// What the capture already knows of the kept walk for its stack.
    pub(super) kept: Looked,
}

/// Whether the kept walk for a capture's stack was looked up before the walk began (by
/// `capture_interned`'s repeat of a kept walk), and what was found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Looked {
    /// Not looked up: the walk looks.
    Not,
    /// None to take over: none is kept, or its flat check failed.
    Missing,
    /// Kept walk `k` matches the stack's key, and could not be repeated by its flat checks
    /// alone: the walk takes it over step by step.
    At(usize),
}

/// What to do with mem-trace's own frames.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Own {
    /// Skip the leading ones; stop at the next (our thread-start trampoline: beyond it lie
    /// `start_thread` and `clone`). `entry`, when not 0, is the pc where an allocator wrapper
    /// linked into the program read the registers the walk starts from: that frame is the
    /// wrapper's (or the `#[global_allocator]` shim it is inlined into), in the program's own
    /// module, so it is told by its pc rather than by module. A return address never equals
    /// it (it follows no call), so only a walk's first step can be skipped for it.
    Skip { entry: u64 },
    /// Keep them (unit tests, where the test binary is "our own code").
    #[cfg_attr(not(test), allow(dead_code))]
    Keep,
}

/// Counts `pc` as frame `*n`, written to `out` if it has room, unless it is one of our own
/// frames; `false` when the walk must stop (our trampoline is reached). A walk goes on past
/// a full buffer: the frames it does not write still name the stack in the call tree, where
/// a later, shallower capture takes them over.
#[inline(always)]
pub(super) fn record(set: &ModuleSet, own: Own, pc: u64, out: &mut [u64], n: &mut usize) -> bool {
    if let Own::Skip { entry } = own {
        if set.is_own(pc) || pc == entry {
            return *n == 0;
        }
    }
    if let Some(o) = out.get_mut(*n) {
        *o = pc;
    }
    *n += 1;
    true
}
