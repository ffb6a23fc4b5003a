//! Where a scan from outside the process starts: the target's modules, mappings and threads
//! made into roots, for `mem-trace leaks` and gdb's `mtrace-leaks` alike (gdb hands over the
//! registers of the threads it holds stopped), so that a process and its core give the same
//! roots, hence the same answer:
//! - the writable allocated sections of every loaded module (`.data`, `.bss`, `.got`, ...,
//!   thread-local templates excepted: each thread has its own copy) and of the vDSO, from
//!   their section headers, except mem-trace's own library: its data points at the tracer's
//!   tables, which hold every block's address. A module whose file cannot be read counts
//!   with its writable file mappings instead (whole pages, so a few more bytes than gdb);
//! - each thread's stack, from its stack pointer (less the 128-byte red zone a leaf function
//!   may use) to the end of the mapping that holds it, when the thread was stopped (a core);
//! - each stopped thread's registers, as loose words;
//! - the start of each glibc thread's dynamic thread vector, found from its control block,
//!   as a loose word ([`dtv_words`]).
//!
//! A running process is never stopped, so neither its threads' stack pointers nor their
//! registers are known. Its threads' stacks are then scanned whole: the main thread's
//! `[stack]` mapping, and every private anonymous mapping that holds no live block and ends
//! with the glibc thread control block of one of its threads (its first and third words point
//! at itself, and it holds the thread's id) — each other thread's stack, and the mapping of the
//! main thread's static TLS where it has one of its own (gdb does not scan it). What such a
//! scan cannot see: pointers held only in registers, stacks the program allocated itself
//! (`pthread_attr_setstack`) or that another libc lays out differently; stale words below a
//! stack pointer can only make a block look reachable, never lost. Memory the program mapped
//! itself is read as well when the tracer describes its own (see `own`).

use super::own::{program_roots, Arena};
use super::types::{Live, Root};
use crate::memory::Memory;
use crate::target::{regular_file, Mapping, Module, ThreadState};
use object::elf::{FileHeader64, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS, SHF_WRITE};
use object::read::elf::{FileHeader, SectionHeader};
use object::{Endianness, ReadRef};

/// Bytes below a stopped thread's stack pointer that a leaf function may use (the x86-64
/// ABI's red zone).
const RED_ZONE: u64 = 128;
/// Without a mapping that holds a stack pointer, readable pages are probed at most this far
/// above it.
const MAX_PROBED_STACK: u64 = 8 << 20;
const PAGE: u64 = 4096;
/// The vDSO is a page or two; a bigger mapping of that name is not read.
const MAX_VDSO: u64 = 1 << 20;
/// A thread control block lies this close to the end of its stack mapping (glibc puts
/// `struct pthread`, 2-3 KiB, at the top; static TLS lies below it).
const TCB_WINDOW: u64 = 16 << 10;
/// A thread control block holds its thread's id this close to its start.
const TID_WINDOW: usize = 1 << 10;

/// The roots of a target, and what the answer says of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roots {
    /// Ranges to scan.
    pub ranges: Vec<Root>,
    /// Loose words: the stopped threads' registers.
    pub words: Vec<u64>,
    /// Modules (and the vDSO) whose data is scanned.
    pub objects: usize,
    /// Thread stacks scanned.
    pub stacks: usize,
    /// Threads whose registers are scanned.
    pub register_sets: usize,
    /// The program's own mappings scanned (see `own`).
    pub program: usize,
}

/// The roots of the target whose memory is `mem`, with mem-trace's header at `header` (its
/// library is left out), its `modules`, `mappings` and `threads`. `blocks` are the live
/// blocks, sorted by address: a mapping that holds one is never taken for a thread's stack.
/// `arena`: the tracer's memory, when its header describes it; then the program's own
/// anonymous mappings are roots too (see `own`).
pub fn roots<M: Memory + ?Sized>(
    mem: &M,
    header: u64,
    modules: &[Module],
    mappings: &[Mapping],
    threads: &[ThreadState],
    blocks: &[Live],
    arena: Option<&Arena>,
) -> Roots {
    let (mut ranges, objects, sections) = data_roots(mem, header, modules, mappings);
    let (stacks, mut words, register_sets) = thread_roots(mem, mappings, threads, blocks);
    words.extend(dtv_words(mem, mappings, blocks));
    let count = stacks.len();
    let own = arena.map(|arena| {
        let sps: Vec<u64> = threads.iter().filter_map(|t| t.sp).collect();
        // The modules' mappings and their writable sections, the tracer's too: a section's
        // end (`.bss`) lies in an anonymous mapping past the file's.
        let modules: Vec<(u64, u64)> = modules
            .iter()
            .map(|m| (m.start, m.end))
            .chain(sections)
            .collect();
        program_roots(mem, arena, mappings, blocks, &stacks, &sps, &modules)
    });
    ranges.extend(stacks);
    let program = own.as_ref().map_or(0, |roots| {
        mappings
            .iter()
            .filter(|m| roots.iter().any(|r| m.start <= r.lo && r.lo < m.end))
            .count()
    });
    ranges.extend(own.into_iter().flatten());
    Roots {
        ranges,
        words,
        objects,
        stacks: count,
        register_sets,
        program,
    }
}

