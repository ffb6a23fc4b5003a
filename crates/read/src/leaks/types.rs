//! What the leak scan works on and yields: live blocks and their [`Class`], roots, totals, and
//! where glibc's next chunk header lies in a block. A leaf of `leaks`: `leaks`, `roots` and
//! `scan` import it, it imports none of them.

/// Where, from the start of a glibc block of `size` requested bytes, the header of the chunk
/// after it starts, when that lies inside the block (see the `leaks` module documentation): glibc's
/// `request2size` is `max(32, (size + 8 + 15) & !15)`, the block starts 16 bytes into its
/// chunk. A block that `realloc` shrank in place or `memalign` carved may sit in a bigger
/// chunk, whose next header then lies past the block: nothing inside is exempted wrongly
/// but the one word this gives, which a real pointer rarely holds.
pub fn glibc_next_header(size: u64) -> Option<u64> {
    let chunk = (size.checked_add(8 + 15)? & !15).max(32);
    let at = chunk - 16;
    (at < size).then_some(at)
}

/// What the scan makes of a live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Not reached at all.
    Lost = 0,
    /// Reached, but only through some interior pointer.
    Possibly = 1,
    /// Reached through a chain of pointers to block starts.
    Reachable = 2,
}

impl Class {
    /// The classes, in the order answers list them.
    pub const ALL: [Class; 3] = [Class::Lost, Class::Possibly, Class::Reachable];

    /// memcheck's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Lost => "definitely lost",
            Class::Possibly => "possibly lost",
            Class::Reachable => "still reachable",
        }
    }
}

/// Reach levels, the values of [`Class`]: a level only rises.
pub(super) const LOST: u8 = Class::Lost as u8;
pub(super) const POSSIBLY: u8 = Class::Possibly as u8;
pub(super) const REACHABLE: u8 = Class::Reachable as u8;

/// A live block as the scan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Start address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Its allocation stack id.
    pub stack: u32,
    pub(super) level: u8,
    /// Definitely lost, and reached from another definitely lost block.
    pub(super) indirect: bool,
}

impl Live {
    /// A block not reached yet.
    pub fn new(addr: u64, size: u64, stack: u32) -> Self {
        Live {
            addr,
            size,
            stack,
            level: LOST,
            indirect: false,
        }
    }

    /// A block of class `class`, as a finished scan leaves it.
    #[cfg(test)]
    pub(crate) fn of_class(addr: u64, size: u64, stack: u32, class: Class) -> Self {
        Live {
            level: class as u8,
            ..Live::new(addr, size, stack)
        }
    }

    /// Its class (once the scan is done).
    pub fn class(&self) -> Class {
        match self.level {
            LOST => Class::Lost,
            POSSIBLY => Class::Possibly,
            _ => Class::Reachable,
        }
    }

    /// Definitely lost, but only indirectly: some other definitely lost block points to it.
    pub fn indirect(&self) -> bool {
        self.indirect
    }
}

/// A range of memory to scan for pointers: `[lo, hi)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root {
    /// First byte.
    pub lo: u64,
    /// One past the last byte.
    pub hi: u64,
    /// A stack whose lower part may be unmapped (the main thread's bounds as the process sees
    /// them are an upper limit): read from the top down until the first unreadable page, and
    /// what lies below is not counted as unreadable.
    pub downward: bool,
}

impl Root {
    /// A range read in full (pages that cannot be read are skipped and counted).
    pub fn range(lo: u64, hi: u64) -> Self {
        Root {
            lo,
            hi,
            downward: false,
        }
    }
}

/// Bytes and blocks of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Total {
    /// Bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
}

/// What a finished scan says besides each block's class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Definitely lost, directly and indirectly.
    pub lost: Total,
    /// The part of `lost` that is indirectly lost.
    pub indirect: Total,
    /// Possibly lost.
    pub possibly: Total,
    /// Still reachable.
    pub reachable: Total,
    /// Bytes of roots scanned (their aligned lengths).
    pub root_bytes: u64,
    /// Bytes of roots or reached blocks that could not be read: blocks only they point to
    /// may be reported lost.
    pub unreadable: u64,
}

impl Outcome {
    /// The total of one class.
    pub fn total(&self, class: Class) -> Total {
        match class {
            Class::Lost => self.lost,
            Class::Possibly => self.possibly,
            Class::Reachable => self.reachable,
        }
    }
}
