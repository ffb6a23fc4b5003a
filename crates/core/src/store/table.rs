//! The live-block table: every block the program holds, by address, with its size, thread,
//! sequence number and stack id. Exported through `MEM_TRACE_HEADER` (docs/LAYOUT.md).
//!
//! Algorithm. 128 region shards plus one shard for large blocks. A block of at most 64 KiB
//! lives in the shard picked by hashing its 64 KiB region (`addr >> 16`), so a reader looking
//! for the block that contains an address needs only the shards of that region, of the region
//! before, and the large shard. Glibc gives each thread its own arena at its own addresses, so
//! threads mostly land on different shards and rarely share a lock (one global lock measured
//! 3-4x slower with 2 threads). Inside a shard: open addressing with linear probing on
//! `hash(addr)`, tombstones for removal, growth by a quarter when seven eighths of the
//! slots are used.
//!
//! Publication. A slot's `addr` is stored last with release ordering when inserting and first
//! when removing, so a reader that sees `addr > 1` sees the whole entry — even in a core taken
//! while a writer was stopped halfway. Growth fills the new array completely before switching
//! the shard's pointer; the capacity travels inside the array for the same reason.

use crate::arena;
use crate::sync::RawSpin;
use core::alloc::Layout;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use mem_trace_format::Block;
use mem_trace_format::{
    shard_of as region_shard, Shard, Slot, SlotArray, LARGE_SHARD as LARGE, REGION_SHIFT,
    SHARD_COUNT, SLOT_EMPTY as EMPTY, SLOT_MOVING as TOMBSTONE,
};

/// Blocks larger than one region go to the large shard (docs/LAYOUT.md).
const REGION_BYTES: u64 = 1 << REGION_SHIFT;
const MULT: u64 = 0x9E37_79B9_7F4A_7C15;
const MIN_CAPACITY: u64 = 64;

/// The shards, in the order `docs/LAYOUT.md` gives; the last one holds large blocks.
pub static SHARDS: [Shard; SHARD_COUNT] = [const { Shard::new() }; SHARD_COUNT];

/// A shard's writer lock: its layout lock word.
#[inline(always)]
fn lock_of(shard: &Shard) -> &RawSpin {
    RawSpin::of(&shard.lock)
}

/// Where each shard's slots are and how many, for [`prefetch`], which may not read a slot
/// array (without the lock, the array may be unmapped under it). Not exported: a hint only.
struct Hint {
    slots: AtomicPtr<Slot>,
    capacity: AtomicU64,
}

static HINTS: [Hint; SHARD_COUNT] = [const {
    Hint {
        slots: AtomicPtr::new(ptr::null_mut()),
        capacity: AtomicU64::new(0),
    }
}; SHARD_COUNT];

/// `print_trace` calls that are reading a shard without its lock; growth must not free an old
/// array while one is in progress.
static LOCKLESS_READERS: AtomicUsize = AtomicUsize::new(0);

/// Highest live count each shard reached. Their sum bounds the process's peak from above and
/// equals it for programs that build up and then release (what the `live` benchmark does).
static PEAK_LIVE: [AtomicU64; SHARD_COUNT] = [const { AtomicU64::new(0) }; SHARD_COUNT];

/// Sum of the shards' peak live counts (each an upper bound of its shard's share).
pub(crate) fn peak_live() -> u64 {
    PEAK_LIVE.iter().map(|p| p.load(Ordering::Relaxed)).sum()
}

/// Adds `delta` (wrapping, so subtraction is adding the negation) to a counter that only
/// writers holding the shard's lock change. A plain load and store: a locked read-modify-write
/// costs ~20 cycles and the shard lock already orders writers; the counters stay atomics so
/// that lockless readers (`totals`, gdb) read whole values.
#[inline(always)]
fn bump(counter: &AtomicU64, delta: u64) -> u64 {
    let v = counter.load(Ordering::Relaxed).wrapping_add(delta);
    counter.store(v, Ordering::Relaxed);
    v
}

fn shard_index(shard: &Shard) -> usize {
    (shard as *const Shard as usize - SHARDS.as_ptr() as usize) / core::mem::size_of::<Shard>()
}

