//! Live blocks by address, as the answers need them: the block that holds an address or the
//! nearest one within a gap (`mtrace-why`), every block that holds it (`mtrace-history`), and
//! every live block (the leak scan, `mtrace-top --thread`), built on
//! [`Tables::shard_blocks`].

use super::relation::{Match, Relation};
use super::tags::{self, region_of};
use super::{Error, Tables};
use crate::memory::Memory;
use mem_trace_format::{shard_of, Block, Freed, LARGE_SHARD, REGION_SHIFT, SHARD_COUNT};

const REGION_SIZE: u64 = 1 << REGION_SHIFT;

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

/// Whether `m` is a better near match than `best`: closer, or as close and after its block
/// (overflows are more common than underflows).
fn better(m: &Match, best: Option<&Match>) -> bool {
    match best {
        None => true,
        Some(b) => {
            m.offset < b.offset
                || (m.offset == b.offset
                    && m.relation == Relation::After
                    && b.relation == Relation::Before)
        }
    }
}

impl<M: Memory + ?Sized> Tables<'_, M> {
    /// Every live block: the table's, shard by shard, then the tagged blocks of the heap
    /// mappings given with [`Tables::with_regions`] (none without them); none before the
    /// tracer has initialised.
    pub fn blocks(&self) -> Result<Vec<Block>, Error> {
        if self.header().shards.is_null() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for i in 0..SHARD_COUNT {
            out.extend(self.shard_blocks(i)?);
        }
        self.for_each_tagged(&mut |b| out.push(b));
        Ok(out)
    }

    /// Calls `found` with every live tagged block of the heap mappings given with
    /// [`Tables::with_regions`]; what it read.
    pub fn for_each_tagged(&self, found: &mut impl FnMut(Block)) -> tags::Scanned {
        match (self.tag_format(), self.regions()) {
            (tags::TagFormat { key: 0, .. }, _) | (_, None) => tags::Scanned::default(),
            (format, Some(regions)) => tags::for_each_tagged(self.memory(), format, regions, found),
        }
    }

    /// The mapping holding `addr`, as `(start, end)`; the whole address space when the
    /// mappings were not given or none holds it (the reads then end where memory does).
    fn bounds_of(&self, addr: u64) -> (u64, u64) {
        self.regions()
            .and_then(|r| region_of(r, addr))
            .map_or((0, u64::MAX), |r| (r.start, r.end))
    }

    /// The nearest tagged block at or below `addr` within 64 KiB (docs/LAYOUT.md "Block
    /// tags"): it holds `addr` when it contains it, else no tagged block does.
    pub fn tagged_below(&self, addr: u64) -> Option<Block> {
        let (floor, _) = self.bounds_of(addr);
        tags::tagged_block_below(self.memory(), self.tag_format(), addr, floor)
    }

    /// The block freed and still held by the tracer whose freed tag says it held `addr`, if
    /// any (docs/LAYOUT.md "Freed tags").
    pub fn freed_tag_containing(&self, addr: u64) -> Option<Freed> {
        let (floor, _) = self.bounds_of(addr);
        tags::freed_block_below(self.memory(), self.tag_format(), addr, floor)
            .filter(|f| f.block.contains(addr))
    }

    /// The tagged block holding `addr`, if any.
    pub fn tagged_containing(&self, addr: u64) -> Option<Block> {
        self.tagged_below(addr).filter(|b| b.contains(addr))
    }

    /// Tagged blocks near `addr` that do not hold it, as matches within `max_gap`: the nearest
    /// below (`After`) and the nearest above (`Before`).
    fn tagged_near(&self, addr: u64, below: Option<Block>, max_gap: u64) -> Vec<Match> {
        let mut out = Vec::new();
        if let Some(b) = below.filter(|b| !b.contains(addr)) {
            let end = b.addr.saturating_add(b.size);
            if end <= addr && addr - end <= max_gap {
                out.push(Match {
                    address: addr,
                    block: b,
                    relation: Relation::After,
                    offset: addr - end,
                });
            }
        }
        let (_, ceiling) = self.bounds_of(addr);
        if let Some(b) =
            tags::tagged_block_above(self.memory(), self.tag_format(), addr, max_gap, ceiling)
        {
            out.push(Match {
                address: addr,
                block: b,
                relation: Relation::Before,
                offset: b.addr - addr,
            });
        }
        out
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
        out.extend(self.tagged_containing(addr));
        Ok(out)
    }

    /// The live block containing `addr`, else the nearest one within `max_gap` bytes (at most
    /// 64 KiB).
    ///
    /// Containment needs only the three candidate shards, then the backward scan for a tag
    /// (docs/LAYOUT.md "Block tags"). Only when neither holds `addr` are the (at most two)
    /// extra region shards read that may hold a small block ending or starting within
    /// `max_gap` of it, and the tags just above it. Between a block below and one above at
    /// the same distance, "after" wins: overflows are more common than underflows.
    pub fn find_block(&self, addr: u64, max_gap: u64) -> Result<Option<Match>, Error> {
        let max_gap = max_gap.min(REGION_SIZE);
        if self.header().shards.is_null() {
            return Ok(None);
        }
        let inside = self.nearest(&candidate_shards(addr), addr, 0, true)?;
        if inside.is_some() {
            return Ok(inside);
        }
        let below = self.tagged_below(addr);
        if let Some(b) = below.filter(|b| b.contains(addr)) {
            return Ok(Some(Match {
                address: addr,
                block: b,
                relation: Relation::Inside,
                offset: addr - b.addr,
            }));
        }
        if max_gap == 0 {
            return Ok(None);
        }
        let mut best = self.table_near(addr, max_gap)?;
        for m in self.tagged_near(addr, below, max_gap) {
            if better(&m, best.as_ref()) {
                best = Some(m);
            }
        }
        Ok(best)
    }

    /// The nearest table block within `max_gap` of `addr`, which no table block holds.
    fn table_near(&self, addr: u64, max_gap: u64) -> Result<Option<Match>, Error> {
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
                let m = found(relation, dist);
                if better(&m, best.as_ref()) {
                    best = Some(m);
                }
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
pub(super) mod tests;
