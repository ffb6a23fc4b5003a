//! Maps keyed by addresses, hashed cheaply: a profile looks up every return address of every
//! stack (a million lookups for a big program's 34k stacks), and the standard hasher, made
//! to resist keys chosen by an attacker, was a tenth of `pprof`'s time. Addresses read from
//! a process are no such keys, and a collision costs time, never a wrong answer.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by an address (or any integer).
pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// A multiply-and-rotate hash of integer keys (the `FxHash` of rustc).
#[derive(Clone, Copy, Debug, Default)]
pub struct AddrHasher(u64);

/// An odd constant with well-mixed bits.
const K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_addresses_spread() {
        let mut m: AddrMap<u64> = AddrMap::default();
        for a in (0x5555_0000u64..0x5556_0000).step_by(8) {
            m.insert(a, a);
        }
        assert_eq!(m.len(), 0x10000 / 8);
        assert_eq!(m.get(&0x5555_1238), Some(&0x5555_1238));
    }
}