fn shard_for(addr: u64, size: u64) -> usize {
    if size > REGION_BYTES {
        LARGE
    } else {
        region_shard(addr >> REGION_SHIFT)
    }
}

fn array_layout(capacity: u64) -> Layout {
    let bytes =
        core::mem::size_of::<SlotArray>() + capacity as usize * core::mem::size_of::<Slot>();
    Layout::from_size_align(bytes, 64).expect("slot array layout")
}

/// # Safety
/// - `arr` must be a live slot array and `i < capacity`.
unsafe fn slot<'a>(arr: *mut SlotArray, i: u64) -> &'a Slot {
    // SAFETY: guaranteed by the caller; slots follow the head contiguously.
    unsafe { &*(arr.add(1) as *const Slot).add(i as usize) }
}

/// Home slot of `addr`: the hash scaled onto `[0, capacity)` by a multiply-shift, so any
/// capacity works, not only powers of two. (Keeping neighbouring blocks in neighbouring slots,
/// by hashing only 1 KiB granules, measured no better on python3, sqlite3 and `live`; hashing
/// 64 KiB regions clustered badly.)
fn home(addr: u64, capacity: u64) -> u64 {
    ((u128::from(addr.wrapping_mul(MULT)) * u128::from(capacity)) >> 64) as u64
}

fn next_slot(i: u64, capacity: u64) -> u64 {
    if i + 1 == capacity {
        0
    } else {
        i + 1
    }
}

/// Starts loading the table line where `addr` (a block of `size` bytes) would be inserted or
/// looked up, so that the miss (one per insert and per remove once the table outgrows the
/// cache: python3's 200k live blocks) overlaps the stack capture done before the table is
/// touched.
#[inline(always)]
pub(crate) fn prefetch(addr: u64, size: u64) {
    let hint = &HINTS[shard_for(addr, size)];
    let slots = hint.slots.load(Ordering::Relaxed);
    let cap = hint.capacity.load(Ordering::Relaxed);
    // A racing rebuild may pair an old pointer with a new capacity: the line computed is then
    // wrong or unmapped, which costs nothing (a prefetch never faults).
    crate::prefetch::line(slots.wrapping_add(home(addr, cap) as usize).cast());
}

/// Records a new live block. Never fails loudly: `false` when no memory is left for the table
/// (the block goes untracked, and the caller counts it).
#[must_use]
pub fn insert(block: Block) -> bool {
    let shard = &SHARDS[shard_for(block.addr, block.size)];
    lock_of(shard).lock();
    let ok = locked_insert(shard, block);
    lock_of(shard).unlock();
    ok
}

/// Inserts with the shard's lock held. Kept out of line and named so that tests can stop a
/// thread here (holding the lock) and check that `print_trace` still answers.
#[inline(never)]
pub(crate) fn locked_insert(shard: &Shard, block: Block) -> bool {
    let Some(arr) = room_for_one(shard) else {
        return false;
    };
    // SAFETY: `arr` is the shard's live array and we hold the shard's lock.
    unsafe { put(shard, arr, block) };
    true
}

/// # Safety
/// - the shard's lock is held and `arr` is its array, with at least one empty slot.
unsafe fn put(shard: &Shard, arr: *mut SlotArray, block: Block) {
    // SAFETY: `arr` is live (caller).
    let cap = unsafe { (*arr).capacity };
    let mut i = home(block.addr, cap);
    let target = loop {
        // SAFETY: `i < cap`.
        let s = unsafe { slot(arr, i) };
        match s.addr.load(Ordering::Relaxed) {
            EMPTY => break i,
            a if a == block.addr => {
                // A block we never saw freed (freed by a path we do not hook): the new one
                // replaces it in place.
                let old = Block::unpack(a, s.size_thread.load(Ordering::Relaxed), 0);
                bump(&shard.live, 1u64.wrapping_neg());
                bump(&shard.live_bytes, old.size.wrapping_neg());
                s.addr.store(TOMBSTONE, Ordering::Release);
                break i;
            }
            _ => {}
        }
        i = next_slot(i, cap);
    };
    // SAFETY: `target < cap`.
    let s = unsafe { slot(arr, target) };
    let (size_thread, seq_stack) = block.pack();
    s.size_thread.store(size_thread, Ordering::Relaxed);
    s.seq_stack.store(seq_stack, Ordering::Relaxed);
    s.addr.store(block.addr, Ordering::Release);
    let live = bump(&shard.live, 1);
    bump(&shard.live_bytes, block.size);
    let idx = shard_index(shard);
    // Written only under this shard's lock, like the counters.
    if live > PEAK_LIVE[idx].load(Ordering::Relaxed) {
        PEAK_LIVE[idx].store(live, Ordering::Relaxed);
    }
}