/// Every module's writable data but the tracer's, merged where ranges touch; the number of
/// modules it comes from; and every module's writable sections, the tracer's included.
fn data_roots<M: Memory + ?Sized>(
    mem: &M,
    header: u64,
    modules: &[Module],
    mappings: &[Mapping],
) -> (Vec<Root>, usize, Vec<(u64, u64)>) {
    let mut objects: Vec<Vec<(u64, u64)>> = Vec::new();
    for m in modules {
        // Pseudo modules (`[vdso]`) have no file; the vDSO is read from memory below.
        if m.path.as_os_str().as_encoded_bytes().starts_with(b"[") {
            continue;
        }
        let from_file = regular_file(&m.path).and_then(|f| {
            let cache = object::ReadCache::new(f);
            writable_sections(&cache, m.bias)
        });
        objects.push(from_file.unwrap_or_else(|| {
            let name = m.path.to_string_lossy();
            mappings
                .iter()
                .filter(|p| p.write && p.name == name)
                .map(|p| (p.start, p.end))
                .collect()
        }));
    }
    let vdso = mappings
        .iter()
        .find(|p| p.name == "[vdso]" && p.end > p.start && p.end - p.start <= MAX_VDSO);
    if let Some(vdso) = vdso {
        let mut image = vec![0u8; (vdso.end - vdso.start) as usize];
        if mem.read(vdso.start, &mut image).is_ok() {
            // The vDSO is linked at 0: its bias is where it is mapped.
            objects.extend(writable_sections(image.as_slice(), vdso.start));
        }
    }
    let sections: Vec<(u64, u64)> = objects.iter().flatten().copied().collect();
    let holds = |ranges: &[(u64, u64)], a: u64| ranges.iter().any(|&(s, e)| s <= a && a < e);
    let tracer: Vec<(u64, u64)> = objects
        .iter()
        .filter(|o| holds(o, header))
        .flatten()
        .copied()
        .collect();
    objects.retain(|o| !o.is_empty() && !holds(o, header));
    let mut ranges: Vec<(u64, u64)> = objects.iter().flatten().copied().collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let roots = merged
        .into_iter()
        .filter(|&(s, e)| !tracer.iter().any(|&(ts, te)| s < te && ts < e))
        .map(|(s, e)| Root::range(s, e))
        .collect();
    (roots, objects.len(), sections)
}

/// The sections of an ELF image that are allocated, writable, not code and not thread-local
/// templates, where they are loaded (`bias` added); `None` if it is not a 64-bit ELF file.
fn writable_sections<'d, R: ReadRef<'d>>(data: R, bias: u64) -> Option<Vec<(u64, u64)>> {
    let elf = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian().ok()?;
    let sections = elf.section_headers(endian, data).ok()?;
    let wanted = SHF_ALLOC.0 | SHF_WRITE.0;
    let unwanted = SHF_EXECINSTR.0 | SHF_TLS.0;
    Some(
        sections
            .iter()
            .filter(|s| {
                let flags = s.sh_flags(endian).0;
                flags & wanted == wanted && flags & unwanted == 0 && s.sh_size(endian) > 0
            })
            .map(|s| {
                let start = s.sh_addr(endian).wrapping_add(bias);
                (start, start.saturating_add(s.sh_size(endian)))
            })
            .collect(),
    )
}

/// Each thread's stack and registers: (stack roots, register words, register sets).
fn thread_roots<M: Memory + ?Sized>(
    mem: &M,
    mappings: &[Mapping],
    threads: &[ThreadState],
    blocks: &[Live],
) -> (Vec<Root>, Vec<u64>, usize) {
    let mut stacks = Vec::new();
    let mut words = Vec::new();
    let mut sets = 0;
    let mut unknown = false;
    for t in threads {
        let stopped = !t.registers.is_empty();
        if stopped {
            sets += 1;
            words.extend_from_slice(&t.registers);
        }
        let Some(sp) = t.sp else {
            unknown = true;
            continue;
        };
        let root = match mappings.iter().find(|m| m.start <= sp && sp < m.end) {
            // A running thread's stack below its stack pointer may be in use again by the
            // time it is read: scan the whole mapping.
            Some(m) if !stopped => Root::range(m.start, m.end),
            Some(m) => Root::range(sp.saturating_sub(RED_ZONE).max(m.start), m.end),
            None => Root::range(sp.saturating_sub(RED_ZONE), probe_end(mem, sp)),
        };
        stacks.push(root);
    }
    if unknown {
        let tids: Vec<u32> = threads.iter().map(|t| t.tid).filter(|&t| t != 0).collect();
        for (i, m) in mappings.iter().enumerate() {
            let taken = stacks.iter().any(|r| m.start < r.hi && r.lo < m.end);
            let guarded = i > 0 && is_guard_below(&mappings[i - 1], m);
            if !taken && (m.name == "[stack]" || guarded && is_thread_stack(mem, m, blocks, &tids))
            {
                stacks.push(Root::range(m.start, m.end));
            }
        }
    }
    (stacks, words, sets)
}

