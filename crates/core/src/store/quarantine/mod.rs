//! The quarantine: freed blocks held back from glibc, oldest released first, up to
//! `MEM_TRACE_QUARANTINE` bytes, so that a dangling pointer keeps pointing into the block it
//! came from instead of into whatever `malloc` hands out next. It also makes double frees
//! certain: a block still held here cannot belong to anyone else.
//!
//! One FIFO per thread, holding what that thread freed, with an equal share of the limit (at
//! least [`MIN_SHARE`]). A single FIFO for the process made one thread hand glibc the blocks
//! another had freed, into the other's arena: glibc's arena lock then bounced between threads
//! (`futex` wake-ups were 7% of churn with two threads). A thread's FIFO outlives it: at exit
//! it is orphaned with its blocks still held, and the next thread that frees adopts it, so
//! blocks of an exited thread stay protected until another thread's frees push them out.
//!
//! A block pushed out of the FIFO has waited its turn; glibc would hand it to the next
//! `malloc` of its size anyway. Small ones go to a per-thread recycling list for their glibc
//! size class instead, and [`reuse`] serves `malloc` and `calloc` of that class from it without
//! calling glibc. Handing every block back to glibc late and cold had cost python3 a quarter
//! of its run in glibc's bins (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`): its thread
//! cache never saw a block again. The lists together hold at most the thread's share; past it, a
//! clock hand over the classes gives glibc the oldest block of a class that served no
//! `malloc` since the hand last passed, so classes the program stopped allocating drain first.
//!
//! Under memory pressure the quarantine gives way: when glibc returns NULL, [`drain`] empties
//! every thread's FIFO and lists so the caller can hand the blocks back and try again, and
//! when the tracer's own memory runs out, [`stop`] makes every later free go straight to glibc.
//!
//! A held entry is the pointer glibc gets back: a table block's own address, or a tagged
//! block's chunk, marked [`TAGGED`] (its tag in front of it is part of the chunk), so that a
//! recycled chunk serves a tagged `malloc` and an untagged one alike.
//!
//! Membership ("is this block held?") is only asked for pointers that are not live blocks —
//! double and invalid frees, rare in any program — so it is a scan of every thread's FIFO and
//! lists rather than a set kept up to date on every free.

mod held;
mod recycled;
mod ring;

use super::freed::HISTORY;
use crate::arena::{zeroed_box, Arena};
use crate::sync::SpinLock;
use allocator_api2::boxed::Box;
use allocator_api2::vec::Vec;
use core::cell::Cell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use held::block_of;
pub(crate) use held::{Released, TAGGED};
use recycled::{class_of, Recycled};
use ring::Ring;

/// A FIFO entry: the held pointer, its [`TAGGED`] mark and its chunk size in one word. Pairs
/// of words made the FIFO 1 MiB for `live`'s million small blocks in debug mode (its 4 MiB
/// share of ~110-byte chunks), and 1.5 MiB while it doubled: ~1.2 bytes per live block of
/// the tracer's 40. A held pointer is 16-byte aligned and below 2^48 (bits 4..48); the
/// chunk size, in 16-byte units, goes in bits 1..4 and 48..64 (19 bits: chunks under
/// [`QUEUED_MAX`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Queued(u64);

/// Where an entry's held pointer is, and its mark.
const QUEUED_ENTRY: u64 = 0x0000_ffff_ffff_fff0 | TAGGED;
/// Chunks from this size on are not held (a quarantine larger than 8 MiB a thread gives
/// them straight back).
const QUEUED_MAX: u64 = 16 << 19;

impl Queued {
    /// The entry for held pointer `entry` (marked) of a `chunk`-byte glibc chunk; `None`
    /// when either does not fit (a pointer at or above 2^48, a chunk of [`QUEUED_MAX`]).
    fn new(entry: u64, chunk: u64) -> Option<Queued> {
        if entry & !QUEUED_ENTRY != 0 || chunk >= QUEUED_MAX || !chunk.is_multiple_of(16) {
            return None;
        }
        let units = chunk / 16;
        Some(Queued(entry | ((units & 7) << 1) | ((units >> 3) << 48)))
    }