/// Makes sure the shard's array can take one more entry, growing (or cleaning tombstones)
/// when three quarters of it are used. Lock held by the caller.
fn room_for_one(shard: &Shard) -> Option<*mut SlotArray> {
    let arr = shard.array.load(Ordering::Relaxed);
    let live = shard.live.load(Ordering::Relaxed);
    let used = live + shard.tombstones.load(Ordering::Relaxed) + 1;
    let cap = if arr.is_null() {
        0
    } else {
        // SAFETY: non-null arrays are live while the lock is held.
        unsafe { (*arr).capacity }
    };
    // Grow at 7/8 full: slots are 24 bytes, so the load factor is most of the tracer's memory
    // per live block (`live` benchmark: ~37 B at this bound, ~45 B at 3/4). Linear probing
    // stays short on average because growth lowers the load to 0.7.
    if cap != 0 && used * 8 <= cap * 7 {
        return Some(arr);
    }
    let new_cap = if cap == 0 {
        MIN_CAPACITY
    } else if (live + 1) * 8 > cap * 5 {
        // Grow by a quarter: doubling overshoots (1M blocks over 128 shards is 7.8k each,
        // just over 7/8 of 8192, and doubling to 16384 halved the load). Measured on 1M live
        // blocks: 48% load doubling, 64% growing by half, 75% by a quarter.
        cap + cap / 4
    } else {
        cap // mostly tombstones: rebuild at the same size
    };
    rebuild(shard, arr, new_cap)
}

/// Arrays at least this large are their own mapping (the arena maps anything over 4 KiB).
const POPULATE_MIN: usize = 64 << 10;

/// Backs a new array's pages at once: the rebuild writes slots all over it, and a table
/// growing by quarters maps ~5x its final size over its life, one page fault each (on `live`,
/// 62,000 of the run's 89,000 faults, most of its kernel time). One `madvise` faults them in
/// without a trap per page. Only a hint: on kernels without `MADV_POPULATE_WRITE` (before
/// 5.14) it fails and the pages fault in as before.
fn populate(p: *mut u8, len: usize) {
    if len >= POPULATE_MIN {
        // SAFETY: `p..p+len` is a fresh anonymous mapping of ours (the arena maps large
        // blocks on their own, page-aligned); populating changes no content (zero pages).
        unsafe { libc::madvise(p.cast(), len, libc::MADV_POPULATE_WRITE) };
    }
}

