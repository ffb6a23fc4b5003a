//! The thread table: a small record per thread that ever allocated, so that an answer can say
//! "allocated by thread 3 (tid 4242, "worker")" long after the thread is gone.
//! Exported through `MEM_TRACE_HEADER` (docs/LAYOUT.md "Thread table").

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

const CHUNK_BITS: u32 = 12;
const CHUNKS: usize = 4096;
/// Thread indexes are 24 bits wide in a slot.
const MAX_INDEX: u64 = (1 << 24) - 1;

/// One thread (32 bytes).
#[repr(C)]
pub struct ThreadRecord {
    pub tid: AtomicU32,
    pub flags: AtomicU32,
    pub name: [u8; 16],
    pub reserved: u64,
}

/// Record flag: the thread has exited.
pub const EXITED: u32 = 1;

/// The exported thread table.
#[repr(C)]
pub struct ThreadTable {
    pub count: AtomicU64,
    pub chunk_bits: u32,
    pub chunks: u32,
    pub dir: [AtomicPtr<ThreadRecord>; CHUNKS],
}

/// The one thread table.
pub static THREADS: ThreadTable = ThreadTable {
    count: AtomicU64::new(0),
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};

fn record(index: u32) -> Option<*mut ThreadRecord> {
    let k = (index >> CHUNK_BITS) as usize;
    let slot = THREADS.dir.get(k)?;
    let mut chunk = slot.load(Ordering::Acquire);
    if chunk.is_null() {
        let layout = std::alloc::Layout::array::<ThreadRecord>(1 << CHUNK_BITS).ok()?;
        // SAFETY: non-zero layout; zeroed records mean "not written yet"; never freed.
        let fresh = unsafe { std::alloc::alloc_zeroed(layout) } as *mut ThreadRecord;
        if fresh.is_null() {
            return None;
        }
        match slot.compare_exchange(
            core::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => chunk = fresh,
            Err(existing) => {
                // SAFETY: ours, never published.
                unsafe { std::alloc::dealloc(fresh.cast(), layout) };
                chunk = existing;
            }
        }
    }
    // SAFETY: the index is masked into the chunk.
    Some(unsafe { chunk.add((index & ((1 << CHUNK_BITS) - 1)) as usize) })
}

/// Gives the calling thread a new index and fills its record (kernel tid and name).
/// Returns 0 if the table is full or out of memory.
pub fn register_current() -> u32 {
    let index = THREADS.count.fetch_add(1, Ordering::Relaxed) + 1;
    if index > MAX_INDEX {
        return 0;
    }
    let Some(rec) = record(index as u32) else {
        return 0;
    };
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
pub fn mark_exited(index: u32) {
    if index == 0 {
        return;
    }
    if let Some(rec) = record(index) {
        // SAFETY: records are never freed.
        unsafe { (*rec).flags.fetch_or(EXITED, Ordering::Relaxed) };
    }
}

/// The kernel tid recorded for `index` (0 if unknown).
pub fn tid_of(index: u32) -> u32 {
    if index == 0 || u64::from(index) > THREADS.count.load(Ordering::Relaxed) {
        return 0;
    }
    let chunk = THREADS.dir[(index >> CHUNK_BITS) as usize].load(Ordering::Acquire);
    if chunk.is_null() {
        return 0;
    }
    // SAFETY: masked index into a published chunk.
    unsafe {
        (*chunk.add((index & ((1 << CHUNK_BITS) - 1)) as usize))
            .tid
            .load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registering_records_tid() {
        let i = register_current();
        assert!(i >= 1);
        // SAFETY: gettid has no preconditions.
        assert_eq!(tid_of(i), unsafe { libc::gettid() } as u32);
        let j = std::thread::spawn(register_current).join().unwrap();
        assert_ne!(i, j);
        mark_exited(j);
    }
}
