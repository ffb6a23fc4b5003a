//! The leak check: which live blocks the program can still reach, classified as memcheck does
//! (docs/FINDINGS.md "Peaks and leaks as DHAT, LSan and memcheck define them"). One
//! classification for every reader: the profiler's in-process exit report (crates/core, which
//! reads its own memory) and the `mem-trace leaks` command (a running process or a core), so
//! that the same program gets the same classes from both (gdb's `mtrace-leaks` is the latter,
//! through `crates/gdb`).
//!
//! A conservative scan: every aligned word of the roots ([`Root`], plus loose words such as a
//! thread's registers) and, transitively, of the blocks reached, is taken for a pointer if it
//! points into a live block. The rule for pointers into the middle of a block is memcheck's:
//! - a block reached from the roots through a chain of pointers to block starts is *still
//!   reachable*;
//! - one reached only through some interior pointer is *possibly lost*, as is one whose start
//!   is pointed at only from possibly lost blocks (a pointer passes on the level of the memory
//!   it was found in, an interior one at most "possibly");
//! - one not reached at all is *definitely lost*, and split as memcheck splits it: *indirectly*
//!   lost if some pointer (to its start or into it) in another definitely lost block reaches
//!   it, *directly* lost otherwise: the blocks to fix. As memcheck does (`mc_leakcheck.c`,
//!   cliques), the lost blocks are taken in address order, and each one not yet reached from
//!   another becomes a leader that marks every lost block its memory reaches indirectly lost,
//!   an earlier leader included; so a lost cycle has one directly lost block, its lowest.
//!   Definitely lost counts both, as memcheck's total does.
//!
//! Counting interior pointers as reaching, as LSan does, would call reachable a leaked block
//! whose last 8 bytes glibc's own bookkeeping points at (a free chunk's header just after it,
//! in `main_arena`'s bins), which the profiler's reference fixture
//! (tests/fixtures/profile_sites.c) hits. That header is also why a pointer to the one place in
//! a block where the next chunk's header can start does not count at all
//! ([`glibc_next_header`]): glibc's bins and `top` (in libc's data, a root) point at free
//! chunks' headers, and without the exception a leaked block followed by a free chunk (or by
//! `top`) would be "possibly lost". The place is exact for each size: glibc's chunk for `n`
//! bytes is `n + 8` rounded up to 16, at least 32, the user pointer 16 bytes into it, so the
//! next chunk starts `chunk - 16` bytes after the block's start: inside the block only when
//! `n` is 1 to 8 more than a multiple of 16 (and at least 17). A 1000-byte block's next
//! header is at +992 (8 before its end), a 100-byte one's at +96, a 16-byte one's at its end:
//! a pointer 8 bytes into a 16-byte block is a real interior pointer. memcheck and LSan replace the allocator, so their scans never see
//! glibc's bookkeeping; mem-trace runs over glibc's malloc and must discount it.
//!
//! The scan ([`Scan`]) is a worklist: a block whose level rises is queued, and its words are
//! scanned at its new level, until nothing rises any more. Memory is read through any
//! [`Memory`](crate::memory::Memory), small blocks many at a time
//! ([`Memory::read_spans`](crate::memory::Memory::read_spans): one `process_vm_readv` for up
//! to 1024 blocks on a process). What cannot be read is skipped and counted, never fatal: a
//! running program may unmap memory meanwhile, a core may lack pages.
//!
//! Where the roots come from is each reader's business: the process itself knows its threads'
//! stacks (crates/core/src/profile/roots.rs); a reader from outside finds them in the target's
//! mappings and threads ([`roots`]).

mod roots;
mod scan;

/// Where, from the start of a glibc block of `size` requested bytes, the header of the chunk
/// after it starts, when that lies inside the block (see the module documentation): glibc's
/// `request2size` is `max(32, (size + 8 + 15) & !15)`, the block starts 16 bytes into its
/// chunk. A block that `realloc` shrank in place or `memalign` carved may sit in a bigger
/// chunk, whose next header then lies past the block: nothing inside is exempted wrongly
/// but the one word this gives, which a real pointer rarely holds.
pub fn glibc_next_header(size: u64) -> Option<u64> {
    let chunk = (size.checked_add(8 + 15)? & !15).max(32);
    let at = chunk - 16;
    (at < size).then_some(at)
}

pub use roots::{roots, Roots};
pub use scan::Scan;

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
const LOST: u8 = Class::Lost as u8;
const POSSIBLY: u8 = Class::Possibly as u8;
const REACHABLE: u8 = Class::Reachable as u8;

/// A live block as the scan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Start address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Its allocation stack id.
    pub stack: u32,
    level: u8,
    /// Definitely lost, and reached from another definitely lost block.
    indirect: bool,
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
