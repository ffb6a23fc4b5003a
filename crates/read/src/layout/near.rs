//! Live blocks by address, as the answers need them: the block that holds an address or the
//! nearest one within a gap (`mtrace-why`), every block that holds it (`mtrace-history`), and
//! every live block (the leak scan, `mtrace-top --thread`). The Rust twin of
//! `Tracer.find_block`, `live_blocks_containing` and `blocks` in
//! `python/mem_trace_gdb/layout/tracer.py`, built on [`Tables::shard_blocks`].

use super::{Error, Tables};
use crate::memory::Memory;
use mem_trace_format::{shard_of, Block, LARGE_SHARD, REGION_SHIFT, SHARD_COUNT};

/// How far from a block an address may be and still be reported as "N bytes after/before"
/// it. Overflows and underflows land within a few elements of the block; 4 KiB also covers a
/// misplaced struct-sized stride without attributing arbitrary addresses to an unrelated
/// neighbour.
pub const DEFAULT_MAX_GAP: u64 = 4096;

const REGION_SIZE: u64 = 1 << REGION_SHIFT;

/// Where an address is relative to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// In the block: `offset` bytes from its start.
    Inside,
    /// `offset` bytes past its end (0: one past the end).
    After,
    /// `offset` bytes before its start.
    Before,
}

/// An address and the block it is in or near.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// The address asked about.
    pub address: u64,
    /// The block.
    pub block: Block,
    /// Where the address is relative to it.
    pub relation: Relation,
    /// How far (see [`Relation`]).
    pub offset: u64,
}

/// The shards that can hold a block containing `addr`, without duplicates: its region's, the
/// region before's, and the large-block shard.
fn candidate_shards(addr: u64) -> Vec<usize> {
    let region = addr >> REGION_SHIFT;
    let mut out = vec![shard_of(region)];
    if region > 0 && !out.contains(&shard_of(region - 1)) {
        out.push(shard_of(region - 1));
    }
    out.push(LARGE_SHARD);
    out
}

impl<M: Memory + ?Sized> Tables<'_, M> {
    /// Every live block, shard by shard; none before the tracer has initialised.
    pub fn blocks(&self) -> Result<Vec<Block>, Error> {
        if self.header().shards.is_null() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for i in 0..SHARD_COUNT {
            out.extend(self.shard_blocks(i)?);
        }
        Ok(out)
    }

    /// Every live block containing `addr`, newest allocation first. A consistent table has at
    /// most one; a core taken mid-update may show two.
    pub fn live_blocks_containing(&self, addr: u64) -> Result<Vec<Block>, Error> {
        let mut out = Vec::new();
        if self.header().shards.is_null() {
            return Ok(out);
        }
        for i in candidate_shards(addr) {
            out.extend(
                self.shard_blocks(i)?
                    .into_iter()
                    .filter(|b| b.contains(addr)),
            );
        }
        out.sort_by_key(|b| core::cmp::Reverse(b.seq));
        Ok(out)
    }

    /// The live block containing `addr`, else the nearest one within `max_gap` bytes (at most
    /// 64 KiB).
    ///
    /// Containment needs only the three candidate shards. Only when none contains `addr` are
    /// the (at most two) extra region shards read that may hold a small block ending or
    /// starting within `max_gap` of it. Between a block below and one above at the same
    /// distance, "after" wins: overflows are more common than underflows.
    pub fn find_block(&self, addr: u64, max_gap: u64) -> Result<Option<Match>, Error> {
        let max_gap = max_gap.min(REGION_SIZE);
        if self.header().shards.is_null() {
            return Ok(None);
        }
        let inside = self.nearest(&candidate_shards(addr), addr, 0, true)?;
        if inside.is_some() || max_gap == 0 {
            return Ok(inside);
        }
        // Small blocks ending within max_gap below addr start no lower than this, and those
        // starting within max_gap above start no higher than addr + max_gap.
        let lo = addr.saturating_sub(max_gap + REGION_SIZE) >> REGION_SHIFT;
        let hi = addr.saturating_add(max_gap) >> REGION_SHIFT;
        let mut shards: Vec<usize> = Vec::new();
        for s in (lo..=hi).map(shard_of).chain([LARGE_SHARD]) {
            if !shards.contains(&s) {
                shards.push(s);
            }
        }
        self.nearest(&shards, addr, max_gap, false)
    }

    /// The best match for `addr` among the blocks of `shards`: one containing it (the newest,
    /// should a torn core show two), else unless `inside_only` the nearest within `max_gap`.
    fn nearest(
        &self,
        shards: &[usize],
        addr: u64,
        max_gap: u64,
        inside_only: bool,
    ) -> Result<Option<Match>, Error> {
        let mut best: Option<Match> = None;
        let lo = addr.saturating_sub(max_gap + REGION_SIZE);
        let hi = addr.saturating_add(max_gap);
        for &index in shards {
            let large = index == LARGE_SHARD;
            for b in self.shard_blocks(index)? {
                if b.addr > hi || (b.addr < lo && !large) {
                    continue;
                }
                let end = b.addr.saturating_add(b.size);
                let found = |relation, offset| Match {
                    address: addr,
                    block: b,
                    relation,
                    offset,
                };
                let best_inside = best.is_some_and(|m| m.relation == Relation::Inside);
                if b.contains(addr) {
                    if !best_inside || best.is_some_and(|m| b.seq > m.block.seq) {
                        best = Some(found(Relation::Inside, addr - b.addr));
                    }
                    continue;
                }
                if inside_only || best_inside {
                    continue;
                }
                let (relation, dist) = if end <= addr {
                    (Relation::After, addr - end)
                } else if b.addr > addr {
                    (Relation::Before, b.addr - addr)
                } else {
                    continue;
                };
                if dist > max_gap {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some(m) => {
                        dist < m.offset
                            || (dist == m.offset
                                && relation == Relation::After
                                && m.relation == Relation::Before)
                    }
                };
                if better {
                    best = Some(found(relation, dist));
                }
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
pub(super) mod tests;
