//! Where the leak scan starts (docs/FINDINGS.md "Peaks and leaks as DHAT, LSan and memcheck
//! define them"): the writable segments of every loaded module but this library, the stacks
//! of the live threads, and their static TLS.
//!
//! A thread's stack bounds are known only to the thread itself (`capture::stack::Bounds` is
//! thread-local), so each thread that allocates notes them here when it registers, with its
//! thread pointer, and clears them when it exits. The table has [`SLOTS`] places; threads
//! beyond that many alive at once are not scanned (their blocks may then be called lost).
//! Threads that never allocated through the hooks are not known either.
//!
//! Another thread's stack pointer is not known without stopping it (LSan stops the world with
//! ptrace; we do not stop the program), so another thread's whole stack range is scanned,
//! stale slots below its stack pointer included: that can only make a block look reachable,
//! never lost. Nor are other threads' registers read. The calling thread's stack is scanned
//! from the stack pointer its caller hands in, so the scan's own frames are left out.

use super::world::Stopped;
use crate::capture::Bounds;
use crate::maps::Mapping;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Live threads whose stacks can be scanned.
const SLOTS: usize = 1024;

struct Slot {
    /// Thread index (0: free).
    index: AtomicU32,
    lo: AtomicU64,
    hi: AtomicU64,
    /// The thread pointer (`pthread_self()`): static TLS lies just below it.
    tp: AtomicU64,
}

static THREAD_STACKS: [Slot; SLOTS] = [const {
    Slot {
        index: AtomicU32::new(0),
        lo: AtomicU64::new(0),
        hi: AtomicU64::new(0),
        tp: AtomicU64::new(0),
    }
}; SLOTS];

/// Thread control blocks of the threads the program made ([`thread_created`]), alive or not,
/// each once: their dynamic thread vectors are roots ([`for_each_tcb`]). A ring: past
/// [`TCB_SLOTS`] distinct ones, the oldest is forgotten (glibc reuses a few cached stacks, so
/// few distinct ones stay mapped).
const TCB_SLOTS: usize = 1024;
static TCBS: [AtomicU64; TCB_SLOTS] = [const { AtomicU64::new(0) }; TCB_SLOTS];
static TCB_NEXT: AtomicUsize = AtomicUsize::new(0);

/// Bytes of static TLS below a thread pointer (`_dl_get_tls_static_info`, looked up at start).
static TLS_STATIC_SIZE: AtomicUsize = AtomicUsize::new(0);
/// glibc's `struct pthread` at the thread pointer holds pointers too (the dtv, key data):
/// scanned up to this many bytes above it.
const TCB_BYTES: u64 = 4096;

/// Start-up: the size of static TLS. `_dl_get_tls_static_info` is a GLIBC_PRIVATE function of
/// ld.so, so it is looked up rather than linked; without it only thread stacks are scanned
/// (a non-main thread's static TLS is inside its stack mapping anyway).
pub(crate) fn init() {
    type Info = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: a NUL-terminated name; dlsym takes the loader lock, which start-up may take.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr()) };
    if f.is_null() {
        return;
    }
    // SAFETY: glibc's signature: `void _dl_get_tls_static_info(size_t *size, size_t *align)`.
    let f: Info = unsafe { core::mem::transmute(f) };
    let (mut size, mut align) = (0usize, 0usize);
    // SAFETY: both pointers are to locals.
    unsafe { f(&mut size, &mut align) };
    TLS_STATIC_SIZE.store(size.min(1 << 20), Relaxed);
}

/// The calling thread (index `index`, stack `bounds`) allocates from now on: its stack and TLS
/// are roots until it exits.
pub(crate) fn thread_registered(index: u32, bounds: &Bounds) {
    if index == 0 || !bounds.known() {
        return;
    }
    // SAFETY: pthread_self has no preconditions.
    let tp = unsafe { libc::pthread_self() } as u64;
    for s in &THREAD_STACKS {
        if s.index.load(Relaxed) == 0
            && s.index.compare_exchange(0, index, Relaxed, Relaxed).is_ok()
        {
            s.lo.store(bounds.lo.get(), Relaxed);
            s.hi.store(bounds.hi.get(), Relaxed);
            s.tp.store(tp, Relaxed);
            return;
        }
    }
}

/// Thread `index` exits: its stack is no longer a root (LSan and memcheck do not scan a dead
/// thread's stack either).
pub(crate) fn thread_exited(index: u32) {
    for s in &THREAD_STACKS {
        if index != 0 && s.index.load(Relaxed) == index {
            s.hi.store(0, Relaxed);
            s.index.store(0, Relaxed);
            return;
        }
    }
}

