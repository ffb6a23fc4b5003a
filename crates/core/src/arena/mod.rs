//! The tracer's own allocator.
//!
//! Everything the tracer allocates (tables, interned stacks, the unwinder's module list) comes
//! from anonymous `mmap`, never from the hooked `malloc` nor from glibc's heap. Two reasons:
//! a hook that called `malloc` would recurse into itself, and a thread that gdb stopped inside
//! glibc's allocator holds an arena lock that would block the tracer (docs/FINDINGS.md,
//! "Calling into a stopped process").
//!
//! The stores call it explicitly ([`allocate`], [`allocate_zeroed`], [`release`], or
//! [`Arena`] as an `allocator_api2` allocator for boxes, vectors and hash tables), so they do
//! not depend on which global allocator the program that links them chose. The preload
//! library also makes [`Arena`] its `#[global_allocator]`, for everything else Rust code in it
//! allocates (symbolizing, the crates that take no allocator parameter).
//! Anonymous private mappings are also what a default core dump keeps, so the gdb reader finds
//! the tables in a core.
//!
//! Layout of the algorithm:
//! - requests up to 4 KiB go to one of 16 size classes (powers of two and their 1.5x
//!   midpoints), each a free list plus a bump pointer into 64 KiB chunks, behind a spin lock;
//! - larger requests, or alignments above a page, are their own `mmap`;
//! - while a thread runs `print_trace` (see [`ScratchScope`]) its requests come from a scratch
//!   region instead, a bump allocator that takes no lock at all and is emptied when
//!   `print_trace` returns; frees into it are no-ops. That keeps `print_trace` from waiting on
//!   a class lock held by a thread gdb has stopped.
//!
//! Out of memory (a mapping refused, e.g. under `ulimit -v`): the explicit calls return null
//! and their callers do without (a block left untracked, a free not held back). The first
//! refusal also calls the function registered with [`when_short`], once: the tracer stops
//! recording (`record`), so that it stops asking. Requests through the global allocator cannot
//! fail gracefully (Rust aborts the program when they return null, and the crates that make
//! them — framehop, gimli — cannot be told otherwise), so those that the arena cannot serve
//! come from a small reserve mapped at start-up ([`keep_reserve`]): enough for the captures
//! in flight when memory ran out to finish.

mod pages;
use pages::anonymous;

use crate::sync::SpinLock;
use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

const PAGE: usize = 4096;
/// Chunk size of the small classes. Every class a program touches maps at least one chunk; a
/// 1 MiB chunk cost ~20 MiB of mostly idle mappings.
fn chunk_len(_class_size: usize) -> usize {
    64 << 10
}
/// Larger requests get their own mapping, returned to the kernel on free. Kept at a page so
/// that the slot arrays a growing table leaves behind do not pile up on class free lists
/// (measured: ~7 MB retained at 1M live blocks with a 32 KiB bound).
const SMALL_MAX: usize = 4 << 10;

/// Block sizes of the small classes. Powers of two give naturally aligned blocks (a chunk is
/// page-aligned and carved from its start), which is how alignments up to a page are served.
const CLASSES: [usize; 16] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];

/// Bytes the tracer has mapped for itself (chunks and large blocks), for `MEM_TRACE_STATS`.
pub(crate) static MAPPED: AtomicUsize = AtomicUsize::new(0);
/// The highest value [`MAPPED`] has reached.
pub(crate) static PEAK_MAPPED: AtomicUsize = AtomicUsize::new(0);
/// [`MAPPED`] when the program's live bytes last reached a new peak (`MEM_TRACE_STATS` only):
/// the tracer's memory beside the program's most, where [`PEAK_MAPPED`] may come from later
/// (the freed-block history and the quarantine are made at the first free).
pub(crate) static MAPPED_AT_PEAK: AtomicUsize = AtomicUsize::new(0);

struct Class {
    /// Head of the free list (a block's first word links to the next), as an address.
    free: usize,
    /// Next unused byte of the current chunk, and its end.
    bump: usize,
    end: usize,
}

static CLASS_STATE: [SpinLock<Class>; CLASSES.len()] = [const {
    SpinLock::new(Class {
        free: 0,
        bump: 0,
        end: 0,
    })
}; CLASSES.len()];

