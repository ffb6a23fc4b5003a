//! A thread's unwinder state (`ThreadCache`): the rule cache, the last and kept walks,
//! framehop's cache; made on a thread's first capture, freed at its exit.

use super::cfi::{self, Kind, Rule};
use super::kept::{Kept, Shape, KEPT_SETS, KEPT_WAYS, NO_SHAPE, SHAPES};
use super::local::Local;
use super::modules::ModuleSet;
use super::rules::{set_index, Entry, Set, FIRST, SETS};
use super::signal;
use super::stack::Stack;
use super::trail::{Ending, Trail};
use super::tree;
use crate::arena::{zeroed_box, Arena, ArenaBox};
use allocator_api2::boxed::Box;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};

/// A thread's unwinder state (see the module documentation).
pub(super) struct ThreadCache {
    /// The module set the rules were computed from.
    pub(super) set: *const ModuleSet,
    pub(super) sets: ArenaBox<[Set; SETS]>,
    /// The last full walk, and the one being made (swapped at its end).
    pub(super) last: Trail,
    pub(super) next: Trail,
    /// Recent walks by stack (see [`Shape`]), the way of each set used last, and the kept
    /// walk that is the last one when a capture was wholly taken from one.
    pub(super) kept: ArenaBox<[Kept; KEPT_SETS * KEPT_WAYS]>,
    /// Each kept walk's [`Shape::key`] (0: empty), apart from the walks: a set's four ways
    /// are one line here, where in the walks (~1.9 KiB each) they were four lines a lookup
    /// loaded one after the other.
    pub(super) kept_keys: ArenaBox<[u64; KEPT_SETS * KEPT_WAYS]>,
    pub(super) kept_recent: [u8; KEPT_SETS],
    pub(super) shapes: ArenaBox<[Shape; SHAPES]>,
    pub(super) last_kept: Option<usize>,
    /// The kept walk the last capture repeated or was kept as, for `capture::remember_id`.
    pub(super) memo: Option<usize>,
    /// Recent call-tree lookups (see `tree`).
    pub(super) tree: ArenaBox<[tree::Entry; tree::CACHE]>,
    /// The node of the last capture's walk, for `capture::remember_id`.
    pub(super) node: u32,
    /// Framehop's own cache, for the frames it unwinds: made on the first such frame, when
    /// the stack has room for it (see [`FRAMEHOP_ROOM`]).
    pub(super) framehop: Option<ArenaBox<CacheX86_64>>,
    /// The lowest address of the stack this code runs on (the thread's, or its alternate
    /// signal stack in a handler), for [`room`].
    pub(super) floor: u64,
    pub(super) gimli: ArenaBox<cfi::Context>,
    /// Rules computed, frames handed to framehop, walks completed from the last one (for
    /// tests and tuning).
    pub(super) misses: u64,
    pub(super) framehop_frames: u64,
    pub(super) taken_over: u64,
    /// Captures wholly taken from a kept walk (for tests and tuning).
    pub(super) kept_hits: u64,
}

impl ThreadCache {
    /// A fresh state, its tables in the arena; `None` when no memory is left (the thread's
    /// captures then use framehop alone).
    pub(super) fn new() -> Option<ThreadCache> {
        // SAFETY: a zeroed entry has key 0 (never looked up) and a rule of integers, a bool
        // and `Kind` tag 0 (`CfaRsp`): all valid.
        let sets: ArenaBox<[Set; SETS]> = unsafe { zeroed_box() }?;
        Some(ThreadCache {
            set: core::ptr::null(),
            sets,
            last: Trail::new()?,
            next: Trail::new()?,
            // SAFETY: a zeroed kept walk is never found (its key is 0); its fields are integers,
            // `bool`s and `Ending`, whose primitive representation makes tag 0
            // `Fixed { false, false }`.
            kept: unsafe { zeroed_box() }?,
            // SAFETY: integers; 0 is an empty way.
            kept_keys: unsafe { zeroed_box() }?,
            kept_recent: [0; KEPT_SETS],
            // SAFETY: a zeroed shape is `NO_SHAPE`: integers only, all zero.
            shapes: unsafe { zeroed_box() }?,
            last_kept: None,
            memo: None,
            // SAFETY: a zeroed entry has pc 0, which no frame has: never a hit.
            tree: unsafe { zeroed_box() }?,
            node: 0,
            framehop: None,
            floor: 0,
            gimli: Box::try_new_in(cfi::Context::new_in(), Arena).ok()?,
            misses: 0,
            framehop_frames: 0,
            taken_over: 0,
            kept_hits: 0,
        })
    }

    /// Notes that the kept walk the last capture repeated or was kept as (if any) has frames
    /// interned as `id`, for captures into a buffer of `len` frames.
    pub(super) fn remember_kept(&mut self, id: u32, len: usize) {
        if let Some(k) = self.memo.take() {
            let kept = &mut self.kept[k];
            kept.stack_id = id;
            kept.id_len = len as u32;
        }
    }