#[cold]
#[inline(never)]
fn rebuild(shard: &Shard, old: *mut SlotArray, new_cap: u64) -> Option<*mut SlotArray> {
    let layout = array_layout(new_cap);
    // Zeroed: all slots EMPTY.
    let new = arena::allocate_zeroed(layout) as *mut SlotArray;
    if new.is_null() {
        return None;
    }
    populate(new.cast(), layout.size());
    // SAFETY: `new` is ours until published.
    unsafe { (*new).capacity = new_cap };
    if !old.is_null() {
        // SAFETY: lock held; `old` is the live array.
        let old_cap = unsafe { (*old).capacity };
        // Counted aside and stored once at the end: `remove_from` reads `live` without the
        // lock to skip empty shards, and a count reset to 0 for the rebuild made it miss a
        // block another thread's rebuild was moving (the 8-thread stress test: a realloc of
        // a live block reported as invalid).
        let (mut live, mut live_bytes) = (0u64, 0u64);
        for i in 0..old_cap {
            // SAFETY: `i < old_cap`.
            let s = unsafe { slot(old, i) };
            let a = s.addr.load(Ordering::Relaxed);
            if a > TOMBSTONE {
                let b = Block::unpack(
                    a,
                    s.size_thread.load(Ordering::Relaxed),
                    s.seq_stack.load(Ordering::Relaxed),
                );
                // SAFETY: `new` is unpublished and larger than the live count.
                unsafe { put_fresh(new, b) };
                live += 1;
                live_bytes += b.size;
            }
        }
        shard.live.store(live, Ordering::Relaxed);
        shard.live_bytes.store(live_bytes, Ordering::Relaxed);
    }
    shard.tombstones.store(0, Ordering::Relaxed);
    shard.array.store(new, Ordering::SeqCst);
    let hint = &HINTS[shard_index(shard)];
    // SAFETY: the slots follow the head (capacity 0 makes a stale pointer harmless anyway).
    hint.slots
        .store(unsafe { new.add(1) }.cast(), Ordering::Relaxed);
    hint.capacity.store(new_cap, Ordering::Relaxed);
    if !old.is_null() {
        // A lockless reader that loaded `old` before the switch registered itself first (both
        // sides are SeqCst), so either we see it and keep `old`, or it sees `new`.
        if LOCKLESS_READERS.load(Ordering::SeqCst) == 0 {
            // SAFETY: unpublished and unread; allocated from the arena with this layout.
            unsafe { arena::release(old.cast(), array_layout((*old).capacity)) };
        }
    }
    Some(new)
}

/// # Safety
/// - `arr` is unpublished (no other reader or writer) and has an empty slot.
unsafe fn put_fresh(arr: *mut SlotArray, b: Block) {
    // SAFETY: caller.
    let cap = unsafe { (*arr).capacity };
    let mut i = home(b.addr, cap);
    loop {
        // SAFETY: `i < cap`.
        let s = unsafe { slot(arr, i) };
        if s.addr.load(Ordering::Relaxed) == EMPTY {
            let (st, ss) = b.pack();
            s.size_thread.store(st, Ordering::Relaxed);
            s.seq_stack.store(ss, Ordering::Relaxed);
            s.addr.store(b.addr, Ordering::Relaxed);
            return;
        }
        i = next_slot(i, cap);
    }
}

/// Forgets the block starting at `addr` and returns what was recorded, or `None` if the
/// address is not a tracked block start.
pub(crate) fn remove(addr: u64) -> Option<Block> {
    let region = &SHARDS[region_shard(addr >> REGION_SHIFT)];
    if let Some(b) = remove_from(region, addr) {
        return Some(b);
    }
    remove_from(&SHARDS[LARGE], addr)
}

fn remove_from(shard: &Shard, addr: u64) -> Option<Block> {
    if shard.live.load(Ordering::Relaxed) == 0 {
        return None;
    }
    lock_of(shard).lock();
    let r = locked_remove(shard, addr);
    lock_of(shard).unlock();
    r
}

fn locked_remove(shard: &Shard, addr: u64) -> Option<Block> {
    let arr = shard.array.load(Ordering::Relaxed);
    if arr.is_null() {
        return None;
    }
    // SAFETY: lock held; array live.
    let cap = unsafe { (*arr).capacity };
    let mut i = home(addr, cap);
    for _ in 0..cap {
        // SAFETY: `i < cap`.
        let s = unsafe { slot(arr, i) };
        match s.addr.load(Ordering::Relaxed) {
            EMPTY => return None,
            a if a == addr => {
                let b = Block::unpack(
                    a,
                    s.size_thread.load(Ordering::Relaxed),
                    s.seq_stack.load(Ordering::Relaxed),
                );
                s.addr.store(TOMBSTONE, Ordering::Release);
                // SAFETY: lock held; `i < cap`; the array keeps at least one empty slot.
                unsafe { close_gap(arr, cap, i) };
                bump(&shard.live, 1u64.wrapping_neg());
                bump(&shard.live_bytes, b.size.wrapping_neg());
                return Some(b);
            }
            _ => {}
        }
        i = next_slot(i, cap);
    }
    None
}