/// The program made a thread whose control block (`pthread_t`, the thread pointer) is `tcb`.
///
/// glibc allocates each new thread's dynamic thread vector (DTV, `allocate_dtv` in ld.so, a
/// few hundred bytes) with `malloc`, and points at it only from the thread's control block,
/// at the top of the thread's stack mapping, and from `+16` at that (`tcbhead_t.dtv` is
/// `dtv + 1`). After the thread exits, glibc keeps the stack, control block and DTV for the
/// next thread; no root points there, so without this every leak-free multi-threaded program
/// would report a "definitely lost" DTV per cached stack. LSan treats the DTV as reachable
/// from the thread's control block; so does the scan ([`for_each_tcb`]).
pub(crate) fn thread_created(tcb: u64) {
    if tcb == 0 || TCBS.iter().any(|t| t.load(Relaxed) == tcb) {
        return;
    }
    let i = TCB_NEXT.fetch_add(1, Relaxed) % TCB_SLOTS;
    TCBS[i].store(tcb, Relaxed);
}

/// Calls `f` on the control block of every thread the program made, and of every live thread
/// known; the caller reads them with checked reads (a stack may have been unmapped since).
pub(crate) fn for_each_tcb(mut f: impl FnMut(u64)) {
    for t in &TCBS {
        let tcb = t.load(Relaxed);
        if tcb != 0 {
            f(tcb);
        }
    }
    for s in &THREAD_STACKS {
        let tp = s.tp.load(Relaxed);
        if s.index.load(Relaxed) != 0 && tp != 0 && !TCBS.iter().any(|t| t.load(Relaxed) == tp) {
            f(tp);
        }
    }
}

/// In a forked child: only the forking thread survives, and it registers again.
pub(crate) fn forked() {
    for s in &THREAD_STACKS {
        s.hi.store(0, Relaxed);
        s.index.store(0, Relaxed);
    }
}

/// A range of memory to scan for pointers: `[lo, hi)`. `downward`: a stack, read from the top
/// down until the first unreadable page (the main thread's bounds are an upper limit, most of
/// it unmapped).
pub(crate) use mem_trace_read::leaks::Root;

/// Calls `f` on every root. `own_sp`: the calling thread's stack pointer, whose stack is then
/// scanned from there up only; `None` when the caller is not a program thread (the profiler's
/// own thread, which is never registered). `modules`: the modules' writable segments, taken
/// before any thread was stopped ([`Modules::now`]). `stopped`: the other threads, when they
/// are stopped ([`super::world`]): their stacks are then read from their stack pointers and
/// their TLS from their thread pointers, registered or not; otherwise the registered threads'
/// whole stacks are.
pub(crate) fn for_each(
    own_sp: Option<u64>,
    modules: &Modules,
    stopped: Option<&[Stopped]>,
    mappings: &[Mapping],
    mut f: impl FnMut(Root),
) {
    for &(lo, hi) in modules.ranges() {
        f(Root::range(lo, hi));
    }
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    for s in &THREAD_STACKS {
        if s.index.load(Relaxed) == 0 {
            continue;
        }
        let (lo, hi, tp) = (s.lo.load(Relaxed), s.hi.load(Relaxed), s.tp.load(Relaxed));
        if hi == 0 {
            continue;
        }
        let mine = tp == me;
        match own_sp {
            Some(sp) if mine && (lo..hi).contains(&sp) => f(Root::range(sp, hi)),
            // Another thread, scanned below from its stack pointer.
            _ if !mine && stopped.is_some() => continue,
            _ => f(Root {
                lo,
                hi,
                downward: true,
            }),
        }
        tls(tp, &mut f);
    }
    for t in stopped.unwrap_or(&[]) {
        let (sp, tp) = (t.regs.rsp, t.regs.fs_base);
        if sp == 0 {
            continue;
        }
        // The red zone below the stack pointer holds a leaf function's live locals.
        let lo = sp.saturating_sub(RED_ZONE);
        let known = THREAD_STACKS
            .iter()
            .find(|s| s.index.load(Relaxed) != 0 && s.tp.load(Relaxed) == tp && tp != 0);
        match known.map(|s| (s.lo.load(Relaxed), s.hi.load(Relaxed))) {
            Some((slo, shi)) if shi != 0 && (slo..shi).contains(&sp) => f(Root::range(lo, shi)),
            // On another stack (a signal stack, a coroutine's): that one from the stack pointer
            // to its mapping's end, and the thread's own stack whole, as LSan does.
            Some((slo, shi)) if shi != 0 => {
                f(Root {
                    lo: slo,
                    hi: shi,
                    downward: true,
                });
                if let Some(end) = mapping_end(sp, mappings) {
                    f(Root::range(lo, end));
                }
            }
            _ => {
                if let Some(end) = mapping_end(sp, mappings) {
                    f(Root::range(lo, end));
                }
            }
        }
        tls(tp, &mut f);
    }
}

/// Bytes below a stack pointer that a leaf function may use without moving it (x86-64 ABI).
const RED_ZONE: u64 = 128;

/// The end of the stack-like mapping of `mappings` (the process's, in address order) that
/// holds `sp`: `None` for the program break's heap (a stack pointer into the heap is a
/// coroutine on a block, which the scan reaches as a block).
fn mapping_end(sp: u64, mappings: &[Mapping]) -> Option<u64> {
    let i = mappings.partition_point(|m| m.end <= sp);
    mappings
        .get(i)
        .filter(|m| m.start <= sp && m.name() != b"[heap]" && m.readable())
        .map(|m| m.end)
}

