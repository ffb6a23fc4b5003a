//! Walking the freed-block index (docs/LAYOUT.md "Freed-block index"): the records of the
//! history ring that may hold an address, found through the chains of the granules around it
//! instead of a pass over the whole ring. One walk for every Rust reader, each through its own
//! [`Source`]: another process or a core (`Tables::frees_containing`), and the tracer's own
//! double-free reports (`mem_trace_core::store::freed::newest_at`), which is why it neither
//! allocates nor keeps what it found: it hands each record to the caller.
//!
//! A walk gives exactly what a scan of the ring would: a chain is cut short only at a record
//! whose slot was reused since, and every record still in the ring that joined the chain
//! before it lies within `disorder` records of the oldest claim (the contract says why), a
//! window the walk then reads in order. A corrupt index (a chain that loops, or names a record
//! never claimed) is an error, found within twice the chain's length.

use core::fmt;
use mem_trace_format::{link_next, Block, IndexGeometry};

/// Where a walk reads the index and the ring. Slots and buckets are within the arrays the
/// [`Index`] describes.
pub trait Source {
    /// Why something could not be read.
    type Error;
    /// Chain head `bucket`: a record number plus one, `0` for an empty chain.
    fn head(&mut self, bucket: u64) -> Result<u64, Self::Error>;
    /// The link word at ring index `slot`.
    fn link(&mut self, slot: u64) -> Result<u64, Self::Error>;
    /// The five words of the record at ring index `slot`.
    fn record(&mut self, slot: u64) -> Result<[u64; 5], Self::Error>;
    /// The history's `written`, read again: a running process may have claimed more records
    /// since the walk began.
    fn written(&mut self) -> Result<u64, Self::Error>;
}

/// The index of one ring, as the history's and the index's headers give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Index {
    /// Levels, granules, heads and hash.
    pub geometry: IndexGeometry,
    /// Records in the ring.
    pub capacity: u64,
    /// Records claimed when the walk begins.
    pub written: u64,
    /// The index's `disorder`.
    pub disorder: u64,
}

/// Which records a walk is after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Blocks whose `[addr, addr + size)` holds the address (a zero-size block holds its
    /// start).
    Containing(u64),
    /// Blocks that start at the address.
    StartingAt(u64),
}

impl Wanted {
    fn matches(self, r: &[u64; 5]) -> bool {
        // `addr == 0`: an empty record, or one being rewritten.
        r[0] != 0
            && match self {
                Wanted::Containing(a) => Block::unpack(r[0], r[1], r[2]).contains(a),
                Wanted::StartingAt(a) => r[0] == a,
            }
    }

    fn address(self) -> u64 {
        match self {
            Wanted::Containing(a) | Wanted::StartingAt(a) => a,
        }
    }
}

/// A chain the index cannot have in a consistent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The chain of `bucket` came back to `record`, which it had passed.
    Loop {
        /// The chain's head.
        bucket: u64,
        /// The record met twice.
        record: u64,
    },
    /// The chain of `bucket` names `record`, but only `written` were ever claimed.
    Unclaimed {
        /// The chain's head.
        bucket: u64,
        /// The record named.
        record: u64,
        /// Records claimed.
        written: u64,
    },
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Broken::Loop { bucket, record } => write!(
                f,
                "the freed-block index chain of head {bucket} loops (record {record} twice)"
            ),
            Broken::Unclaimed {
                bucket,
                record,
                written,
            } => write!(
                f,
                "the freed-block index chain of head {bucket} names record {record}, but only {written} were written"
            ),
        }
    }
}

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkError<E> {
    /// The source could not read.
    Source(E),
    /// The index is corrupt.
    Broken(Broken),
}

impl<E> From<Broken> for WalkError<E> {
    fn from(b: Broken) -> Self {
        WalkError::Broken(b)
    }
}

/// At most two buckets per level, and at most 32 levels (`IndexGeometry::valid`).
const MAX_BUCKETS: usize = 64;

/// The distinct chain heads a record `wanted` can hang from: for each level, the granule of
/// the address and, for containment, the one before (a block that starts there reaches at
/// most one granule further).
fn buckets(g: &IndexGeometry, wanted: Wanted) -> ([u64; MAX_BUCKETS], usize) {
    let mut out = [0u64; MAX_BUCKETS];
    let mut n = 0;
    let a = wanted.address();
    for level in 0..g.levels.min(32) {
        let q = a >> g.shift(level);
        out[n] = g.bucket(level, q);
        n += 1;
        if q > 0 && matches!(wanted, Wanted::Containing(_)) {
            out[n] = g.bucket(level, q - 1);
            n += 1;
        }
    }
    out[..n].sort_unstable();
    let mut distinct = 0;
    for i in 0..n {
        if i == 0 || out[i] != out[i - 1] {
            out[distinct] = out[i];
            distinct += 1;
        }
    }
    (out, distinct)
}

/// Hands `hit` (ring index, words) every record of the ring that is `wanted`, in no
/// particular order; a record may be handed over twice (when a running process rewrites a
/// slot during the walk). `index.geometry` must be valid.
pub fn walk<S: Source>(
    src: &mut S,
    index: &Index,
    wanted: Wanted,
    mut hit: impl FnMut(u64, [u64; 5]),
) -> Result<(), WalkError<S::Error>> {
    let cap = index.capacity;
    if cap == 0 {
        return Ok(());
    }
    let mut written = index.written;
    // Record numbers up to here (exclusive) may hang behind a chain cut short.
    let mut window_end = 0u64;
    let (heads, n) = buckets(&index.geometry, wanted);
    for &bucket in &heads[..n] {
        let mut next = src.head(bucket).map_err(WalkError::Source)?;
        // Brent's cycle detection: a loop is found within twice its length, in no memory.
        let (mut power, mut steps, mut tortoise) = (1u64, 0u64, u64::MAX);
        while next != 0 {
            let k = next - 1;
            if k >= written {
                written = src.written().map_err(WalkError::Source)?;
                if k >= written {
                    return Err(Broken::Unclaimed {
                        bucket,
                        record: k,
                        written,
                    }
                    .into());
                }
            }
            if k == tortoise {
                return Err(Broken::Loop { bucket, record: k }.into());
            }
            steps += 1;
            if steps == power {
                (tortoise, power, steps) = (k, power * 2, 0);
            }
            let slot = k % cap;
            let link = src.link(slot).map_err(WalkError::Source)?;
            let Some(after) = link_next(link, k, cap) else {
                // A later record took the slot: what joined the chain before `k` and is
                // still in the ring was claimed less than `disorder` records after it.
                window_end = window_end.max(k.saturating_add(index.disorder));
                break;
            };
            let r = src.record(slot).map_err(WalkError::Source)?;
            if wanted.matches(&r) {
                hit(slot, r);
            }
            next = after;
        }
    }
    let oldest = written.saturating_sub(cap);
    for k in oldest..window_end.min(written) {
        let slot = k % cap;
        let r = src.record(slot).map_err(WalkError::Source)?;
        if wanted.matches(&r) {
            hit(slot, r);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