/// Backward-shift deletion: moves later entries of the probe run into the hole at `hole` so
/// that no tombstone is left behind. Tombstones made a table under constant churn (python3:
/// millions of frees) sit at its growth threshold, and every insert probed past them.
///
/// A moved entry is written into its new slot (fields, then `addr` with release) before its
/// old slot is marked `TOMBSTONE`, so a lockless reader or a core taken halfway sees it once
/// or twice, never zero times; `TOMBSTONE` now only marks a slot in the middle of a move.
///
/// # Safety
/// - the shard's lock is held, `arr` is its array with `cap` slots, `hole < cap`, and the
///   array has at least one empty slot.
unsafe fn close_gap(arr: *mut SlotArray, cap: u64, mut hole: u64) {
    let mut j = hole;
    loop {
        j = next_slot(j, cap);
        // SAFETY: `j < cap`.
        let sj = unsafe { slot(arr, j) };
        let a = sj.addr.load(Ordering::Relaxed);
        if a == EMPTY {
            break;
        }
        // The entry at `j` may fill the hole only if its home is not cyclically in (hole, j].
        let k = home(a, cap);
        let stays = if hole <= j {
            hole < k && k <= j
        } else {
            hole < k || k <= j
        };
        if stays {
            continue;
        }
        // SAFETY: `hole < cap`.
        let sh = unsafe { slot(arr, hole) };
        sh.size_thread
            .store(sj.size_thread.load(Ordering::Relaxed), Ordering::Relaxed);
        sh.seq_stack
            .store(sj.seq_stack.load(Ordering::Relaxed), Ordering::Relaxed);
        sh.addr.store(a, Ordering::Release);
        sj.addr.store(TOMBSTONE, Ordering::Release);
        hole = j;
    }
    // SAFETY: `hole < cap`.
    unsafe { slot(arr, hole) }
        .addr
        .store(EMPTY, Ordering::Release);
}

/// How a lookup got its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Every shard consulted was locked while reading.
    Locked,
    /// Some shard's lock was held elsewhere (a thread stopped by the debugger, or the calling
    /// thread itself); it was read without the lock.
    Lockless,
}

/// Finds the block that contains `addr`, for `print_trace`. Never waits on a lock for long:
/// a shard whose lock stays busy is read without it, which is safe because arrays are only
/// freed when no lockless reader is active.
pub fn find_containing(addr: u64) -> (Option<Block>, Access) {
    let mut found = None;
    let access = read_near(addr, |b| {
        if b.contains(addr) {
            found = Some(b);
        }
    });
    (found, access)
}

/// The live block that starts nearest below `addr` among blocks at most one region away (for
/// describing a pointer no block holds). Reads as [`find_containing`] does.
pub fn nearest_below(addr: u64) -> Option<Block> {
    let mut best: Option<Block> = None;
    read_near(addr, |b| {
        if b.addr <= addr && best.is_none_or(|n| b.addr > n.addr) {
            best = Some(b);
        }
    });
    best
}

/// Calls `f` on the live blocks of every shard where a block holding `addr` could be (its
/// region's, the region before's, the large one), saying whether any was read without its
/// lock.
fn read_near(addr: u64, mut f: impl FnMut(Block)) -> Access {
    let region = addr >> REGION_SHIFT;
    let mut candidates = [region_shard(region), LARGE, LARGE];
    if region > 0 {
        candidates[2] = region_shard(region - 1);
    }
    let mut access = Access::Locked;
    for (n, &idx) in candidates.iter().enumerate() {
        if !candidates[..n].contains(&idx) && read_shard(&SHARDS[idx], &mut f) {
            access = Access::Lockless;
        }
    }
    access
}