/// The static TLS below the thread pointer `tp` and glibc's thread control block above it,
/// without the tracer's own per-thread state, which holds copies of stack words the unwinder
/// read (the last walk, kept for the next capture): the program's dead pointers would come
/// back as roots from it.
fn tls(tp: u64, f: &mut impl FnMut(Root)) {
    if tp == 0 {
        return;
    }
    let size = TLS_STATIC_SIZE.load(Relaxed) as u64;
    let (lo, hi) = (tp.saturating_sub(size), tp + TCB_BYTES);
    let (skip, own_len) = own_state_below(tp);
    let pieces = if lo <= skip && skip.saturating_add(own_len) <= hi {
        [(lo, skip), (skip + own_len, hi)]
    } else {
        [(lo, hi), (hi, hi)]
    };
    for (lo, hi) in pieces.into_iter().filter(|(lo, hi)| lo < hi) {
        f(Root::range(lo, hi));
    }
}

/// Where the tracer's state of the thread whose thread pointer is `tp` lies, and its length:
/// each thread's lies at the same distance below its thread pointer.
fn own_state_below(tp: u64) -> (u64, u64) {
    (
        tp.wrapping_sub(state_below()),
        core::mem::size_of::<crate::state::ThreadState>() as u64,
    )
}

/// How far below its thread pointer a thread's tracer state lies.
fn state_below() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    me.wrapping_sub(crate::state::current() as *const _ as u64)
}

/// Where every thread's `busy` flag lies below its thread pointer, when the tracer's state is
/// in static TLS (the library preloaded, not loaded later by `mem-trace attach`, whose
/// dynamic TLS lies elsewhere in each thread).
pub(crate) fn busy_below() -> Option<u64> {
    let below = state_below();
    let size = TLS_STATIC_SIZE.load(Relaxed) as u64;
    (below > 0 && below <= size).then(|| below - crate::state::offsets::BUSY as u64)
}

/// Whether `[lo, hi)` overlaps a stack the threads table knows, or holds one of the control
/// blocks of threads the program made (a live thread's stack, or one glibc keeps for the
/// next thread, whose stale words are no roots).
pub(crate) fn holds_a_stack(lo: u64, hi: u64) -> bool {
    THREAD_STACKS.iter().any(|s| {
        let (slo, shi) = (s.lo.load(Relaxed), s.hi.load(Relaxed));
        s.index.load(Relaxed) != 0 && shi != 0 && slo < hi && lo < shi
    }) || TCBS.iter().any(|t| (lo..hi).contains(&t.load(Relaxed)))
}

/// The writable segments of the loaded modules, this library's excepted.
pub(crate) struct Modules {
    ranges: [(u64, u64); MAX_MODULE_RANGES],
    n: usize,
}

const MAX_MODULE_RANGES: usize = 512;

impl Modules {
    /// The segments now. Taken before the other threads are stopped: `dl_iterate_phdr`
    /// takes the loader's lock, which a stopped thread may hold.
    pub(crate) fn now() -> Self {
        let mut m = Modules {
            ranges: [(0, 0); MAX_MODULE_RANGES],
            n: 0,
        };
        modules(&mut |r: Root| {
            if m.n < MAX_MODULE_RANGES {
                m.ranges[m.n] = (r.lo, r.hi);
                m.n += 1;
            }
        });
        m
    }

    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges[..self.n]
    }
}

/// Writable `PT_LOAD` segments (data, bss) of every loaded module except this library, whose
/// own data holds the tracer's tables (every block's address: scanning it would make every
/// block reachable).
fn modules(f: &mut impl FnMut(Root)) {
    const MAX: usize = 512;
    struct Found {
        ranges: [(u64, u64); MAX],
        n: usize,
        ours: u64,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Found` handed to dl_iterate_phdr below; `info` is valid for
        // the call, its program headers `dlpi_phnum` entries long.
        let (found, info) = unsafe { (&mut *(data as *mut Found), &*info) };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let base = info.dlpi_addr;
        let is_ours = phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD
                && (base + p.p_vaddr..base + p.p_vaddr + p.p_memsz).contains(&found.ours)
        });
        if is_ours {
            return 0;
        }
        for p in phdrs {
            if p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_W != 0 && found.n < MAX {
                let lo = base + p.p_vaddr;
                found.ranges[found.n] = (lo, lo + p.p_memsz);
                found.n += 1;
            }
        }
        0
    }
    let mut found = Found {
        ranges: [(0, 0); MAX],
        n: 0,
        // Any address inside this library's writable data.
        ours: &THREAD_STACKS as *const _ as u64,
    };
    // SAFETY: the callback only reads the loader's records and writes into `found`; it does
    // not allocate (the loader lock is held meanwhile).
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut Found as *mut libc::c_void) };
    for &(lo, hi) in &found.ranges[..found.n] {
        f(Root {
            lo,
            hi,
            downward: false,
        });
    }
}