    /// The held pointer, marked as [`TAGGED`] when it is.
    fn entry(self) -> u64 {
        self.0 & QUEUED_ENTRY
    }

    /// The chunk's size in bytes.
    fn chunk(self) -> u64 {
        (((self.0 >> 1) & 7) | ((self.0 >> 48) << 3)) * 16
    }
}

/// The quarantine's per-thread part of `state::ThreadState`.
pub struct Local {
    /// This thread's quarantine, null until its first held free.
    quarantine: Cell<*const Quarantine>,
    /// Set when the thread exits: its quarantine is orphaned and no new one is made.
    closed: Cell<bool>,
}

impl Local {
    /// A thread that has not freed yet.
    pub const fn new() -> Self {
        Local {
            quarantine: Cell::new(core::ptr::null()),
            closed: Cell::new(false),
        }
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}

/// One thread's quarantine (or an orphan's, waiting for a thread to adopt it).
struct Quarantine {
    held: SpinLock<Held>,
    /// A live thread owns it; cleared when the thread exits.
    owned: AtomicBool,
}

struct Held {
    /// Blocks in the order they were freed, with their glibc chunk sizes.
    fifo: Ring<Queued>,
    /// Sum of the chunk sizes in `fifo`.
    bytes: u64,
    /// What of `bytes` is counted in `HISTORY.quarantined_bytes`.
    published: u64,
    /// Blocks out of the FIFO kept for reuse.
    recycled: Box<Recycled, Arena>,
}

/// Every thread's quarantine ever made (at most as many as threads alive at once).
static ALL: SpinLock<Vec<&'static Quarantine, Arena>> = SpinLock::new(Vec::new_in(Arena));

/// glibc's chunk size for a request of `n` bytes (its `request2size`): the size word, rounded
/// up to 16 bytes, at least 32. A block's real chunk may be larger (`memalign`, a `realloc`
/// in place), never smaller, so a block of this class always fits a request of this class.
fn chunk_of(n: u64) -> u64 {
    (n.saturating_add(8 + 15) & !15).max(32)
}

/// The limit in bytes that [`hold`] keeps to (0: quarantine off): the configured one
/// (`HISTORY.quarantine_limit`, which readers show), or 0 once [`stop`]ped.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// The limit in force (0: off).
pub(crate) fn limit() -> u64 {
    LIMIT.load(Ordering::Relaxed)
}

/// Sets the configured limit (initialisation).
pub(crate) fn configure(limit: u64) {
    HISTORY.quarantine_limit.store(limit, Ordering::Relaxed);
    LIMIT.store(limit, Ordering::Relaxed);
}

/// Holds no more blocks: later frees go straight to the real allocator (the tracer ran out of
/// its own memory, which a growing FIFO needs). What is held stays until [`drain`]. Neither
/// allocates nor locks.
pub(crate) fn stop() {
    LIMIT.store(0, Ordering::Relaxed);
}

/// Threads that own a quarantine now: they share the limit.
static OWNERS: AtomicU64 = AtomicU64::new(0);

/// The least share of the limit a thread holds, however many threads free: below it a
/// dangling pointer would be protected for too few frees. (400 threads that all free: 50 MiB
/// held, and as much in recycling lists.)
pub(crate) const MIN_SHARE: u64 = 128 << 10;

/// A thread's share of `limit`. Read on every free, written only when a thread starts or
/// stops freeing: the line stays shared in every cache.
fn share(limit: u64) -> u64 {
    (limit / OWNERS.load(Ordering::Relaxed).max(1)).max(limit.min(MIN_SHARE))
}

/// The quarantine this thread has, if any.
fn current(local: &Local) -> Option<&'static Quarantine> {
    let p = local.quarantine.get();
    // SAFETY: only `mine` sets it, from a `&'static Quarantine` (leaked, never freed).
    unsafe { p.as_ref() }
}

