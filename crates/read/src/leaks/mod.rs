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

mod own;
mod roots;
mod scan;
mod types;

pub use own::{glibc_heap, mmapped_chunk, Arena};
pub use roots::{roots, Roots};
pub use scan::Scan;
pub use types::{glibc_next_header, Class, Live, Outcome, Root, Total};
