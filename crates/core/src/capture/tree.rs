//! The call tree: every distinct walk, named by a node per frame. A node is a return address
//! under its caller's node, so a stack that shares its outer frames with one walked before
//! is named by looking up only its new inner frames — and a walk taken over from an earlier
//! one inherits the nodes of the steps it took (heaptrack's trace tree, here to name walks).
//!
//! Why: interning a stack by its frames costs a hash over all of them and a comparison with
//! the stored record, on every capture; an interpreter's stacks are 40-80 frames deep and
//! tens of thousands distinct, so most captures missed the per-thread intern cache and took
//! the shard lock, hashed ~64 frames serially and compared them (≈ a quarter of the `deep`
//! benchmark's time). With the tree, the capture's leaf node carries the stack id it was
//! interned as, and the flat store is asked only once per node.
//!
//! Nodes live in the arena, in chunks that never move or die, exported (docs/LAYOUT.md "Call
//! tree"): a stack record may name its frames by the node of its innermost frame instead of
//! holding them (see `store::stacks`). Once the store reaches its cap on distinct stacks
//! (`MEM_TRACE_MAX_STACKS`), the tree stops growing with it ([`stop_growing`]): nodes already
//! made are still found, and a walk the tree cannot name is named by its frames. Lookups go
//! through a per-thread direct-mapped cache and, on a miss, one of 16 hash-sharded tables
//! under a spin lock, both keyed by the path hash (see [`path_hash`]).

use crate::arena::{self, Arena};
use crate::narrow;
use crate::sync::SpinLock;
use core::alloc::Layout;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use hashbrown::HashTable;
use mem_trace_format::{
    CallTree, TreeNode as Node, TREE_CHUNKS as CHUNKS, TREE_CHUNK_BITS as CHUNK_BITS,
};

const SHARDS: usize = 16;
/// Entries of a thread's cache of lookups (256 KiB, resident only as used): the `deep`
/// benchmark's 54k nodes missed 58% of lookups in 4096 entries, 23% in 32768.
pub(super) const CACHE: usize = 16384;

/// The exported tree: a node is a frame of a walk under the node of its caller's frame; its
/// `stack` is the id the walk ending at it was interned as (0: not yet).
pub static TREE: CallTree = CallTree {
    count: AtomicU64::new(0),
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};
/// Nodes handed out; ids are 1..=COUNT (0 is the root: no caller). Mirrored in `TREE.count`
/// for readers, after each node is written.
static COUNT: SpinLock<u32> = SpinLock::new(0);
/// New nodes may be made (until [`stop_growing`]).
static GROWING: AtomicBool = AtomicBool::new(true);

/// `(part of the hash, node id)`, placed by `narrow::spread` of the part.
type Index = HashTable<(u32, u32), Arena>;
static INDEX: [SpinLock<Index>; SHARDS] =
    [const { SpinLock::new(HashTable::new_in(Arena)) }; SHARDS];

/// A thread's cached lookup: `(parent, pc)` named `node`. All zero: empty (no frame is at
/// address 0).
#[derive(Clone, Copy, Default)]
pub(super) struct Entry {
    pc: u64,
    parent: u32,
    node: u32,
}

fn node(id: u32) -> Option<&'static Node> {
    let chunk = TREE
        .dir
        .get((id >> CHUNK_BITS) as usize)?
        .load(Ordering::Acquire);
    if id == 0 || chunk.is_null() {
        return None;
    }
    // SAFETY: a chunk holds 2^CHUNK_BITS nodes and the index is masked into range; a node is
    // written before its id is handed out (under its shard's lock) and never changes but for
    // its atomic stack id.
    Some(unsafe { &*chunk.add((id & ((1 << CHUNK_BITS) - 1)) as usize) })
}

/// The path hash of the outermost frame's caller (see [`path_hash`]).
pub(super) const ROOT_PATH: u64 = 0x243f_6a88_85a3_08d3;

/// The path hash of frame `pc` under a caller whose path hash is `up`: a function of the
/// frames from the outermost in, which chooses the frame's entry in a thread's cache of
/// lookups and its place in the shared index. Chosen by the node of the caller, an entry
/// could only be found once the lookup before it had returned: naming a walk's new steps was
/// a chain of dependent misses, ~30% of the `deep` benchmark. From the return addresses
/// alone, every new step's entry is known before the first lookup, and all of them load at
/// once ([`prefetch`]). An entry is still taken only for its exact `(parent, pc)`.
#[inline(always)]
pub(super) fn path_hash(up: u64, pc: u64) -> u64 {
    let m = u128::from(up ^ 0x1319_8a2e_0370_7344) * u128::from(pc ^ 0xa409_3822_299f_31d0);
    (m as u64) ^ ((m >> 64) as u64)
}

/// Starts loading the cache entry of path hash `path`.
#[inline(always)]
pub(super) fn prefetch(cache: &[Entry; CACHE], path: u64) {
    crate::prefetch::line((&cache[(path as usize) & (CACHE - 1)] as *const Entry).cast());
}