/// This thread's quarantine: its own, an orphan it adopts, or a new one. `None` once the
/// thread is exiting (its quarantine was orphaned; later frees go straight to glibc), or when
/// no memory is left for one.
fn mine(local: &Local) -> Option<&'static Quarantine> {
    if let Some(q) = current(local) {
        return Some(q);
    }
    if local.closed.get() {
        return None;
    }
    let q = adopt_or_make()?;
    local.quarantine.set(q);
    Some(q)
}

#[cold]
#[inline(never)]
fn adopt_or_make() -> Option<&'static Quarantine> {
    let mut all = ALL.lock();
    if let Some(q) = all.iter().find(|q| !q.owned.load(Ordering::Relaxed)) {
        q.owned.store(true, Ordering::Relaxed);
        OWNERS.fetch_add(1, Ordering::Relaxed);
        return Some(q);
    }
    all.try_reserve(1).ok()?;
    // Made in place: built on the stack and moved, its 255 lists took 8 KiB of the stack of
    // the thread's first free, which a thread with a small stack or a signal handler on an
    // alternate stack may not have.
    // SAFETY: all-zero is a valid `Recycled`: every list empty (`Ring::new` is a null buffer
    // of capacity 0), no class set, no bytes, the hand at class 0.
    let recycled = unsafe { zeroed_box::<Recycled>() }?;
    let q = Quarantine {
        held: SpinLock::new(Held {
            fifo: Ring::new(),
            bytes: 0,
            published: 0,
            recycled,
        }),
        owned: AtomicBool::new(true),
    };
    // Never freed: an orphan waits for adoption, and readers may hold a reference.
    let q: &'static Quarantine = Box::leak(Box::try_new_in(q, Arena).ok()?);
    all.push(q);
    OWNERS.fetch_add(1, Ordering::Relaxed);
    Some(q)
}

/// Holds a block this thread freed: `addr`, the pointer glibc gets back (marked [`TAGGED`] for
/// a tagged block's chunk), of `size` bytes asked of glibc. Returns `false` if it was not
/// taken (quarantine off, the block is larger than the thread's share, the thread is
/// exiting): the caller frees it at once. `released` gets blocks pushed out that are not kept for reuse (at most 32 per call:
/// a big block may push out more on later calls, which keeps each free's work bounded).
pub(crate) fn hold(local: &Local, addr: u64, size: u64, released: &mut Released) -> bool {
    released.n = 0;
    let all = limit();
    // Off (profile mode): no share to compute, a division on every free.
    if all == 0 {
        return false;
    }
    let limit = share(all);
    let chunk = chunk_of(size);
    if chunk > limit {
        return false;
    }
    let Some(entry) = Queued::new(addr, chunk) else {
        return false;
    };
    let Some(quarantine) = mine(local) else {
        return false;
    };
    // SAFETY: called inside the guard (a free); the quarantine's other users on this thread
    // (a drain when glibc runs out, the fork handlers) do not run meanwhile.
    let mut q = unsafe { quarantine.held.lock_unless_alone() };
    let q = &mut *q;
    if !q.fifo.push_back(entry) {
        // No memory to hold it: glibc gets it now.
        return false;
    }
    q.bytes += chunk;
    while q.bytes > limit && !released.full() {
        let Some(e) = q.fifo.pop_front() else {
            break;
        };
        let (a, c) = (e.entry(), e.chunk());
        q.bytes -= c;
        match class_of(c) {
            Some(k) => q.recycled.keep(k, a, limit, released),
            None => released.push(a),
        }
    }
    // The block a few releases from now: glibc's `free` (or the program, if it is recycled)
    // will touch its header and first bytes, a line untouched since the program freed it
    // (python3: one miss per free, ~15% of the run), so start loading it now. (Its end, which
    // glibc's `free` also reads, measured no better once most blocks were recycled.)
    if let Some(e) = q.fifo.get(PREFETCH_AHEAD) {
        crate::prefetch::line((e.entry() & !TAGGED).wrapping_sub(8) as *const u8);
    }
    // And the FIFO's own entries, further ahead: the ring is larger than the cache (python3:
    // 80,000 entries), so the entry read just above was cold too.
    if let Some(e) = q.fifo.get(FIFO_AHEAD) {
        crate::prefetch::line((e as *const Queued).cast());
    }
    // The exported total is one shared line: update it in steps, not on every free.
    if q.bytes.abs_diff(q.published) >= PUBLISH_STEP {
        q.publish();
    }
    true
}

