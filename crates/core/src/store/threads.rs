//! The thread table: a small record per thread that ever allocated, so that an answer can say
//! "allocated by thread 3 (tid 4242, "worker")" long after the thread is gone.
//! Exported through `MEM_TRACE_HEADER` (docs/LAYOUT.md "Thread table").

use crate::arena;
use core::cell::Cell;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use mem_trace_format::{
    ThreadRecord, ThreadTable, MAX_THREAD_INDEX as MAX_INDEX, THREAD_CHUNKS as CHUNKS,
    THREAD_CHUNK_BITS as CHUNK_BITS, THREAD_EXITED as EXITED,
};

/// The one thread table.
pub static THREADS: ThreadTable = ThreadTable {
    count: AtomicU64::new(0),
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};

/// The thread table's per-thread part of `state::ThreadState`.
pub struct Local {
    /// Thread index in the exported thread table; 0 until the thread first records a block.
    pub index: Cell<u32>,
    /// The record of `index` (null while unregistered).
    rec: Cell<*const ThreadRecord>,
}

impl Local {
    /// A thread not registered yet.
    pub const fn new() -> Self {
        Local {
            index: Cell::new(0),
            rec: Cell::new(core::ptr::null()),
        }
    }

    /// This thread's record, once registered.
    #[inline(always)]
    pub fn record(&self) -> Option<&'static ThreadRecord> {
        // SAFETY: null or a record in a chunk that is never freed.
        unsafe { self.rec.get().as_ref() }
    }

    /// Forgets the registration (the child side of `fork`: a new kernel thread).
    pub(crate) fn forget(&self) {
        self.index.set(0);
        self.rec.set(core::ptr::null());
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}

fn record(index: u32) -> Option<*mut ThreadRecord> {
    let k = (index >> CHUNK_BITS) as usize;
    let slot = THREADS.dir.get(k)?;
    // Zeroed records mean "not written yet".
    let chunk = arena::chunk(slot, 1 << CHUNK_BITS)?;
    // SAFETY: the index is masked into the chunk.
    Some(unsafe { chunk.add((index & ((1 << CHUNK_BITS) - 1)) as usize) })
}

/// Gives the calling thread a new index and fills its record (kernel tid and name), noting
/// both in `local`. Returns the index, 0 if the table is full or out of memory.
pub fn register_current(local: &Local) -> u32 {
    let index = THREADS.count.fetch_add(1, Ordering::Relaxed) + 1;
    if index > MAX_INDEX {
        return 0;
    }
    let Some(rec) = record(index as u32) else {
        return 0;
    };
    local.index.set(index as u32);
    local.rec.set(rec);
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    // SAFETY: `rec` is this index's record; only this thread writes it.
    unsafe {
        (*rec).name = name;
        (*rec).tid.store(tid, Ordering::Release);
    }
    index as u32
}

/// Marks a thread as exited.
pub(crate) fn mark_exited(index: u32) {
    if index == 0 {
        return;
    }
    if let Some(rec) = record(index) {
        // SAFETY: records are never freed.
        unsafe { (*rec).flags.fetch_or(EXITED, Ordering::Relaxed) };
    }
}

/// The record of thread `index`, if it was handed out (never allocates).
pub fn get(index: u32) -> Option<&'static ThreadRecord> {
    if index == 0 || u64::from(index) > THREADS.count.load(Ordering::Relaxed) {
        return None;
    }
    arena::entry(&THREADS.dir, index, CHUNK_BITS)
}

/// Calls `f` on every record handed out so far.
pub fn for_each(mut f: impl FnMut(&'static ThreadRecord)) {
    let count = THREADS.count.load(Ordering::Acquire).min(MAX_INDEX);
    for i in 1..=count as u32 {
        if let Some(t) = get(i) {
            f(t);
        }
    }
}

/// The kernel tid recorded for `index` (0 if unknown).
pub fn tid_of(index: u32) -> u32 {
    get(index).map_or(0, |t| t.tid.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registering_records_tid() {
        let i = register_current(&Local::new());
        assert!(i >= 1);
        // SAFETY: gettid has no preconditions.
        assert_eq!(tid_of(i), unsafe { libc::gettid() } as u32);
        let j = std::thread::spawn(|| register_current(&Local::new()))
            .join()
            .unwrap();
        assert_ne!(i, j);
        mark_exited(j);
    }
}
