//! Sampling by bytes (`MEM_TRACE_SAMPLE`, docs/LAYOUT.md "Sampling"): what a sampled block
//! stands for. The tracer and every reader count a sampled block with these same numbers, so
//! that the writer's counters and a reader's sums over the live-block table agree.
//!
//! The process is the one tcmalloc, jemalloc and Go use: a Poisson process over allocated
//! bytes with mean `mean`, so that a block of `size` bytes is sampled with probability
//! `1 - exp(-size / mean)`, and each sample, scaled by the inverse of that probability, is an
//! unbiased estimate of what its kind of allocation amounts to.

/// What a mean between samples may be (`MEM_TRACE_SAMPLE`, `mem-trace attach --sample`), as
/// the one line that refuses anything else says it.
pub const MEAN_WANTED: &str = "a mean number of bytes between samples, optionally with K, M, G or T, at most 1T (0: every block)";

/// A mean between samples as `MEM_TRACE_SAMPLE` takes it: a size (`512K`), at most 1T, 0 for
/// every block; `None` otherwise (see [`MEAN_WANTED`]).
pub fn parse_mean(v: &str) -> Option<u64> {
    crate::units::size(v).filter(|&n| n <= 1 << 40)
}

/// The probability that a block of `size` bytes is sampled (1 when `mean` is 0: exact).
pub fn probability(size: u64, mean: u64) -> f64 {
    if mean == 0 {
        return 1.0;
    }
    -crate::exp::expm1(-(size as f64) / mean as f64)
}

/// `(bytes, blocks)` a sampled block at `addr` of `size` bytes stands for; `(size, 1)` when
/// `mean` is 0. The block count is `1 / p` rounded up or down by a hash of the address, in
/// proportion to its fraction: unbiased, and the same at the block's allocation and its free.
pub fn weight(addr: u64, size: u64, mean: u64) -> (u64, u64) {
    let p = probability(size, mean);
    if mean == 0 || p <= 0.0 || p >= 1.0 {
        return (size, 1);
    }
    let bytes = (size as f64 / p).round() as u64;
    let blocks = 1.0 / p;
    let whole = blocks.floor();
    let u = (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64;
    (bytes, whole as u64 + u64::from(u < blocks - whole))
}

/// "one allocation per ~512 KiB", for the lines that say an answer is estimated.
pub fn rate(mean: u64) -> String {
    Rate(mean).to_string()
}

/// [`rate`] written without allocating (`print_trace` writes it).
pub struct Rate(pub u64);

impl core::fmt::Display for Rate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "one allocation per ~{}",
            crate::units::HumanBytes(self.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_are_sizes_up_to_a_terabyte() {
        assert_eq!(parse_mean("512K"), Some(512 << 10));
        assert_eq!(parse_mean("0"), Some(0));
        assert_eq!(parse_mean("1T"), Some(1 << 40));
        assert_eq!(parse_mean("2T"), None);
        assert_eq!(parse_mean("lots"), None);
    }

    #[test]
    fn exact_counts_each_block_once() {
        assert_eq!(weight(0x1000, 100, 0), (100, 1));
        assert_eq!(probability(100, 0), 1.0);
    }

    #[test]
    fn small_blocks_stand_for_many_and_large_ones_for_themselves() {
        let mean = 512 << 10;
        let (bytes, blocks) = weight(0x5555_0000, 64, mean);
        // p = 1 - e^(-64/524288) ~ 64/524288: each sample stands for ~8192 blocks of 64.
        assert!((524_000..=524_400).contains(&bytes), "{bytes}");
        assert!((8192..=8193).contains(&blocks), "{blocks}");
        // A block far above the mean is sampled almost surely and counts as itself.
        assert_eq!(weight(0x5555_0000, 64 << 20, mean), (64 << 20, 1));
        // At the mean: p = 0.632; bytes 1.58x, blocks 1 or 2 by the address.
        let counts: Vec<u64> = (0..1000u64).map(|k| weight(k << 4, mean, mean).1).collect();
        let ones = counts.iter().filter(|&&b| b == 1).count();
        assert!(counts.iter().all(|&b| b == 1 || b == 2));
        // E[blocks] = 1.582: about 418 of 1000 are 1.
        assert!((330..=500).contains(&ones), "{ones}");
    }

    /// Weights pinned: the tracer's counters and every reader's sums over the table rely on
    /// them being the same everywhere.
    #[test]
    fn the_weights_stay_the_same() {
        assert_eq!(weight(0x5555_0040, 100, 65536), (65586, 656));
        assert_eq!(weight(0x7f00_1230, 48, 524_288), (524_312, 10923));
        assert_eq!(weight(0x1000, 65536, 65536), (103_676, 2));
        assert_eq!(weight(0xabc_def0, 3000, 65536), (67047, 23));
    }

    #[test]
    fn the_rate_reads_as_a_size() {
        assert_eq!(rate(512 << 10), "one allocation per ~512 KiB");
        assert_eq!(rate(64 << 10), "one allocation per ~64 KiB");
    }
}