/// The node of frame `pc` called from `parent` (0: the outermost frame), whose path hash is
/// `path`, made if new and `make` allows; 0 when it is new and may not be made, or when no id
/// or memory is left (the caller then names the stack by its frames).
#[inline(always)]
pub(super) fn child(
    cache: &mut [Entry; CACHE],
    path: u64,
    parent: u32,
    pc: u64,
    make: bool,
) -> u32 {
    let e = &mut cache[(path as usize) & (CACHE - 1)];
    if e.pc == pc && e.parent == parent {
        return e.node;
    }
    // The shared index is keyed by the path hash as well, not by `(parent, pc)`: its probe
    // then needs no node id, so it need not wait for the lookup of the caller's step, and no
    // second hash is made (`deep`, profile mode: 3-5% in two A/B runs, within the machine's
    // noise). Both name the node alike: it is found by its exact `(parent, pc)`, and a node's
    // path hash is a function of its path, which its parent names.
    let id = find_or_make(&GROWING, make, path, parent, pc);
    if id != 0 {
        *e = Entry {
            pc,
            parent,
            node: id,
        };
    }
    id
}

/// The node of `(parent, pc)` (whose path hash is `h`), made if new, `may_make` and
/// `growing`.
#[inline(never)]
fn find_or_make(growing: &AtomicBool, may_make: bool, h: u64, parent: u32, pc: u64) -> u32 {
    // The shard from bits the table itself does not use: hashbrown places entries by the low
    // bits and tells them apart in a group by the top 7. Sharding by the top 4 left 3 bits
    // to tell entries apart, so a probe compared ~1 in 8 entries of its group in full.
    // SAFETY: called inside the guard, from a capture; the index is used nowhere else but
    // the fork handlers, which run on this thread outside the guard. With one thread, the
    // lock's `lock cmpxchg` was ~2.5% of the `deep` benchmark in profile mode.
    let mut index = unsafe { INDEX[(h >> 48) as usize % SHARDS].lock_unless_alone() };
    let p = narrow::part(h);
    let same = |&(ep, id): &(u32, u32)| {
        ep == p && node(id).is_some_and(|n| n.pc == pc && n.parent == parent)
    };
    if let Some(&(_, id)) = index.find(narrow::spread(p), same) {
        return id;
    }
    // Read only here, where a node would be made: a lookup that finds one never pays for it.
    if !may_make || !growing.load(Ordering::Relaxed) {
        return 0;
    }
    // Room first: `insert_unique` aborts the program when it cannot grow the table.
    if index.try_reserve(1, |&(ep, _)| narrow::spread(ep)).is_err() {
        return 0;
    }
    let Some(id) = make(parent, pc) else {
        return 0;
    };
    index.insert_unique(narrow::spread(p), (p, id), |&(ep, _)| narrow::spread(ep));
    id
}

fn make(parent: u32, pc: u64) -> Option<u32> {
    let mut count = COUNT.lock();
    let id = *count + 1;
    let slot = TREE.dir.get((id >> CHUNK_BITS) as usize)?;
    let mut chunk = slot.load(Ordering::Relaxed);
    if chunk.is_null() {
        let layout = Layout::array::<Node>(1 << CHUNK_BITS).ok()?;
        // Never freed: nodes are permanent, like stack records.
        chunk = arena::allocate(layout) as *mut Node;
        if chunk.is_null() {
            return None;
        }
        slot.store(chunk, Ordering::Release);
    }
    // SAFETY: index masked into the chunk; the slot is unused (ids are handed out once, under
    // this lock) and no reader sees it before the id is published by the index insert.
    unsafe {
        chunk
            .add((id & ((1 << CHUNK_BITS) - 1)) as usize)
            .write(Node {
                pc,
                parent,
                stack: AtomicU32::new(0),
            })
    };
    *count = id;
    TREE.count.store(u64::from(id), Ordering::Release);
    Some(id)
}

/// The frames of the walk ending at node `id`, innermost first, out to the outermost: each
/// node's pc, then its parent's. Lock-free: nodes never move or change.
pub(crate) fn path(id: u32) -> impl Iterator<Item = u64> {
    core::iter::successors(node(id), |n| node(n.parent)).map(|n| n.pc)
}

/// The stack id the walk ending at `node` was interned as; 0 when not known yet.
#[inline(always)]
pub(super) fn stack_of(id: u32) -> u32 {
    node(id).map_or(0, |n| n.stack.load(Ordering::Relaxed))
}

/// Notes that the walk ending at `node` was interned as `stack`.
pub(super) fn set_stack(id: u32, stack: u32) {
    if let Some(n) = node(id) {
        n.stack.store(stack, Ordering::Relaxed);
    }
}

/// Whether new nodes may still be made (see [`stop_growing`]).
pub(super) fn growing() -> bool {
    GROWING.load(Ordering::Relaxed)
}

/// Makes no new node from now on (the stack store reached its cap): a node per new frame
/// would grow without limit for the stacks the store no longer keeps whole.
pub(crate) fn stop_growing() {
    GROWING.store(false, Ordering::Relaxed);
}