/// Holds a block as [`hold`] does, but lets none go even past the limit: for a thread that
/// exits, which must not call the allocator (its quarantine's next owner's frees bring it back
/// under the limit). Whether it was taken; if not, the caller keeps the block for good.
pub(crate) fn keep(local: &Local, addr: u64, size: u64) -> bool {
    let (Some(entry), Some(quarantine)) = (Queued::new(addr, chunk_of(size)), mine(local)) else {
        return false;
    };
    let mut q = quarantine.held.lock();
    let kept = q.fifo.push_back(entry);
    if kept {
        q.bytes += entry.chunk();
        // Readers see what an exited thread left held; exits are rare enough to pay the
        // shared line.
        q.publish();
    }
    kept
}

impl Held {
    /// Brings `HISTORY.quarantined_bytes` up to date with this quarantine's FIFO.
    fn publish(&mut self) {
        if self.bytes > self.published {
            HISTORY
                .quarantined_bytes
                .fetch_add(self.bytes - self.published, Ordering::Relaxed);
        } else {
            HISTORY
                .quarantined_bytes
                .fetch_sub(self.published - self.bytes, Ordering::Relaxed);
        }
        self.published = self.bytes;
    }
}

/// How many blocks ahead of the next release [`hold`] prefetches.
const PREFETCH_AHEAD: usize = 4;
/// How many FIFO entries ahead of the next release [`hold`] prefetches the entry (four lines
/// of 8-byte entries past the one whose block it prefetches).
const FIFO_AHEAD: usize = PREFETCH_AHEAD + 32;
/// Granularity of `HISTORY.quarantined_bytes` per thread.
const PUBLISH_STEP: u64 = 64 << 10;

/// Starts loading what glibc's `free` will read of the block this thread's quarantine
/// releases next, when it is over its share: the block's size word and the next chunk's.
/// Called at the start of a free, so that the miss (and the page walk: the block was freed
/// two quarantines ago, on a heap of any size) overlaps the free's own work before `hold`.
#[inline]
pub(crate) fn prefetch_next_release(local: &Local) {
    let Some(q) = current(local) else {
        return;
    };
    // SAFETY: called inside the guard (a free), as `hold`.
    let held = unsafe { q.held.lock_unless_alone() };
    if let Some((a, chunk)) = held.recycled.next_release() {
        crate::prefetch::line(a.wrapping_sub(8) as *const u8);
        crate::prefetch::line((a + chunk).wrapping_sub(8) as *const u8);
    }
}

/// A block of `size` bytes out of this thread's recycling lists, or null: a chunk freed at
/// least a quarantine ago that fits `size` exactly as a fresh one of glibc's would.
#[inline]
pub(crate) fn reuse(local: &Local, size: usize) -> *mut core::ffi::c_void {
    let (Some(q), Some(k)) = (current(local), class_of(chunk_of(size as u64))) else {
        return core::ptr::null_mut();
    };
    // SAFETY: called inside the guard (an allocation), as `hold`.
    let a = unsafe { q.held.lock_unless_alone() }
        .recycled
        .take(k)
        .unwrap_or(0);
    a as *mut core::ffi::c_void
}

/// An empty release list.
pub(crate) fn released() -> Released {
    Released {
        n: 0,
        addrs: [MaybeUninit::uninit(); 32],
    }
}