/// Calls `f` on the live blocks of `shard`, read under its lock when the lock comes within
/// about a millisecond, otherwise without it, as a registered lockless reader (then returns
/// `true`).
fn read_shard(shard: &Shard, f: &mut impl FnMut(Block)) -> bool {
    if try_lock_briefly(lock_of(shard)) {
        scan(shard, f);
        lock_of(shard).unlock();
        return false;
    }
    LOCKLESS_READERS.fetch_add(1, Ordering::SeqCst);
    scan(shard, f);
    LOCKLESS_READERS.fetch_sub(1, Ordering::SeqCst);
    true
}

/// Tries a lock for about a millisecond: enough for a running holder to finish its few dozen
/// instructions, short enough that a holder stopped by gdb costs nothing noticeable.
fn try_lock_briefly(lock: &RawSpin) -> bool {
    for i in 0..200 {
        if lock.try_lock() {
            return true;
        }
        if i > 20 {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            core::hint::spin_loop();
        }
    }
    false
}

fn scan(shard: &Shard, f: &mut impl FnMut(Block)) {
    let arr = shard.array.load(Ordering::SeqCst);
    if arr.is_null() {
        return;
    }
    // SAFETY: arrays stay allocated while we hold the lock or are a registered lockless reader.
    let cap = unsafe { (*arr).capacity };
    for i in 0..cap {
        // SAFETY: `i < cap`.
        let s = unsafe { slot(arr, i) };
        let a = s.addr.load(Ordering::Acquire);
        if a > TOMBSTONE {
            f(Block::unpack(
                a,
                s.size_thread.load(Ordering::Relaxed),
                s.seq_stack.load(Ordering::Relaxed),
            ));
        }
    }
}

/// Calls `f` on every live block, shard by shard, for the profiler's leak scan. Each shard is
/// read under its lock when the lock comes within about a millisecond (so a shard's
/// allocating threads wait at most for the copy of that one shard), otherwise without it, as
/// a registered lockless reader. A block being moved inside its shard may be seen twice:
/// callers deduplicate by address.
pub(crate) fn for_each_block(mut f: impl FnMut(Block)) {
    for shard in &SHARDS {
        if shard.live.load(Ordering::Relaxed) != 0 {
            read_shard(shard, &mut f);
        }
    }
}

/// Live blocks and bytes over all shards (approximate while threads run).
pub fn totals() -> (u64, u64) {
    SHARDS.iter().fold((0, 0), |(n, b), s| {
        (
            n + s.live.load(Ordering::Relaxed),
            b + s.live_bytes.load(Ordering::Relaxed),
        )
    })
}

/// Bytes of slot arrays currently allocated (for `MEM_TRACE_STATS`).
pub(crate) fn slot_bytes() -> u64 {
    SHARDS
        .iter()
        .map(|s| {
            let arr = s.array.load(Ordering::Acquire);
            if arr.is_null() {
                0
            } else {
                // SAFETY: published arrays are live until replaced; a stale read only skews
                // a statistic.
                array_layout(unsafe { (*arr).capacity }).size() as u64
            }
        })
        .sum()
}

/// Locks every shard (fork prepare handler).
pub(crate) fn lock_all() {
    for s in &SHARDS {
        lock_of(s).lock();
    }
}

