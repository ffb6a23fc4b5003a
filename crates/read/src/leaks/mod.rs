//! The leak check: which live blocks the program can still reach, classified as memcheck does
//! (docs/FINDINGS.md "Peaks and leaks as DHAT, LSan and memcheck define them"). One
//! classification for every reader: the profiler's in-process exit report (crates/core, which
//! reads its own memory) and the `mem-trace leaks` command (a running process or a core), so
//! that the same program gets the same classes from both. The gdb command's twin
//! (`python/mem_trace_gdb/scan.py`) follows the same rules; a change to one is a change to both.
//!
//! A conservative scan: every aligned word of the roots ([`Root`], plus loose words such as a
//! thread's registers) and, transitively, of the blocks reached, is taken for a pointer if it
//! points into a live block. The rule for pointers into the middle of a block is memcheck's:
//! - a block reached from the roots through a chain of pointers to block starts is *still
//!   reachable*;
//! - one reached only through some interior pointer is *possibly lost*, as is one whose start
//!   is pointed at only from possibly lost blocks (a pointer passes on the level of the memory
//!   it was found in, an interior one at most "possibly");
//! - one not reached at all is *definitely lost* (memcheck's "indirectly lost", a lost block
//!   pointed to by another lost one, is counted as definitely lost here).
//!
//! Counting interior pointers as reaching, as LSan does, would call reachable a leaked block
//! whose last 8 bytes glibc's own bookkeeping points at (a free chunk's header just after it,
//! in `main_arena`'s bins), which the profiler's reference fixture
//! (tests/fixtures/profile_sites.c) hits. That header is also why a pointer exactly 8 bytes
//! before a block's end does not count at all: glibc's header of the next chunk starts there
//! whenever the block's size is 8 more than a multiple of 16 (a 1000-byte block: chunk of 1008
//! bytes, next header at +992), and glibc's bins and `top` (in libc's data, a root) point at
//! free chunks' headers. Without the exception, a leaked block followed by a free chunk would
//! be "possibly lost". memcheck and LSan replace the allocator, so their scans never see
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
}

impl Live {
    /// A block not reached yet.
    pub fn new(addr: u64, size: u64, stack: u32) -> Self {
        Live {
            addr,
            size,
            stack,
            level: LOST,
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
    /// Definitely lost.
    pub lost: Total,
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