/// The arena as a type: an `allocator_api2` allocator for the stores' collections, and the
/// preload library's global allocator (which also serves [`ScratchScope`]s).
#[derive(Clone, Copy, Debug, Default)]
pub struct Arena;

fn class_for(layout: Layout) -> Option<usize> {
    let size = layout.size().max(1);
    let align = layout.align();
    if align > PAGE || size > SMALL_MAX {
        return None;
    }
    if align <= 16 {
        return CLASSES.iter().position(|&c| c >= size);
    }
    let want = size.max(align).next_power_of_two();
    CLASSES.iter().position(|&c| c == want)
}

fn note_mapped(bytes: usize) {
    let now = MAPPED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_MAPPED.fetch_max(now, Ordering::Relaxed);
}

/// What to call the first time a mapping is refused (see the module documentation), as a
/// `fn()` address; 0 until [`when_short`] sets it.
static ON_SHORT: AtomicUsize = AtomicUsize::new(0);
/// Set once a mapping was refused.
static SHORT: AtomicBool = AtomicBool::new(false);

/// Registers what to do, once, when the arena first fails to map memory. It is called from
/// inside the failing allocation, possibly with a class lock or a store's lock held: it must
/// neither allocate from the arena nor take the tracer's locks.
pub(crate) fn when_short(f: fn()) {
    ON_SHORT.store(f as usize, Ordering::Relaxed);
}

#[cold]
#[inline(never)]
fn short() {
    // A refusal before anyone registered (the tracer starting) is nobody's to act on.
    let f = ON_SHORT.load(Ordering::Relaxed);
    if f == 0 || SHORT.swap(true, Ordering::Relaxed) {
        return;
    }
    // SAFETY: only `when_short` stores it, from a `fn()`.
    let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
    f();
}

/// [`anonymous`](pages::anonymous) memory marked as the arena's (`owns`); `None` on failure, when nothing is
/// left mapped.
fn map_marked(len: usize) -> Option<*mut u8> {
    let p = anonymous(len, false)?;
    if !pages::mark(p, len, true) {
        // SAFETY: the mapping just made, which nothing refers to.
        unsafe { libc::munmap(p.cast(), len) };
        return None;
    }
    Some(p)
}

/// Maps `len` bytes for the arena; null on failure.
fn map(len: usize) -> *mut u8 {
    match map_marked(len) {
        Some(p) => {
            note_mapped(len);
            p
        }
        None => {
            short();
            ptr::null_mut()
        }
    }
}

/// # Safety
/// - `p..p+len` must be a whole mapping (or page-aligned part of one) made by [`map`] that
///   nothing refers to any more.
unsafe fn unmap(p: *mut u8, len: usize) {
    // Unmarked first: once unmapped, glibc may map the same pages, and a block of glibc's
    // there must not pass for one of the arena's (`owns`).
    pages::mark(p, len, false);
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p.cast(), len) };
    MAPPED.fetch_sub(len, Ordering::Relaxed);
}

fn round_up(n: usize, to: usize) -> usize {
    (n + to - 1) & !(to - 1)
}

fn alloc_small(class: usize) -> *mut u8 {
    let size = CLASSES[class];
    let mut st = CLASS_STATE[class].lock();
    if st.free != 0 {
        let p = st.free as *mut usize;
        // SAFETY: a free-list entry is a block of this class we own; its first word is the link.
        st.free = unsafe { p.read() };
        return p.cast();
    }
    if st.bump + size > st.end {
        let len = chunk_len(size);
        let chunk = map(len);
        if chunk.is_null() {
            return ptr::null_mut();
        }
        st.bump = chunk as usize;
        st.end = chunk as usize + len;
    }
    let p = st.bump;
    st.bump += size;
    p as *mut u8
}

/// # Safety
/// - `p` must come from `alloc_small(class)` and not be in use.
unsafe fn free_small(p: *mut u8, class: usize) {
    let mut st = CLASS_STATE[class].lock();
    // SAFETY: the block is ours and unused, so its first word may hold the link.
    unsafe { (p as *mut usize).write(st.free) };
    st.free = p as usize;
}

fn large_len(layout: Layout) -> usize {
    round_up(layout.size().max(1), PAGE)
}