    /// The rule for `key`, from the cache or computed.
    #[inline(always)]
    pub(super) fn rule(&mut self, set: &ModuleSet, key: u64) -> Rule {
        let i = set_index(key);
        let s = &self.sets[i];
        if s.0[0].key == key {
            s.0[0].rule
        } else if s.0[1].key == key {
            s.0[1].rule
        } else {
            self.miss(set, key, i)
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn miss(&mut self, set: &ModuleSet, key: u64, i: usize) -> Rule {
        if room(self.floor) < RULE_ROOM {
            // Not cached: with room, the same frame gets its real rule. Framehop, which would
            // unwind it, finds no room either, and the walk ends here, not reused.
            return Rule::FRAMEHOP;
        }
        self.misses += 1;
        let pc = key & !FIRST;
        let lookup = if key & FIRST != 0 { pc } else { pc - 1 };
        let rule = match set.find(pc) {
            Some(m) => cfi::rule_for(m, &mut self.gimli, lookup),
            None => Rule::OUTSIDE,
        };
        let s = &mut self.sets[i];
        s.0[1] = s.0[0];
        s.0[0] = Entry { key, rule };
        rule
    }

    /// A frame whose rule is not a CFA rule: the end of the stack, an unknown module (both
    /// end the walk), a signal handler's return into the kernel's signal frame, or a frame
    /// framehop unwinds. `Ok` holds the caller's registers and its cache key: for the frame
    /// a signal interrupted, its exact pc (`FIRST`), which is no return address.
    #[cold]
    #[inline(never)]
    pub(super) fn uncommon(
        &mut self,
        set: &ModuleSet,
        kind: Kind,
        first: bool,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
    ) -> Result<((u64, u64, u64), u64), Ending> {
        let outside = match kind {
            Kind::End => false,
            Kind::Outside => true,
            _ => {
                if let Some(m) = set.find(pc).filter(|_| !first) {
                    if let Some(regs) = signal::interrupted(stack, m.start..m.end, pc, sp) {
                        return Ok((regs, regs.0 | FIRST));
                    }
                }
                self.framehop_frames += 1;
                let Some(framehop) = self.framehop_cache() else {
                    return Err(Ending::Other);
                };
                let address = if first {
                    FrameAddress::InstructionPointer(pc)
                } else {
                    // Never None: a return address of 0 ended the walk before.
                    FrameAddress::from_return_address(pc).ok_or(Ending::Other)?
                };
                let mut regs = UnwindRegsX86_64::new(pc, sp, bp);
                let mut read = |a| stack.read(a).ok_or(());
                return match set
                    .unwinder
                    .unwind_frame(address, &mut regs, framehop, &mut read)
                {
                    Ok(Some(ra)) if ra != 0 => Ok(((ra, regs.sp(), regs.bp()), ra)),
                    _ => Err(Ending::Other),
                };
            }
        };
        Err(Ending::Fixed {
            outside,
            recorded: true,
        })
    }

    /// Framehop's cache, made now if need be, or `None` when the stack has no room for
    /// framehop here (the walk then ends, and is not reused) or no memory is left.
    fn framehop_cache(&mut self) -> Option<&mut CacheX86_64> {
        if room(self.floor) < FRAMEHOP_ROOM {
            return None;
        }
        if self.framehop.is_none() {
            self.framehop = Box::try_new_in(CacheX86_64::new(), Arena).ok();
        }
        self.framehop.as_deref_mut()
    }

    /// Forgets every walk: the next capture walks the whole stack.
    pub(super) fn forget(&mut self) {
        self.last.len = 0;
        self.last_kept = None;
        self.memo = None;
        self.kept_keys.fill(0);
        self.shapes.fill(NO_SHAPE);
    }
}

/// Stack a rule's computation needs below the frame that asks for it (gimli's row evaluation
/// with [`cfi::SmallRows`], with margin): with less, a frame whose rule is not cached ends the
/// walk, so that `malloc` still works with 8 KiB of stack left.
const RULE_ROOM: u64 = 4 << 10;

/// Stack framehop needs below the frame that asks for it: its cache is made on the stack
/// (~8 KiB) and its evaluation of a CFI row holds gimli's full-size rows (~12 KiB).
pub(super) const FRAMEHOP_ROOM: u64 = 28 << 10;

/// Bytes of stack left below the caller's frame, above `floor` (the stack's lowest address).
#[inline(always)]
pub(super) fn room(floor: u64) -> u64 {
    let here = 0u8;
    (core::ptr::addr_of!(here) as u64).saturating_sub(floor)
}

/// The thread's unwinder state if a capture made it.
pub(super) fn cache_if_made(local: &Local) -> Option<&'static mut ThreadCache> {
    let p = local.cache.get() as *mut ThreadCache;
    // SAFETY: made by `cache_for` on this thread, freed only by this thread's exit handler,
    // which also sets `closed`; the state is thread-local so no one else sees it, and
    // captures do not nest (the reentrancy guard) nor overlap `remember_id`, which runs
    // between them under the same guard, so this is the only reference.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// The thread's unwinder state, made on first use. `None` once the thread is exiting (its
/// state was freed by the exit handler) or when no memory is left: framehop alone serves
/// those captures.
pub(super) fn cache_for(local: &Local) -> Option<&'static mut ThreadCache> {
    if let Some(cache) = cache_if_made(local) {
        return Some(cache);
    }
    if local.closed.get() {
        return None;
    }
    let cache = ThreadCache::new()?;
    let p = Box::into_raw(Box::try_new_in(cache, Arena).ok()?);
    local.cache.set(p.cast());
    // SAFETY: just made; exclusively this thread's.
    Some(unsafe { &mut *p })
}

/// Frees the thread's unwinder state (thread exit); no new one is made after it.
pub fn drop_cache(local: &Local) {
    local.closed.set(true);
    let p = local.cache.replace(core::ptr::null_mut()) as *mut ThreadCache;
    if !p.is_null() {
        // SAFETY: made by `cache_for` with Box::into_raw in the arena on this thread; no
        // reference survives (the state is only borrowed during a capture, and captures do
        // not nest).
        drop(unsafe { Box::from_raw_in(p, Arena) });
    }
}