/// Unlocks every shard (fork parent and child handlers).
pub(crate) fn unlock_all() {
    for s in &SHARDS {
        lock_of(s).unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64, size: u64, seq: u64) -> Block {
        Block {
            addr,
            size,
            thread: 3,
            seq,
            stack: 7,
        }
    }

    // The table is global: each test uses its own address range.
    #[test]
    fn insert_find_remove() {
        let base = 0x1_0000_0000u64;
        for i in 0..10_000u64 {
            assert!(insert(block(base + i * 64, 48, i)));
        }
        let (b, access) = find_containing(base + 64 * 77 + 10);
        assert_eq!(access, Access::Locked);
        assert_eq!(b, Some(block(base + 64 * 77, 48, 77)));
        assert_eq!(
            find_containing(base + 64 * 77 + 48).0,
            None,
            "one past the end"
        );
        assert_eq!(remove(base + 64 * 77), Some(block(base + 64 * 77, 48, 77)));
        assert_eq!(remove(base + 64 * 77), None);
        assert_eq!(find_containing(base + 64 * 77).0, None);
        for i in 0..10_000u64 {
            if i != 77 {
                assert!(remove(base + i * 64).is_some(), "block {i}");
            }
        }
    }

    #[test]
    fn large_blocks_span_regions() {
        let base = 0x2_0000_0000u64;
        assert!(insert(block(base, 1 << 20, 1)));
        let (b, _) = find_containing(base + (1 << 19));
        assert_eq!(b.map(|b| b.addr), Some(base));
        // A block just under a region long, starting late in a region, is found from the next.
        assert!(insert(block(base + (3 << 20) + 0xff00, 0x1000, 2)));
        let (b, _) = find_containing(base + (3 << 20) + 0x10000 + 0x10);
        assert_eq!(b.map(|b| b.seq), Some(2));
        assert!(remove(base).is_some());
        assert!(remove(base + (3 << 20) + 0xff00).is_some());
    }

    #[test]
    fn removals_leave_every_other_block_findable() {
        // Dense addresses in one region collide on probe runs, so deletions shift entries.
        let base = 0x4_0000_0000u64;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut live = std::collections::BTreeSet::new();
        for round in 0..20_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let a = base + (rng % 3000) * 16;
            if live.remove(&a) {
                assert_eq!(remove(a).map(|b| b.addr), Some(a), "round {round}");
            } else {
                assert!(insert(block(a, 16, round)));
                live.insert(a);
            }
        }
        for &a in &live {
            assert_eq!(find_containing(a + 8).0.map(|b| b.addr), Some(a));
        }
        let shard = &SHARDS[region_shard(base >> REGION_SHIFT)];
        assert_eq!(shard.tombstones.load(Ordering::Relaxed), 0);
        for &a in &live {
            assert!(remove(a).is_some());
        }
    }

    /// Another thread rebuilding the shard never hides a live block from `remove` (which
    /// skips empty shards without the lock: a count reset for the rebuild once made a
    /// realloc of a live block look invalid under contention, 7% of 8-thread stress runs).
    #[test]
    fn a_rebuild_elsewhere_never_hides_a_block_from_remove() {
        let base = 0x5_0000_0000u64;
        let shard = &SHARDS[shard_for(base, 16)];
        // A large, empty array (one region holds 4096 16-byte blocks), so that a rebuild
        // scans a while before it meets the block.
        for i in 1..4000u64 {
            assert!(insert(block(base + i * 16, 16, i)));
        }
        for i in 1..4000u64 {
            assert!(remove(base + i * 16).is_some());
        }
        let started = AtomicU64::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    lock_of(shard).lock();
                    started.fetch_add(1, Ordering::SeqCst);
                    let arr = shard.array.load(Ordering::Relaxed);
                    // SAFETY: the lock is held and `arr` is the shard's live array.
                    let cap = unsafe { (*arr).capacity };
                    rebuild(shard, arr, cap).expect("memory for a rebuild");
                    lock_of(shard).unlock();
                    std::thread::yield_now();
                }
            });
            // No assert inside the scope: a panic here would leave the rebuilder running.
            let mut missed = None;
            for round in 0..2_000u64 {
                assert!(insert(block(base, 16, round)));
                // Remove while a rebuild is under way, at a different point of it each round
                // (it first maps its new array, then moves the entries).
                let before = started.load(Ordering::SeqCst);
                while started.load(Ordering::SeqCst) == before {
                    core::hint::spin_loop();
                }
                for _ in 0..(round % 128) * 64 {
                    core::hint::spin_loop();
                }
                if remove(base).map(|b| b.seq) != Some(round) {
                    missed = Some(round);
                    remove(base);
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            assert_eq!(missed, None, "a live block not found during a rebuild");
        });
    }

    #[test]
    fn reinserting_a_stale_address_replaces_it() {
        let a = 0x3_0000_0000u64;
        assert!(insert(block(a, 16, 1)));
        assert!(insert(block(a, 32, 2)));
        assert_eq!(remove(a).map(|b| b.seq), Some(2));
        assert_eq!(remove(a), None);
    }
}