/// Nodes made so far.
pub(crate) fn count() -> u32 {
    *COUNT.lock()
}

/// Locks everything (fork prepare handler).
pub(crate) fn lock_all() {
    for t in &INDEX {
        t.raw().lock();
    }
    COUNT.raw().lock();
}

/// Unlocks everything (fork parent and child handlers).
pub(crate) fn unlock_all() {
    COUNT.raw().unlock();
    for t in &INDEX {
        t.raw().unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup at the path hash of `pc` under the root's, whatever `parent` is: entries are
    /// taken by their exact `(parent, pc)`, so any path works, only slower when it collides.
    fn at(cache: &mut [Entry; CACHE], parent: u32, pc: u64) -> u32 {
        child(cache, path_hash(ROOT_PATH, pc), parent, pc, true)
    }

    #[test]
    fn a_frame_under_the_same_caller_is_one_node() {
        let mut cache = [Entry::default(); CACHE];
        let root = at(&mut cache, 0, 0x5000_1000);
        let a = at(&mut cache, root, 0x5000_2000);
        let b = at(&mut cache, root, 0x5000_3000);
        assert!(root != 0 && a != 0 && b != 0);
        assert_ne!(a, b);
        assert_eq!(at(&mut cache, root, 0x5000_2000), a);
        // Another thread (an empty cache) finds the same nodes.
        let mut other = [Entry::default(); CACHE];
        assert_eq!(at(&mut other, root, 0x5000_2000), a);
        // The same pc under another caller is another node.
        let c = at(&mut other, a, 0x5000_3000);
        assert_ne!(c, b);
        assert_eq!(stack_of(c), 0);
        set_stack(c, 77);
        assert_eq!(stack_of(c), 77);
        assert_eq!(stack_of(0), 0);
    }

    #[test]
    fn a_tree_that_stopped_growing_finds_its_nodes_and_makes_none() {
        // The process's flag stays up: other tests name walks.
        let stopped = AtomicBool::new(false);
        let mut cache = [Entry::default(); CACHE];
        let root = at(&mut cache, 0, 0x6000_1000);
        let a = at(&mut cache, root, 0x6000_2000);
        let find = |parent, pc| find_or_make(&stopped, true, path_hash(ROOT_PATH, pc), parent, pc);
        assert_eq!(find(0, 0x6000_1000), root);
        assert_eq!(find(root, 0x6000_2000), a);
        assert_eq!(find(root, 0x6000_3000), 0);
        assert_eq!(find(a, 0x6000_2000), 0);
        assert_eq!(find(0, 0x6000_4000), 0);
        // A walk the tree cannot name gets node 0, which names no stack.
        assert_eq!(stack_of(0), 0);
    }

    #[test]
    fn a_lookup_that_may_not_make_finds_nodes_and_makes_none() {
        let mut cache = [Entry::default(); CACHE];
        let root = at(&mut cache, 0, 0x6800_1000);
        let a = at(&mut cache, root, 0x6800_2000);
        // From the shared index (another thread's cache is empty), and from this one's.
        let mut other = [Entry::default(); CACHE];
        let path = path_hash(ROOT_PATH, 0x6800_2000);
        assert_eq!(child(&mut other, path, root, 0x6800_2000, false), a);
        assert_eq!(child(&mut cache, path, root, 0x6800_2000, false), a);
        // A new frame is not made: asked again, the shared index still does not have it.
        for _ in 0..2 {
            assert_eq!(child(&mut other, path, root, 0x6800_3000, false), 0);
            assert_eq!(child(&mut other, path, a, 0x6800_2000, false), 0);
        }
        let b = child(&mut other, path, root, 0x6800_3000, true);
        assert!(b != 0 && b != a);
        assert_eq!(child(&mut cache, path, root, 0x6800_3000, false), b);
    }

    #[test]
    fn lookups_sharing_a_cache_entry_keep_their_own_nodes() {
        let mut cache = [Entry::default(); CACHE];
        let root = at(&mut cache, 0, 0x7000_1000);
        // Every lookup at one path: each evicts the other's entry, none takes it.
        let path = 12345;
        let a = child(&mut cache, path, root, 0x7000_2000, true);
        let b = child(&mut cache, path, root, 0x7000_3000, true);
        let c = child(&mut cache, path, a, 0x7000_2000, true);
        assert!(a != 0 && b != 0 && c != 0);
        assert!(a != b && b != c && a != c);
        assert_eq!(child(&mut cache, path, root, 0x7000_2000, true), a);
        assert_eq!(child(&mut cache, path, a, 0x7000_2000, true), c);
        assert_eq!(child(&mut cache, path, root, 0x7000_3000, true), b);
        // The path hash is a function of the frames alone.
        let p = path_hash(path_hash(ROOT_PATH, 0x7000_1000), 0x7000_2000);
        assert_eq!(p, path_hash(path_hash(ROOT_PATH, 0x7000_1000), 0x7000_2000));
        assert_ne!(p, path_hash(path_hash(ROOT_PATH, 0x7000_2000), 0x7000_1000));
    }
}
