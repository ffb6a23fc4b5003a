//! Ranking stacks: every stack's counts summed from its shared counter record and every
//! thread's cached deltas (docs/LAYOUT.md "Profile"), then the top few by a key.
//!
//! Lock-free and allocation-path-free: the records are read with plain loads while threads
//! keep counting (a record being moved from a cache may be seen twice or not at all for an
//! instant, as the layout says). One dense vector indexed by stack id, in the arena: 48 bytes
//! a stack, so 100k stacks cost 4.8 MB and one pass.

use crate::arena::Arena;
use crate::config::RankBy;
use crate::profile::counters::{self, Counts};
use crate::profile::leaks::ArenaVec;
use crate::store::header::header;
use crate::store::stacks;
use allocator_api2::vec::Vec as AVec;
use core::sync::atomic::Ordering::Relaxed;

/// One stack in a ranking.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ranked {
    pub stack: u32,
    pub counts: Counts,
}

/// Every stack's counts, indexed by stack id (id 0: blocks recorded without a stack). `None`
/// when out of memory.
pub(crate) fn all() -> Option<ArenaVec<Counts>> {
    let n = stacks::count() as usize + 1;
    let mut v = AVec::new_in(Arena);
    v.try_reserve_exact(n).ok()?;
    v.resize(n, Counts::default());
    let peak_seq = header().peak_seq.load(Relaxed);
    for (id, c) in v.iter_mut().enumerate() {
        if let Some(r) = counters::get(id as u32) {
            c.add(r, peak_seq);
        }
    }
    // A stack interned after `n` was read is left out of this report.
    counters::for_each_cached(|id, e| {
        if let Some(c) = v.get_mut(id as usize) {
            c.add(e, peak_seq);
        }
    });
    Some(v)
}

pub(crate) use mem_trace_format::non_negative as positive;

/// Live blocks now and at the global peak, summed over every stack's counters: the count that
/// includes tagged blocks, which no table holds. `None` when out of memory.
pub(crate) fn blocks() -> Option<(u64, u64)> {
    let all = all()?;
    Some(all.iter().fold((0, 0), |(live, peak), c| {
        (
            live + positive(c.live_blocks),
            peak + positive(c.peak_blocks),
        )
    }))
}

/// What `by` ranks on.
pub(crate) fn key(c: &Counts, by: RankBy) -> u64 {
    match by {
        RankBy::Live => positive(c.live_bytes),
        RankBy::Allocated => c.total_bytes,
        RankBy::Blocks => positive(c.live_blocks),
        RankBy::Peak => c.peak_bytes,
    }
}

/// The `n` stacks with the highest nonzero `key`, biggest first (ties: lower id first).
pub(crate) fn top(all: &[Counts], n: usize, key: impl Fn(&Counts) -> u64) -> ArenaVec<Ranked> {
    let mut keyed: ArenaVec<(u64, u32)> = AVec::new_in(Arena);
    let mut out = AVec::new_in(Arena);
    for (id, c) in all.iter().enumerate() {
        let k = key(c);
        if k > 0 {
            if keyed.try_reserve(1).is_err() {
                break;
            }
            keyed.push((k, id as u32));
        }
    }
    let order = |a: &(u64, u32), b: &(u64, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if keyed.len() > n && n > 0 {
        keyed.select_nth_unstable_by(n - 1, order);
        keyed.truncate(n);
    }
    keyed.sort_unstable_by(order);
    if out.try_reserve_exact(keyed.len()).is_ok() {
        out.extend(keyed.iter().map(|&(_, id)| Ranked {
            stack: id,
            counts: all[id as usize],
        }));
    }
    out
}