/// The end of the readable pages from `sp` up, at most [`MAX_PROBED_STACK`] above it.
fn probe_end<M: Memory + ?Sized>(mem: &M, sp: u64) -> u64 {
    let mut page = sp & !(PAGE - 1);
    let limit = sp.saturating_add(MAX_PROBED_STACK);
    let mut byte = [0u8; 1];
    while page < limit && mem.read(page, &mut byte).is_ok() {
        page += PAGE;
    }
    page.max(sp)
}

/// Whether `below` is the guard glibc puts right under a thread's stack: an inaccessible
/// mapping that ends where the stack starts. The tracer's own memory and the program's other
/// anonymous mappings have none, so a word pattern in them that happens to look like a thread
/// control block (seen: a chunk of the tracer's arena) is not taken for a stack. A stack the
/// program mapped itself without a guard is not scanned (as one it placed anywhere else).
fn is_guard_below(below: &Mapping, stack: &Mapping) -> bool {
    below.end == stack.start && !below.read && !below.write && !below.exec
}

/// A live glibc thread's stack: private anonymous read-write memory without live blocks, whose
/// last [`TCB_WINDOW`] bytes hold the thread control block of one of `tids` (see
/// [`control_blocks`]; the thread's id is one of the 32-bit words of its first [`TID_WINDOW`]
/// bytes, at 0x2d0 in the glibc of this writing). A stack glibc keeps for reuse holds the
/// control block of an exited thread, whose id the kernel cleared: it is not scanned, as gdb
/// and the exit report do not scan dead threads' stacks.
fn is_thread_stack<M: Memory + ?Sized>(
    mem: &M,
    m: &Mapping,
    blocks: &[Live],
    tids: &[u32],
) -> bool {
    let (tail, offsets) = control_blocks(mem, m, blocks);
    offsets.iter().any(|&off| {
        let end = (off + TID_WINDOW).min(tail.len());
        tail[off..end]
            .chunks_exact(4)
            .any(|w| tids.contains(&u32::from_le_bytes(w.try_into().expect("4 bytes"))))
    })
}

/// The glibc thread control blocks at the end of mapping `m` (private anonymous read-write
/// memory without live blocks): the mapping's last bytes, and the offsets in them of the
/// control blocks. `tcbhead_t`'s `tcb` and `self` words, at offsets 0 and 16, both point at
/// it; it is 64-byte aligned and within the last [`TCB_WINDOW`] bytes.
fn control_blocks<M: Memory + ?Sized>(
    mem: &M,
    m: &Mapping,
    blocks: &[Live],
) -> (Vec<u8>, Vec<usize>) {
    let none = (Vec::new(), Vec::new());
    if !m.name.is_empty() || !m.read || !m.write || m.exec || m.end <= m.start {
        return none;
    }
    let first = blocks.partition_point(|b| b.addr < m.start);
    if blocks.get(first).is_some_and(|b| b.addr < m.end) {
        return none;
    }
    let lo = m.end.saturating_sub(TCB_WINDOW).max(m.start);
    let mut tail = vec![0u8; (m.end - lo) as usize];
    if mem.read(lo, &mut tail).is_err() {
        return none;
    }
    let word = |off: usize| {
        tail.get(off..off + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
    };
    let offsets = (0..tail.len())
        .step_by(8)
        .filter(|&off| {
            let p = lo + off as u64;
            p.is_multiple_of(64) && word(off) == Some(p) && word(off + 16) == Some(p)
        })
        .collect();
    (tail, offsets)
}

/// The start of the dynamic thread vector (DTV) of every glibc thread whose control block
/// lies at the top of a guarded anonymous mapping, live threads' and exited ones' whose
/// stacks glibc keeps for reuse: loose words of the roots. glibc allocates a thread's DTV
/// with `malloc` and points at it only from the control block, 16 bytes into it
/// (`tcbhead_t.dtv` is `dtv + 1`), so without this every leak-free threaded program would
/// show one DTV lost per cached stack. LSan treats the DTV as reachable from the control
/// block; so do the exit report (crates/core/src/profile/roots.rs) and `mtrace-leaks`.
fn dtv_words<M: Memory + ?Sized>(mem: &M, mappings: &[Mapping], blocks: &[Live]) -> Vec<u64> {
    let mut words = Vec::new();
    for (i, m) in mappings.iter().enumerate().skip(1) {
        // gdb's `gcore` writes a guard page as a read-only segment: a core's guard is any
        // unnamed mapping below that can be neither written nor run.
        let below = &mappings[i - 1];
        let guarded = below.end == m.start && !below.write && !below.exec && below.name.is_empty();
        if !guarded {
            continue;
        }
        let (tail, offsets) = control_blocks(mem, m, blocks);
        for off in offsets {
            let dtv = tail
                .get(off + 8..off + 16)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
            if let Some(dtv) = dtv.filter(|&d| d >= 16) {
                words.push(dtv - 16);
            }
        }
    }
    words
}

#[cfg(test)]
mod tests;
