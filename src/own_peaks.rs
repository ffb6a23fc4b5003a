//! The profiler's peaks as numbers ([`Peaks`]), and those of this copy of the tracer's tables
//! ([`own_peaks`]). A leaf that both ask for: the profile API (`profile`, which asks the
//! preload's entries when the preload holds the tables) and the preload's entries (`entries`,
//! which answer from their own tables).

use mem_trace_core::store::header::header;
use mem_trace_core::store::threads;
use std::sync::atomic::Ordering::Relaxed;

/// Live bytes and their high-water marks since start or the last
/// [`reset_peaks`](crate::reset_peaks), counted by the profiler on every allocation and free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peaks {
    /// The highest live bytes of the whole process.
    pub global: u64,
    /// The live bytes now.
    pub live: u64,
    /// Every thread that allocated, in the order they first did.
    pub threads: Vec<ThreadPeak>,
}

/// One thread's share of [`Peaks`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadPeak {
    /// Kernel thread id.
    pub tid: u32,
    /// The thread's name when it first allocated.
    pub name: String,
    /// The highest live bytes of the blocks this thread allocated.
    pub peak: u64,
    /// The live bytes of the blocks it allocated (wherever they were freed).
    pub live: u64,
    /// Whether the thread has exited.
    pub exited: bool,
}

/// The peaks in this copy of the tracer's tables.
pub(crate) fn own_peaks() -> Peaks {
    let h = header();
    let mut threads = Vec::new();
    threads::for_each(|t| {
        let name = t.name.split(|&b| b == 0).next().unwrap_or_default();
        threads.push(ThreadPeak {
            tid: t.tid.load(Relaxed),
            name: String::from_utf8_lossy(name).into_owned(),
            peak: t.peak_bytes.load(Relaxed),
            live: t.live_bytes(),
            exited: t.flags.load(Relaxed) & mem_trace_core::format::THREAD_EXITED != 0,
        })
    });
    Peaks {
        global: h.peak_bytes.load(Relaxed),
        live: live(h.live_bytes.load(Relaxed)),
        threads,
    }
}

/// A live count read while a free races its allocation may be negative for an instant.
fn live(bytes: u64) -> u64 {
    if (bytes as i64) < 0 {
        0
    } else {
        bytes
    }
}