fn alloc_large(layout: Layout) -> *mut u8 {
    let len = large_len(layout);
    if layout.align() <= PAGE {
        return map(len);
    }
    // Over-map by the alignment, then give the unaligned head and the tail back.
    let p = map(len + layout.align());
    if p.is_null() {
        return p;
    }
    let start = round_up(p as usize, layout.align());
    let head = start - p as usize;
    let tail = layout.align() - head;
    // SAFETY: both ranges are page-aligned parts of the mapping just made, outside the block.
    unsafe {
        if head > 0 {
            unmap(p, head);
        }
        if tail > 0 {
            unmap((start + len) as *mut u8, tail);
        }
    }
    start as *mut u8
}

/// Where the arena's memory is, for readers outside the process (the header's `arena`): a
/// leak scan from outside reads the program's own mappings and must leave these out.
pub static MAP: mem_trace_format::ArenaMap = mem_trace_format::ArenaMap {
    directory: &pages::DIRECTORY as *const _ as *const u64,
    scratch_base: core::sync::atomic::AtomicU64::new(0),
    scratch_len: core::sync::atomic::AtomicU64::new(0),
    reserved: 0,
};

/// Whether `p` is a block of the arena (its chunks, large blocks or scratch region) rather
/// than of the program's allocator: for a global allocator that serves the tracer from the
/// arena and the program from another allocator. Never locks, never allocates.
pub fn owns(p: *const u8) -> bool {
    scratch_contains(p as *mut u8) || pages::marked(p)
}

/// A block for `layout` from the arena; null when no memory is left.
pub(crate) fn allocate(layout: Layout) -> *mut u8 {
    match class_for(layout) {
        Some(c) => alloc_small(c),
        None => alloc_large(layout),
    }
}

/// A zeroed block for `layout` from the arena; null when no memory is left.
pub(crate) fn allocate_zeroed(layout: Layout) -> *mut u8 {
    let p = allocate(layout);
    if !p.is_null() && class_for(layout).is_some() {
        // Small blocks may be recycled; large mappings are fresh zero pages.
        // SAFETY: `p` is valid for `layout.size()` bytes.
        unsafe { ptr::write_bytes(p, 0, layout.size()) };
    }
    p
}

/// The chunk a directory `slot` points at: a published chunk of `len` zeroed `T`s, made and
/// published first if there is none yet (two threads racing keep the first one stored).
/// Directories whose chunks readers find by an exported pointer (thread records, stack
/// counters) grow this way; zeroed is "nothing written yet" for their types, and published
/// chunks are never freed. `None` when out of memory.
pub(crate) fn chunk<T>(slot: &AtomicPtr<T>, len: usize) -> Option<*mut T> {
    let chunk = slot.load(Ordering::Acquire);
    if !chunk.is_null() {
        return Some(chunk);
    }
    let layout = Layout::array::<T>(len).ok()?;
    let fresh = allocate_zeroed(layout) as *mut T;
    if fresh.is_null() {
        return None;
    }
    match slot.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(fresh),
        Err(existing) => {
            // SAFETY: ours, from the arena with this layout, never published.
            unsafe { release(fresh.cast(), layout) };
            Some(existing)
        }
    }
}

/// Entry `index` of such a directory, whose chunks hold `1 << bits` entries each; `None`
/// while its chunk is not published (never allocates: for readers and hot paths).
#[inline(always)]
pub(crate) fn entry<T>(dir: &'static [AtomicPtr<T>], index: u32, bits: u32) -> Option<&'static T> {
    let chunk = dir.get((index >> bits) as usize)?.load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a chunk published by `chunk` with `1 << bits` entries, never freed; the index
    // is masked into it.
    Some(unsafe { &*chunk.add((index & ((1 << bits) - 1)) as usize) })
}

/// Gives a block back to the arena.
///
/// # Safety
/// - `p` must come from [`allocate`] or [`allocate_zeroed`] with this `layout`, and nothing
///   may use it any more.
pub(crate) unsafe fn release(p: *mut u8, layout: Layout) {
    match class_for(layout) {
        // SAFETY: `p` was returned for this layout, hence by this class (caller's contract).
        Some(c) => unsafe { free_small(p, c) },
        // SAFETY: a large block is exactly its own page-rounded mapping.
        None => unsafe { unmap(p, large_len(layout)) },
    }
}

// SAFETY: every block handed out is exclusively the caller's until `dealloc`; small blocks come
// from disjoint slices of chunks, large ones from their own mappings, scratch blocks from a
// bump region no one else uses, and `class_for`/`large_len` recompute the same placement from
// the same layout on `dealloc`.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_scratch() {
            return scratch_alloc(layout);
        }
        match allocate(layout) {
            p if p.is_null() => reserve_alloc(layout),
            p => p,
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if in_scratch() {
            // Already zero: within a scope the bump pointer only moves forward, and a scope's
            // pages are given back to the kernel (zeroed) when it ends.
            return scratch_alloc(layout);
        }
        match allocate_zeroed(layout) {
            // Reserve blocks are never reused: still zero.
            p if p.is_null() => reserve_alloc(layout),
            p => p,
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if scratch_contains(p) || reserve_contains(p) {
            return;
        }
        // SAFETY: `p` was returned by `alloc` with this layout (GlobalAlloc's contract).
        unsafe { release(p, layout) }
    }
}

