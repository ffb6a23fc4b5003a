//! The profiler's numbers (docs/LAYOUT.md "Profile"): live and peak bytes, globally and per
//! thread, and the counters of every stack — each stack's shared record plus every thread's
//! cache record for it, summed as the contract says.

use crate::layout::{check_extent, Disjoint, Error, Tables, Thread};
use crate::memory::{read_plain, read_words, Memory};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use mem_trace_format::{
    Counts, Profile, StackCounters, COUNTER_CACHE, COUNTER_CHUNKS, COUNTER_CHUNK_BITS,
    FLAG_PROFILER,
};
use std::collections::BTreeMap;

/// The global numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peaks {
    /// Bytes live now.
    pub live_bytes: u64,
    /// The highest live bytes since start or the last reset.
    pub peak_bytes: u64,
    /// Sequence number of the event at the peak (or of the reset).
    pub peak_seq: u64,
    /// Resets so far (the phase number).
    pub resets: u64,
    /// `CLOCK_MONOTONIC` at the tracer's start, in nanoseconds.
    pub started_ns: u64,
}

const WORDS: usize = core::mem::size_of::<StackCounters>() / 8;

/// A counter record from its eight words.
fn record(w: &[u64]) -> StackCounters {
    StackCounters {
        live_bytes: AtomicU64::new(w[0]),
        live_blocks: AtomicU64::new(w[1]),
        total_bytes: AtomicU64::new(w[2]),
        total_blocks: AtomicU64::new(w[3]),
        peak_bytes: AtomicU64::new(w[4]),
        peak_blocks: AtomicU64::new(w[5]),
        last_seq: AtomicU64::new(w[6]),
        lock: AtomicU32::new(w[7] as u32),
        stack: AtomicU32::new((w[7] >> 32) as u32),
    }
}

impl<M: Memory + ?Sized> Tables<'_, M> {
    /// The profile root, or `None` when the library was built without the `profiler` feature.
    fn profile(&self) -> Result<Option<Profile>, Error> {
        let h = self.header();
        let at = h.profile as u64;
        if at == 0 || h.flags.load(Relaxed) & FLAG_PROFILER == 0 {
            return Ok(None);
        }
        let p: Profile = read_plain(self.memory(), at)?;
        if p.counter_size as usize != core::mem::size_of::<StackCounters>()
            || p.chunk_bits != COUNTER_CHUNK_BITS
            || p.chunks as usize != COUNTER_CHUNKS
        {
            return Err(Error::Corrupt(format!(
                "profile sizes ({}, {}, {})",
                p.counter_size, p.chunk_bits, p.chunks
            )));
        }
        Ok(Some(p))
    }

    /// The global live bytes and peak; `None` without the profiler.
    pub fn peaks(&self) -> Result<Option<Peaks>, Error> {
        let Some(p) = self.profile()? else {
            return Ok(None);
        };
        let h = self.header();
        Ok(Some(Peaks {
            live_bytes: h.live_bytes.load(Relaxed),
            peak_bytes: h.peak_bytes.load(Relaxed),
            peak_seq: h.peak_seq.load(Relaxed),
            resets: p.resets.into_inner(),
            started_ns: p.started_ns.into_inner(),
        }))
    }

    /// Every thread's record, by index.
    pub fn threads(&self) -> Result<Vec<(u32, Thread)>, Error> {
        self.thread_records()
    }

    /// The counts of every stack that ever had a block counted, by stack id (0: blocks
    /// recorded without a stack); `None` without the profiler.
    pub fn stack_counts(&self) -> Result<Option<BTreeMap<u32, Counts>>, Error> {
        let Some(p) = self.profile()? else {
            return Ok(None);
        };
        let peak_seq = self.header().peak_seq.load(Relaxed);
        let mut counts: BTreeMap<u32, Counts> = BTreeMap::new();
        let last_chunk = (self.stack_count()? >> COUNTER_CHUNK_BITS) as usize;
        // Chunks and caches must be memory the target has, each read once (see
        // `Tables::thread_records`).
        let mut taken = Disjoint::default();
        let chunk_bytes = ((8 * WORDS) << COUNTER_CHUNK_BITS) as u64;
        for (k, chunk) in p.dir.iter().enumerate().take(last_chunk + 1) {
            let chunk = chunk.load(Relaxed) as u64;
            if chunk == 0 {
                continue;
            }
            let what = || format!("chunk {k} of the stack counters");
            check_extent(self.memory(), chunk, chunk_bytes, what)?;
            taken.claim(chunk, chunk_bytes, what)?;
            let words = read_words(self.memory(), chunk, WORDS << COUNTER_CHUNK_BITS)?;
            for (i, w) in words.chunks_exact(WORDS).enumerate() {
                let r = record(w);
                if w[6] != 0 {
                    let id = ((k as u32) << COUNTER_CHUNK_BITS) | i as u32;
                    counts.entry(id).or_default().add(&r, peak_seq);
                }
            }
        }
        for (_, t) in self.threads()? {
            if t.counters == 0 {
                continue;
            }
            let bytes = (8 * WORDS * COUNTER_CACHE) as u64;
            let what = || format!("thread {}'s cache of counters", t.tid);
            check_extent(self.memory(), t.counters, bytes, what)?;
            taken.claim(t.counters, bytes, what)?;
            let words = read_words(self.memory(), t.counters, WORDS * COUNTER_CACHE)?;
            for w in words.chunks_exact(WORDS) {
                let r = record(w);
                let id = (w[7] >> 32) as u32;
                if id != 0 {
                    counts.entry(id - 1).or_default().add(&r, peak_seq);
                }
            }
        }
        Ok(Some(counts))
    }
}
