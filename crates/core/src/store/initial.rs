//! The value `MEM_TRACE_HEADER` starts with (see `header`): it points at every table, so it
//! sits above them all, and no module of this crate imports it: only the static that
//! [`crate::define_header!`] expands to, in the linking crate, is initialised from it.

use super::freed::HISTORY;
use super::stacks::STACKS;
use super::table::SHARDS;
use super::threads::THREADS;
use core::sync::atomic::AtomicU64;
use mem_trace_format::{
    Header, Shard, Slot, FLAG_PROFILER, MAGIC, REGION_SHIFT, SHARD_COUNT, VERSION,
};

/// The header's value at start-up: what the static is initialised with.
pub const fn value() -> Header {
    Header {
        magic: MAGIC,
        version: VERSION,
        header_size: core::mem::size_of::<Header>() as u32,
        slot_size: core::mem::size_of::<Slot>() as u32,
        shard_size: core::mem::size_of::<Shard>() as u32,
        shard_count: SHARD_COUNT as u32,
        region_shift: REGION_SHIFT,
        shards: &SHARDS as *const [Shard; SHARD_COUNT] as *const Shard,
        stacks: &STACKS,
        threads: &THREADS,
        freed: &HISTORY,
        next_seq: AtomicU64::new(1),
        live_bytes: AtomicU64::new(0),
        // The counters are in every build: readers check the bit to tell this library from
        // an older tracer-only build, which kept none.
        flags: AtomicU64::new(FLAG_PROFILER),
        untracked: AtomicU64::new(0),
        profile: profile_root(),
        peak_bytes: AtomicU64::new(0),
        peak_seq: AtomicU64::new(0),
        tree: &crate::capture::TREE,
        sample_mean: AtomicU64::new(0),
        tag_key: AtomicU64::new(0),
        attached_at: AtomicU64::new(0),
        arena: &crate::arena::MAP,
    }
}

const fn profile_root() -> *const mem_trace_format::Profile {
    &crate::profile::counters::PROFILE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_points_at_the_tables() {
        let h = crate::store::header::header();
        assert_eq!(h.magic, MAGIC);
        assert_eq!(h.shard_count, 129);
        assert_eq!(h.slot_size, 24);
        assert_eq!(h.shard_size, 64);
        assert_eq!(h.header_size, 160);
        assert!(core::ptr::eq(h.shards, SHARDS.as_ptr()));
        assert!(core::ptr::eq(h.stacks, &STACKS));
        assert!(core::ptr::eq(h.threads, &THREADS));
        assert!(core::ptr::eq(h.freed, &HISTORY));
    }
}