// SAFETY: as for `GlobalAlloc` above: blocks are the caller's until `deallocate`, and their
// placement is recomputed from the layout. Zero-sized requests get a block of the smallest
// class, like any other.
unsafe impl allocator_api2::alloc::Allocator for Arena {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        let p = NonNull::new(allocate(layout)).ok_or(allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    fn allocate_zeroed(
        &self,
        layout: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        let p = NonNull::new(allocate_zeroed(layout)).ok_or(allocator_api2::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, p: NonNull<u8>, layout: Layout) {
        // SAFETY: `p` was allocated by this allocator with `layout` (Allocator's contract).
        unsafe { release(p.as_ptr(), layout) }
    }
}

/// A boxed value in the tracer's arena.
pub(crate) type ArenaBox<T> = allocator_api2::boxed::Box<T, Arena>;

/// A boxed `T` made of zero bytes, in the arena; `None` when no memory is left. Large values
/// (the unwinder's per-thread tables) get fresh pages, which the kernel backs only where
/// something is stored: a thread that runs little code pays for a few pages instead of
/// ~300 KiB.
///
/// # Safety
/// - all-zero bytes must be a valid `T`.
pub(crate) unsafe fn zeroed_box<T>() -> Option<ArenaBox<T>> {
    let b = allocator_api2::boxed::Box::<T, Arena>::try_new_zeroed_in(Arena).ok()?;
    // SAFETY: zero bytes are a valid `T` (the caller's obligation).
    Some(unsafe { b.assume_init() })
}

/// Locks every class, for the `fork` prepare handler: the child must not inherit a lock held
/// by a thread that does not exist there.
pub(crate) fn lock_all() {
    for c in &CLASS_STATE {
        c.raw().lock();
    }
}

/// Releases the locks taken by [`lock_all`] (parent and child side of `fork`).
pub(crate) fn unlock_all() {
    for c in &CLASS_STATE {
        c.raw().unlock();
    }
}

// ---- reserve -----------------------------------------------------------------------------

/// Bytes kept for global-allocator requests the arena cannot serve (see the module
/// documentation). What one capture may allocate through the global allocator when memory
/// runs out mid-way: a thread's framehop cache and gimli context (a few KiB to a few tens), the
/// module list rebuilt after a `dlopen` (~100 bytes a module).
const RESERVE_LEN: usize = 256 << 10;

static RESERVE_BASE: AtomicUsize = AtomicUsize::new(0);
static RESERVE_USED: AtomicUsize = AtomicUsize::new(0);

/// Maps the reserve, once (tracer start-up, before the program can have lowered its limits).
/// Without it, a global-allocator request the arena cannot serve aborts the program as it did
/// before the reserve existed.
pub(crate) fn keep_reserve() {
    if RESERVE_BASE.load(Ordering::Relaxed) != 0 {
        return;
    }
    // Marked as the arena's, so that `owns` (the `Traced` wrapper's `dealloc`) knows it.
    let Some(p) = map_marked(RESERVE_LEN) else {
        return;
    };
    if RESERVE_BASE
        .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        // SAFETY: ours, never published.
        unsafe { libc::munmap(p.cast(), RESERVE_LEN) };
        pages::mark(p, RESERVE_LEN, false);
        return;
    }
    note_mapped(RESERVE_LEN);
}

fn reserve_contains(p: *mut u8) -> bool {
    let base = RESERVE_BASE.load(Ordering::Relaxed);
    base != 0 && (p as usize) >= base && (p as usize) < base + RESERVE_LEN
}

/// A block of the reserve: a bump pointer shared by all threads, never moved back (frees into
/// the reserve are no-ops). Null once it is used up.
#[cold]
#[inline(never)]
fn reserve_alloc(layout: Layout) -> *mut u8 {
    let base = RESERVE_BASE.load(Ordering::Acquire);
    if base == 0 {
        return ptr::null_mut();
    }
    let mut used = RESERVE_USED.load(Ordering::Relaxed);
    loop {
        let start = round_up(base + used, layout.align());
        let end = start.saturating_add(layout.size());
        if end > base + RESERVE_LEN {
            return ptr::null_mut();
        }
        match RESERVE_USED.compare_exchange_weak(
            used,
            end - base,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return start as *mut u8,
            Err(now) => used = now,
        }
    }
}

// ---- scratch region ----------------------------------------------------------------------

/// Virtual sizes tried, largest first, for the scratch region: symbolizing a large binary's
/// DWARF parses tens of MB, and the reservation costs nothing until touched
/// (`MAP_NORESERVE`); but under an address-space limit (`ulimit -v`) a smaller one is better
/// than none, which would leave `print_trace` with raw addresses.
const SCRATCH_LENS: [usize; 4] = [1 << 30, 1 << 28, 1 << 26, 1 << 24];

static SCRATCH_BASE: AtomicUsize = AtomicUsize::new(0);
/// The size reserved at `SCRATCH_BASE`.
static SCRATCH_LEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's global-allocator requests go to the scratch region. A `const`
    /// thread-local without a destructor: reading it never allocates.
    static IN_SCRATCH: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is inside a [`ScratchScope`].
#[inline(always)]
fn in_scratch() -> bool {
    IN_SCRATCH.with(Cell::get)
}
static SCRATCH_USED: AtomicUsize = AtomicUsize::new(0);

fn scratch_contains(p: *mut u8) -> bool {
    let base = SCRATCH_BASE.load(Ordering::Relaxed);
    base != 0 && (p as usize) >= base && (p as usize) < base + SCRATCH_LEN.load(Ordering::Relaxed)
}

fn scratch_alloc(layout: Layout) -> *mut u8 {
    let base = SCRATCH_BASE.load(Ordering::Relaxed);
    if base == 0 {
        return ptr::null_mut();
    }
    let used = SCRATCH_USED.load(Ordering::Relaxed);
    let start = round_up(base + used, layout.align().max(16));
    let end = start + layout.size();
    if end > base + SCRATCH_LEN.load(Ordering::Relaxed) {
        return ptr::null_mut();
    }
    SCRATCH_USED.store(end - base, Ordering::Relaxed);
    start as *mut u8
}

/// While alive, the current thread's Rust allocations come from the scratch region.
///
/// Only one thread may use the region at a time; `print_trace` ensures that with its own
/// busy flag. Scopes on that thread nest (gdb may stop one `print_trace` and call another):
/// each gives back only what was allocated since it began. Everything allocated inside a
/// scope must be dropped before the scope ends.
pub(crate) struct ScratchScope {
    /// The region's use when the scope began, restored when it ends.
    outer_used: usize,
    /// Whether the thread was in scratch mode already.
    was_in: bool,
}

impl ScratchScope {
    /// Enters scratch mode, reserving the region on first use. `None` if it cannot be reserved.
    pub fn enter() -> Option<Self> {
        if SCRATCH_BASE.load(Ordering::Relaxed) == 0 {
            let (p, len) = SCRATCH_LENS
                .iter()
                .find_map(|&len| Some((anonymous(len, true)?, len)))?;
            SCRATCH_LEN.store(len, Ordering::Relaxed);
            SCRATCH_BASE.store(p as usize, Ordering::Relaxed);
            MAP.scratch_len.store(len as u64, Ordering::Relaxed);
            MAP.scratch_base.store(p as u64, Ordering::Relaxed);
        }
        let was_in = IN_SCRATCH.with(|s| s.replace(true));
        Some(ScratchScope {
            outer_used: SCRATCH_USED.load(Ordering::Relaxed),
            was_in,
        })
    }
}

impl Drop for ScratchScope {
    fn drop(&mut self) {
        IN_SCRATCH.with(|s| s.set(self.was_in));
        let base = SCRATCH_BASE.load(Ordering::Relaxed);
        let used = round_up(SCRATCH_USED.swap(self.outer_used, Ordering::Relaxed), PAGE);
        let kept = round_up(self.outer_used, PAGE);
        if used > kept {
            // Give the touched pages back so repeated print_trace calls do not pin memory.
            // SAFETY: the pages belong to the scratch reservation, above what an outer scope
            // still uses, and nothing refers to them any more (the scope's contract).
            unsafe {
                libc::madvise(
                    (base + kept) as *mut libc::c_void,
                    used - kept,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_sizes_and_alignments() {
        for size in [1, 15, 16, 17, 100, 3000, 4096] {
            let c = class_for(Layout::from_size_align(size, 8).unwrap()).unwrap();
            assert!(CLASSES[c] >= size);
        }
        assert_eq!(class_for(Layout::from_size_align(4097, 8).unwrap()), None);
        let c = class_for(Layout::from_size_align(40, 64).unwrap()).unwrap();
        assert_eq!(CLASSES[c], 64);
        assert_eq!(class_for(Layout::from_size_align(16, 8192).unwrap()), None);
    }

    #[test]
    fn blocks_are_aligned_and_reused() {
        let a = Arena;
        for align in [8, 16, 32, 64, 256, 4096, 16384] {
            let l = Layout::from_size_align(24, align).unwrap();
            // SAFETY: valid non-zero layout; freed with the same layout.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                p.write_bytes(0xab, 24);
                a.dealloc(p, l);
            }
        }
        let l = Layout::from_size_align(200, 8).unwrap();
        // SAFETY: as above.
        unsafe {
            let p = a.alloc(l);
            a.dealloc(p, l);
            let q = a.alloc(l);
            assert_eq!(p, q, "a freed small block is handed out again");
            a.dealloc(q, l);
        }
    }

    #[test]
    fn owns_its_blocks_and_no_others() {
        let a = Arena;
        let heap = Box::new([0u8; 64]);
        assert!(!owns(heap.as_ptr()), "a block of the test's own allocator");
        for size in [24, 5000, 3 << 20] {
            let l = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: valid layout; freed with the same layout.
            unsafe {
                let p = a.alloc(l);
                assert!(owns(p) && owns(p.add(size - 1)), "size {size}");
                a.dealloc(p, l);
                if size > SMALL_MAX {
                    assert!(!owns(p), "an unmapped large block, size {size}");
                }
            }
        }
    }

    #[test]
    fn the_reserve_hands_out_aligned_blocks_it_owns_and_ignores_their_frees() {
        keep_reserve();
        let base = RESERVE_BASE.load(Ordering::Relaxed);
        assert_ne!(base, 0, "mapped");
        let mut last = 0;
        for (size, align) in [(24, 8), (100, 64), (8000, 16), (1, 4096)] {
            let l = Layout::from_size_align(size, align).unwrap();
            let p = reserve_alloc(l);
            assert!(!p.is_null(), "size {size}");
            assert_eq!(p as usize % align, 0);
            assert!(reserve_contains(p) && reserve_contains(p.wrapping_add(size - 1)));
            assert!(owns(p), "the arena's, for `Traced`'s dealloc");
            assert!(p as usize >= last, "bump order");
            last = p as usize + size;
            // SAFETY: a reserve block for `l`: freeing it is a no-op.
            unsafe { Arena.dealloc(p, l) };
        }
        let too_big = Layout::from_size_align(RESERVE_LEN + 1, 8).unwrap();
        assert!(reserve_alloc(too_big).is_null());
    }

    #[test]
    fn large_blocks_round_trip() {
        let a = Arena;
        let l = Layout::from_size_align(5 << 20, 8).unwrap();
        // SAFETY: valid layout; freed with the same layout.
        unsafe {
            let p = a.alloc_zeroed(l);
            assert!(!p.is_null());
            assert_eq!(*p.add((5 << 20) - 1), 0);
            a.dealloc(p, l);
        }
    }
}
