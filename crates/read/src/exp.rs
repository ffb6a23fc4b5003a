//! `expm1` and `ln` in plain double arithmetic, for the sampling weights and the sampler's
//! gaps, so that the preloaded library does not need libm: loading libm.so.6 into every
//! traced process cost ~500 KiB of resident pages (its text and tables, touched by the
//! loader), a third of what sampled tracing adds to a small program, for two functions.
//!
//! Only `+ - * /`, comparisons and scaling by a power of two, in a fixed order, so that the
//! bits do not depend on a libm or on the compiler's choice of instructions: the tracer's
//! sampler and every reader's estimates then agree to the bit. Accurate to a few units in
//! the last place (tested against the platform's libm).

/// ln 2 split so that `k * LN2_HI` is exact for the `k` used here (its low 32 bits are zero),
/// and `LN2_LO` the rest; given by their bits.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1 / ln 2, rounded.
const INV_LN2: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);

/// `e^x - 1`, accurate near 0 as well as elsewhere.
pub fn expm1(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if (-0.5..=0.5).contains(&x) {
        // x (1 + x/2 (1 + x/3 (1 + ...))): the Taylor series, 18 terms (|x|^19 / 19! is
        // below 2^-80 of the sum).
        let mut t = 1.0;
        for n in (2..=18).rev() {
            t = 1.0 + x / f64::from(n) * t;
        }
        return x * t;
    }
    if x < -40.0 {
        // e^x below 2^-57: -1 to the last place.
        return -1.0;
    }
    exp(x) - 1.0
}

/// `e^x` for `x` in [-40, 709.7]: `2^k e^r` with `|r| <= ln 2 / 2`.
fn exp(x: f64) -> f64 {
    if x > 709.7 {
        return f64::INFINITY;
    }
    let k = (x * INV_LN2 + 0.5).floor();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 1 + r (1 + r/2 (1 + r/3 (...))), 20 terms.
    let mut t = 1.0;
    for n in (1..=20).rev() {
        t = 1.0 + r / f64::from(n) * t;
    }
    // k is in [-58, 1024]; 2^1024 is not a double, so scale in two steps.
    let half = (k / 2.0).floor();
    t * pow2(half as i32) * pow2((k - half) as i32)
}

/// `2^k` for `k` in [-1022, 1023].
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// The natural logarithm of a positive, normal `x` (NaN otherwise).
pub fn ln(x: f64) -> f64 {
    if x.is_nan() || x < f64::MIN_POSITIVE || x == f64::INFINITY {
        return f64::NAN;
    }
    // x = m 2^e with m in [sqrt(1/2), sqrt(2)).
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i32 - 1023;
    let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    if m > core::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    // ln m = 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...), s = (m-1)/(m+1), |s| < 0.172.
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let mut t = 1.0 / 27.0;
    for n in (0..13).rev() {
        t = 1.0 / f64::from(2 * n + 1) + z * t;
    }
    let e = f64::from(e);
    e * LN2_HI + (e * LN2_LO + 2.0 * s * t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place.
    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn expm1_agrees_with_libm_over_the_sampling_range() {
        // Sizes from 1 byte to 1 TiB against means from 1 KiB to 1 GiB: x = -size/mean.
        let mut worst = 0;
        for size in (0..41)
            .map(|i| 1u64 << i)
            .chain([3, 100, 3000, 65537, 12345678])
        {
            for mean in [1u64 << 10, 1 << 16, 1 << 19, 1 << 20, 1 << 30, 999] {
                let x = -(size as f64) / mean as f64;
                let (ours, libm) = (expm1(x), x.exp_m1());
                worst = worst.max(ulps(ours, libm));
                assert!(ulps(ours, libm) <= 4, "expm1({x}) = {ours}, libm {libm}");
            }
        }
        for x in [
            0.0, -0.0, 1e-300, -1e-10, 0.49, 0.5, 0.51, 1.0, 3.7, 50.0, 700.0,
        ] {
            assert!(ulps(expm1(x), x.exp_m1()) <= 4, "expm1({x})");
            assert!(ulps(expm1(-x), (-x).exp_m1()) <= 4, "expm1({})", -x);
        }
        assert_eq!(expm1(-1e6), -1.0);
        assert!(expm1(f64::NAN).is_nan());
        assert_eq!(expm1(1000.0), f64::INFINITY);
        assert!(worst <= 4);
    }

    /// The bits of 12,000 arguments on both sides of 0, near and far, pinned: a change to
    /// the operations or their order shows here before it shows as a reader's sum that no
    /// longer equals the tracer's counters.
    #[test]
    fn the_bits_stay_the_same() {
        let mut digest = 0u64;
        for i in 0..4000u64 {
            let x = -((i * i * 37 + 1) as f64) / 65536.0 / 7.0;
            for y in [x, x / 1024.0, -x / 3.0] {
                digest = digest.wrapping_mul(31).wrapping_add(expm1(y).to_bits());
            }
        }
        assert_eq!(digest, 0x8ef0_2195_6dcf_7684);
    }

    #[test]
    fn ln_agrees_with_libm_from_the_smallest_uniform_to_one() {
        let mut x = 1.0 / (1u64 << 53) as f64;
        while x <= 1.0 {
            for f in [1.0, 1.1, 1.25, core::f64::consts::SQRT_2, 1.5, 1.75, 1.999] {
                let y = x * f;
                if y <= 1.0 {
                    assert!(
                        ulps(ln(y), y.ln()) <= 4,
                        "ln({y}) = {}, libm {}",
                        ln(y),
                        y.ln()
                    );
                }
            }
            x *= 2.0;
        }
        assert_eq!(ln(1.0), 0.0);
        assert!(ulps(ln(1e300), 1e300f64.ln()) <= 4);
        assert!(ln(0.0).is_nan() && ln(-1.0).is_nan() && ln(f64::NAN).is_nan());
    }
}