/// Takes held blocks, FIFOs and recycling lists alike, into `released` (at most its 32) for
/// the caller to free for real, and says whether to call again: the caller frees what it got
/// and calls again with the same `at` until `false`. Each quarantine gives what it held when
/// the drain reached it; one quarantine's lock is held at a time, and nothing is freed under
/// it.
pub(crate) fn drain(at: &mut Drain, released: &mut Released) -> bool {
    released.n = 0;
    loop {
        let q = {
            let all = ALL.lock();
            match all.get(at.quarantine) {
                Some(&q) => q,
                None => return released.n > 0,
            }
        };
        // Its lock is released before `ALL`'s is taken again (`contains` takes them in the
        // other order).
        if take_from(q, at, released) {
            return true;
        }
        at.quarantine += 1;
        at.left = None;
        if released.full() {
            return true;
        }
    }
}

/// [`drain`]'s part in one quarantine: whether blocks to take are left there.
fn take_from(q: &Quarantine, at: &mut Drain, released: &mut Released) -> bool {
    let mut held = q.held.lock();
    let held = &mut *held;
    // Bounded by what the quarantine held when first visited, so that a thread freeing
    // meanwhile cannot keep the caller here.
    let left = at
        .left
        .get_or_insert_with(|| held.fifo.len() + held.recycled.count());
    while *left > 0 && !released.full() {
        let addr = match held.fifo.pop_front() {
            Some(e) => {
                held.bytes -= e.chunk();
                e.entry()
            }
            None => match held.recycled.take_oldest() {
                Some(a) => a,
                None => {
                    *left = 0;
                    break;
                }
            },
        };
        released.push(addr);
        *left -= 1;
    }
    held.publish();
    *left > 0
}

/// Where a [`drain`] is: the quarantine it empties and how many blocks it still takes there.
#[derive(Default)]
pub(crate) struct Drain {
    quarantine: usize,
    left: Option<usize>,
}

/// Whether the block starting at `addr` is held in some thread's quarantine or recycling
/// lists (so freeing it again is a double free).
pub(crate) fn contains(addr: u64) -> bool {
    let all = ALL.lock();
    all.iter().any(|l| {
        let q = l.held.lock();
        q.fifo.iter().any(|e| block_of(e.entry()) == addr) || q.recycled.contains(addr)
    })
}

