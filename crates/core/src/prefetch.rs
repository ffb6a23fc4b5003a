//! Cache prefetch hints. The tracer's own misses (the block table once it outgrows the cache,
//! the headers of blocks leaving quarantine) come at points where the address is known well
//! before it is used, so the load can be started early and overlap other work.

/// Starts loading the cache line holding `p` into all cache levels. Any address is fine: a
/// prefetch never faults, and one of an unmapped or stale address only wastes the hint.
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