/// Orphans this thread's quarantine (thread exit): its blocks stay held until another thread
/// adopts it.
pub(crate) fn thread_exiting(local: &Local) {
    local.closed.set(true);
    if let Some(l) = current(local) {
        local.quarantine.set(core::ptr::null());
        l.owned.store(false, Ordering::Relaxed);
        OWNERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Locks every quarantine (fork prepare).
pub(crate) fn lock() {
    ALL.raw().lock();
    // SAFETY: ALL is locked (above), so the list does not change under us.
    for l in unsafe { all_locked() } {
        l.held.raw().lock();
    }
}

/// Unlocks them (fork parent). In the child, pass the forking thread's state: the other
/// threads' quarantines lost their threads and are orphaned for adoption.
pub(crate) fn unlock(child: Option<&Local>) {
    // In the child: the forking thread's own quarantine, if it has one.
    let own = child.map(current);
    if let Some(own) = own {
        OWNERS.store(u64::from(own.is_some()), Ordering::Relaxed);
    }
    // SAFETY: ALL is still locked by `lock`.
    for l in unsafe { all_locked() } {
        if let Some(own) = own {
            if !own.is_some_and(|own| core::ptr::eq(own, *l)) {
                l.owned.store(false, Ordering::Relaxed);
            }
        }
        l.held.raw().unlock();
    }
    ALL.raw().unlock();
}

/// The list of quarantines, read while `ALL`'s lock is held through its raw word.
///
/// # Safety
/// The caller holds `ALL`'s lock.
unsafe fn all_locked() -> &'static [&'static Quarantine] {
    // SAFETY: the lock is held (caller's contract), so nobody mutates the vector; the
    // quarantines are leaked and live forever. The slice is used before the lock is dropped.
    unsafe { &*ALL.data_ptr() }
}

#[cfg(test)]
mod tests {
    use super::recycled::{Classes, CLASSES};
    use super::*;

    /// The limit is process-wide: tests that set it take turns.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Runs `f` on a new thread with the limit set; the thread's quarantine is orphaned at
    /// the end, as at a real thread exit, emptied first unless `keep` (the addresses are made
    /// up: they must not reach a later test's thread, which may adopt the quarantine).
    fn held_here(limit: u64, keep: bool, f: impl FnOnce(&Local) + Send) {
        let _turn = turn();
        held_in_turn(limit, keep, f);
    }

    /// The turn to set the limit and use quarantines, for a test that spans several threads:
    /// between two of its [`held_in_turn`], another test's thread would adopt its orphan.
    fn turn() -> std::sync::MutexGuard<'static, ()> {
        TURN.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`held_here`] for a caller that holds the [`turn`].
    fn held_in_turn(limit: u64, keep: bool, f: impl FnOnce(&Local) + Send) {
        std::thread::scope(|s| {
            s.spawn(|| {
                configure(limit);
                let state = &Local::new();
                f(state);
                if let Some(l) = mine(state).filter(|_| !keep) {
                    let mut q = l.held.lock();
                    q.fifo.clear();
                    q.bytes = 0;
                    q.recycled.lists.iter_mut().for_each(Ring::clear);
                    q.recycled.filled = Classes::default();
                    q.recycled.bytes = 0;
                }
                thread_exiting(state);
            });
        });
    }

    #[test]
    fn an_entry_keeps_its_pointer_mark_and_chunk_size() {
        for (entry, chunk) in [
            (0x5555_0000_1230, 32),
            (0x7fff_ffff_fff0 | TAGGED, 4096),
            (0x10 | TAGGED, 128),
            (0xffff_ffff_fff0, QUEUED_MAX - 16),
            (0x7f00_0000_0000, 16 * 8),
            (0x7f00_0000_0000, 16 * 7),
        ] {
            let q = Queued::new(entry, chunk).expect("fits");
            assert_eq!((q.entry(), q.chunk()), (entry, chunk), "{entry:#x} {chunk}");
        }
        // Past 48 bits, a chunk too large, a misaligned pointer: not held.
        assert_eq!(Queued::new(0x1_0000_0000_0000, 32), None);
        assert_eq!(Queued::new(0x7f00_0000_0000, QUEUED_MAX), None);
        assert_eq!(Queued::new(0x7f00_0000_0008, 32), None);
    }

    #[test]
    fn a_chunk_too_large_for_an_entry_is_given_straight_back() {
        held_here(64 << 20, false, |state| {
            let mut r = released();
            assert!(!hold(state, 0x7f00_0000_0000, QUEUED_MAX, &mut r));
            assert!(hold(state, 0x7f00_0000_0000, QUEUED_MAX - 64, &mut r));
            assert_eq!(r.n, 0);
        });
    }

    #[test]
    fn threads_that_free_share_the_limit() {
        let _turn = turn();
        let before = OWNERS.load(Ordering::Relaxed);
        for (owners, limit, share_of_each) in [
            (0, 4 << 20, 4 << 20),
            (1, 4 << 20, 4 << 20),
            (2, 4 << 20, 2 << 20),
            (64, 4 << 20, MIN_SHARE),
            (64, 100, 100),
        ] {
            OWNERS.store(owners, Ordering::Relaxed);
            assert_eq!(
                share(limit),
                share_of_each,
                "{owners} threads, limit {limit}"
            );
        }
        OWNERS.store(before, Ordering::Relaxed);
    }

    #[test]
    fn chunk_sizes_are_glibcs() {
        assert_eq!(chunk_of(0), 32);
        assert_eq!(chunk_of(24), 32);
        assert_eq!(chunk_of(25), 48);
        assert_eq!(chunk_of(40), 48);
        assert_eq!(chunk_of(4088), 4096);
        assert_eq!(class_of(32), Some(0));
        assert_eq!(class_of(4096), Some(CLASSES - 1));
        assert_eq!(class_of(4112), None);
    }

    #[test]
    fn holds_up_to_the_limit_oldest_out_first_then_reuses_by_class() {
        held_here(100, false, |state| {
            let mut r = released();
            // 40 bytes: 48-byte chunks. Two fit in 100 bytes.
            assert!(hold(state, 0x10, 40, &mut r));
            assert!(hold(state, 0x20, 40, &mut r));
            assert!(contains(0x10));
            assert!(reuse(state, 40).is_null(), "nothing pushed out yet");
            // A third pushes the oldest out of the FIFO, into the 48-byte class's list.
            assert!(hold(state, 0x30, 40, &mut r));
            assert!(r.addrs().is_empty());
            assert!(
                contains(0x10),
                "a block kept for reuse is still not the program's"
            );
            assert!(reuse(state, 100).is_null(), "another class");
            assert!(reuse(state, 5000).is_null(), "too large to be kept");
            assert_eq!(reuse(state, 33) as u64, 0x10, "same class as 40 bytes");
            assert!(!contains(0x10));
            assert!(reuse(state, 40).is_null());
            assert!(contains(0x20) && contains(0x30));
            assert!(
                !hold(state, 0x40, 101, &mut r),
                "larger than the whole quarantine"
            );
        });
    }

    #[test]
    fn an_exiting_threads_batch_is_kept_past_the_limit_without_a_release() {
        held_here(100, false, |state| {
            let mut r = released();
            assert!(hold(state, 0x10, 40, &mut r));
            assert!(hold(state, 0x20, 40, &mut r));
            // Past the limit: kept all the same, nothing let go.
            assert!(keep(state, 0x30, 40));
            assert!(keep(state, 0x40 | TAGGED, 16));
            assert!(contains(0x30) && contains(0x40 + crate::store::tags::bytes()));
            assert!(contains(0x10) && contains(0x20));
            // The next hold brings the FIFO back under the limit.
            assert!(hold(state, 0x50, 40, &mut r));
            let held = current(state).expect("a quarantine").held.lock().bytes;
            assert!(held <= 100, "{held} bytes held");
        });
    }

    #[test]
    fn a_tagged_blocks_chunk_is_held_and_given_back_and_recycled_as_a_chunk() {
        let _tags = crate::store::tags::tests::tags_on(true);
        held_here(100, false, |state| {
            let mut r = released();
            // A 16-byte block with a 32-byte tag: a 48-byte chunk at 0x1000.
            assert!(hold(state, 0x1000 | TAGGED, 48, &mut r));
            assert!(contains(0x1020), "the program's block is held");
            assert!(!contains(0x1000), "the chunk is no block of the program's");
            assert!(hold(state, 0x2000, 40, &mut r));
            assert!(hold(state, 0x3000, 40, &mut r));
            assert!(r.addrs().is_empty());
            assert!(contains(0x1020), "kept for reuse, still held");
            assert_eq!(reuse(state, 48) as u64, 0x1000, "the chunk, unmarked");
            assert!(!contains(0x1020));
        });
        held_here(10_000, false, |state| {
            let mut r = released();
            // Too large for a recycling list: pushed out, glibc gets the chunk.
            assert!(hold(state, 0x4000 | TAGGED, 5000, &mut r));
            assert!(hold(state, 0x8000, 5000, &mut r));
            assert_eq!(r.addrs(), &[0x4000]);
            assert!(hold(state, 0x6000 | TAGGED, 16, &mut r));
            let (mut at, mut out) = (Drain::default(), released());
            let mut drained = std::vec::Vec::new();
            loop {
                let more = drain(&mut at, &mut out);
                drained.extend_from_slice(out.addrs());
                if !more {
                    break;
                }
            }
            drained.sort_unstable();
            assert_eq!(drained, [0x6000, 0x8000], "drained as chunks");
        });
    }

    #[test]
    fn past_the_limit_the_class_malloc_stopped_using_goes_back_first() {
        held_here(200, false, |state| {
            let mut r = released();
            let y = 0x1000; // 100 bytes: a 112-byte chunk, never asked for again
            let x = |i: u64| 0x2000 + 0x100 * i; // 40 bytes: 48-byte chunks
            for (a, size) in [(y, 100), (x(1), 40), (x(2), 40)] {
                assert!(hold(state, a, size, &mut r));
            }
            // 208 bytes held: y leaves the FIFO for its list.
            assert!(r.addrs().is_empty() && contains(y));
            for i in 3..=5 {
                assert!(hold(state, x(i), 40, &mut r));
            }
            assert_eq!(reuse(state, 40) as u64, x(1), "x1 left the FIFO after y");
            assert!(hold(state, x(6), 40, &mut r));
            assert!(r.addrs().is_empty(), "lists: y and x2, 160 bytes");
            assert!(hold(state, x(7), 40, &mut r));
            // Lists would hold 208 bytes: the hand passes the 48-byte class (it served a
            // malloc) and gives back y.
            assert_eq!(r.addrs(), &[y]);
            assert!(!contains(y) && contains(x(2)) && contains(x(3)));
        });
    }

    /// Everything [`drain`] hands out, batch after batch.
    fn drained() -> std::vec::Vec<u64> {
        let (mut at, mut r, mut all) = (Drain::default(), released(), std::vec::Vec::new());
        loop {
            let more = drain(&mut at, &mut r);
            all.extend_from_slice(r.addrs());
            if !more {
                return all;
            }
        }
    }

    #[test]
    fn a_drain_takes_every_held_block_fifo_and_lists_then_stops_holding_on_stop() {
        held_here(1 << 20, false, |state| {
            let mut r = released();
            // 100 blocks of 40 bytes (48-byte chunks) fit in the FIFO; a small limit first
            // pushes some into the recycling lists.
            configure(48 * 60);
            let addrs: std::vec::Vec<u64> = (0..100).map(|i| 0x10_0000 + 0x100 * i).collect();
            for &a in &addrs {
                assert!(hold(state, a, 40, &mut r));
                assert!(r.addrs().is_empty(), "kept for reuse, none for glibc yet");
            }
            let q = current(state).expect("made");
            assert!(q.held.lock().recycled.count() > 0, "some in the lists");
            let mut all = drained();
            all.sort_unstable();
            // Other tests' orphans may hold made-up addresses of their own.
            all.retain(|a| (0x10_0000..0x10_0000 + 0x100 * 100).contains(a));
            assert_eq!(
                all, addrs,
                "each held block once, more than one batch of 32"
            );
            assert!(!contains(addrs[0]) && !contains(addrs[99]));
            assert!(reuse(state, 40).is_null(), "the lists are empty");
            assert_eq!(q.held.lock().bytes, 0);
            assert!(
                drained().iter().all(|a| !addrs.contains(a)),
                "nothing twice"
            );
            stop();
            assert!(
                !hold(state, 0x20_0000, 40, &mut r),
                "stopped: straight to glibc"
            );
        });
    }

    #[test]
    fn an_exited_threads_blocks_stay_held_and_its_quarantine_is_adopted() {
        let _turn = turn();
        held_in_turn(1000, true, |state| {
            let mut r = released();
            assert!(hold(state, 0x7000, 100, &mut r));
        });
        assert!(contains(0x7000), "orphaned, still held");
        held_in_turn(1000, false, |state| {
            let mut r = released();
            // The next thread that frees adopts an orphan: the first block is still there.
            assert!(hold(state, 0x8000, 100, &mut r));
            assert!(contains(0x8000) && contains(0x7000));
            let fifo = current(state)
                .expect("adopted")
                .held
                .lock()
                .fifo
                .iter()
                .map(Queued::entry)
                .collect::<std::vec::Vec<_>>();
            assert!(
                fifo.ends_with(&[0x7000, 0x8000]),
                "adopted with its blocks: {fifo:x?}"
            );
        });
        held_in_turn(0, false, |state| {
            let mut r = released();
            assert!(!hold(state, 0x50, 8, &mut r), "off");
        });
    }
}
