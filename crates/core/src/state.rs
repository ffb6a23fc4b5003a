//! What the tracer keeps per thread, assembled from the part each module owns.
//!
//! The state is a `const`-initialised thread-local without a destructor: accessing it never
//! allocates and never registers a TLS destructor (which would call `calloc` through
//! `__cxa_thread_atexit_impl`), so it is usable from the first `malloc` of a thread to its
//! last one, even while the thread is being torn down.

use crate::capture;
use crate::store::{freed, quarantine, stacks, threads};
use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The per-thread state: one field per module that keeps something per thread.
///
/// `repr(C)`, the fields the sampled path reads on every call first: `busy` and the sample
/// countdown then share one cache line, where Rust's own order had put them 1 KiB apart.
#[repr(C)]
pub(crate) struct ThreadState {
    /// Whether the thread is inside the tracer (see `guard`).
    pub(crate) busy: Cell<bool>,
    /// Bytes to this thread's next sampled allocation (`MEM_TRACE_SAMPLE`).
    pub(crate) sample: crate::sample::Local,
    /// The stack pointer where the thread last entered the tracer (see `guard`).
    pub(crate) entry_sp: Cell<usize>,
    /// Whether the thread is inside glibc's allocator, called by the tracer (see `guard`).
    pub(crate) in_glibc: Cell<bool>,
    /// Whether a signal handler left the tracer for good with `siglongjmp` (see `guard`).
    pub(crate) left: Cell<bool>,
    /// Whether glibc's allocations inside the tracer's calls come from the arena
    /// (`record::nested`).
    pub(crate) nested_from_arena: Cell<bool>,
    /// The thread's index in the thread table.
    pub thread: threads::Local,
    /// Stack bounds, unwinder state and the frame buffer.
    pub capture: capture::Local,
    /// Recently interned stacks.
    pub stacks: stacks::Local,
    /// Records of the freed-block history this thread has claimed.
    pub history: freed::Claim,
    /// This thread's frees waiting for their record and hold (`record::deferred`).
    pub deferred: crate::record::batch::Local,
    /// The block this thread is freeing, for racing frees of it (`record::racing`).
    pub freeing: crate::record::racing::Local,
    /// This thread's quarantine.
    pub quarantine: quarantine::Local,
    /// This thread's cache of per-stack counter deltas.
    pub profile: crate::profile::counters::Local,
}

impl ThreadState {
    const fn new() -> Self {
        Self {
            busy: Cell::new(false),
            sample: crate::sample::Local::new(),
            entry_sp: Cell::new(0),
            in_glibc: Cell::new(false),
            left: Cell::new(false),
            nested_from_arena: Cell::new(false),
            thread: threads::Local::new(),
            capture: capture::Local::new(),
            stacks: stacks::Local::new(),
            history: freed::Claim::new(),
            deferred: crate::record::batch::Local::new(),
            freeing: crate::record::racing::Local::new(),
            quarantine: quarantine::Local::new(),
            profile: crate::profile::counters::Local::new(),
        }
    }
}

// What the zero-filled storage below stands for: `a_new_state_is_all_zeros` holds them equal.
const _: ThreadState = ThreadState::new();

/// The TLS symbol that holds each thread's [`ThreadState`]. Hidden: a program with the
/// tracer linked in (`Traced`) and the preloaded library each keep their own.
#[doc(hidden)]
#[macro_export]
macro_rules! thread_state_symbol {
    () => {
        "mem_trace_thread_state"
    };
}

/// Assembly (AT&T syntax) that leaves the calling thread's [`ThreadState`] address in rax,
/// for [`current`] and for the hooks' entries: the TLS descriptor sequence, which keeps every
/// other general register (see `current` for the vector registers). The stack must be
/// aligned for a call.
#[doc(hidden)]
#[macro_export]
macro_rules! thread_state_in_rax {
    () => {
        concat!(
            "lea ",
            $crate::thread_state_symbol!(),
            "@TLSDESC(%rip), %rax\n",
            "call *",
            $crate::thread_state_symbol!(),
            "@TLSCALL(%rax)\n",
            "add %fs:0, %rax",
        )
    };
}

/// Where the fields sampling's untouched path reads lie in [`ThreadState`], for the hooks'
/// entries written in assembly.
pub mod offsets {
    use super::ThreadState;
    /// `busy`, a byte: nonzero while the thread is inside the tracer.
    pub const BUSY: usize = core::mem::offset_of!(ThreadState, busy);
    /// The sample countdown, an `i64` never negative (see `sample::Local`).
    pub const COUNTDOWN: usize =
        core::mem::offset_of!(ThreadState, sample) + crate::sample::COUNTDOWN_OFFSET;
}

// The state lives in a TLS symbol of our own, reached through a TLS descriptor, because
// `thread_local!` in a shared library compiles to the general-dynamic model: a call to
// `__tls_get_addr` at every hook, which clobbers every caller-saved register, so that even
// the sampled fast path of `malloc` saved and restored three of them. A descriptor's
// resolver is chosen by the loader: for a library loaded at start (`LD_PRELOAD`) it returns
// a constant offset in two instructions; for one loaded later (the attach's `dlopen`) it
// does `__tls_get_addr`'s work. Stable Rust cannot ask for that model (`-Z tls-model` is
// unstable), hence the assembly. The initial-exec model would save one more load, but it
// puts the module's whole TLS block in static TLS, and a `dlopen` of a ~3 KiB block fails
// there for lack of room (glibc keeps ~1.5 KiB spare).
// `.tbss` is zero-filled: `ThreadState::new()` is all zeros, as a test checks.
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align {align}",
    concat!(".globl ", thread_state_symbol!()),
    concat!(".hidden ", thread_state_symbol!()),
    concat!(".type ", thread_state_symbol!(), ",@object"),
    concat!(".size ", thread_state_symbol!(), ",{size}"),
    concat!(thread_state_symbol!(), ":"),
    ".zero {size}",
    ".popsection",
    align = const core::mem::align_of::<ThreadState>().trailing_zeros(),
    size = const core::mem::size_of::<ThreadState>(),
);

/// The state's offset from the thread pointer when it is the same in every thread (0: not
/// known, or not so): [`current`] then adds it to the thread pointer instead of calling the
/// descriptor's resolver, and sampling's untouched path (`sample::FAST`) does the same.
static STATIC_OFFSET: AtomicU64 = AtomicU64::new(0);

/// The current thread's state. The reference stays valid for the thread's whole life: the
/// storage has no destructor, so it lives as long as the thread.
#[inline(always)]
pub(crate) fn current() -> &'static ThreadState {
    let p = match STATIC_OFFSET.load(Relaxed) {
        0 => by_descriptor(),
        off => thread_pointer().wrapping_add(off),
    };
    // SAFETY: `p` is this thread's state (see `by_descriptor` and `learn_static_offset`),
    // zero-filled at first, a valid `ThreadState` (see the test), and the reference never
    // leaves this thread: ThreadState is !Sync.
    unsafe { &*(p as *const ThreadState) }
}

/// The calling thread's state, by the TLS descriptor.
#[inline(always)]
fn by_descriptor() -> u64 {
    let p: u64;
    // SAFETY: the TLS descriptor call sequence of the x86-64 ABI: the resolver keeps every
    // register but rax and the flags; the vector registers are declared clobbered for glibc
    // before 2.40, whose dynamic resolver could lose them (glibc bug 31372). The stack is
    // aligned for a call (no `nostack`). The words read (the descriptor, written by the
    // loader before any code runs, and the thread pointer) never change for a thread, so
    // the result is pure.
    unsafe {
        core::arch::asm!(
            thread_state_in_rax!(),
            out("rax") p,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            options(att_syntax, pure, nomem),
        );
    }
    p
}

/// The thread pointer: the address of the thread's control block, which starts with itself.
#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the word at %fs:0, which x86-64's TLS ABI makes the thread pointer.
    unsafe {
        core::arch::asm!(
            "mov %fs:0, {tp}",
            tp = out(reg) tp,
            options(att_syntax, nostack, pure, readonly, preserves_flags),
        );
    }
    tp
}

/// Learns whether the state lies at one offset from the thread pointer in every thread, and
/// returns that offset (0 if not). It does when the loader put the library's TLS in the
/// static block, as for every library loaded at start (`LD_PRELOAD`): the descriptor's
/// resolver then only returns the descriptor's second word, the same for all threads. After
/// a `dlopen` (the attach) the resolver may look the block up per thread, and the offset is
/// not learnt. Told by the resolver's code: glibc's `_dl_tlsdesc_return` is
/// `mov 8(%rax), %rax; ret` (after an `endbr64` in a CET build). In an executable the
/// linker has already turned the descriptor into a constant offset (the `lea` became a
/// `mov`), and the descriptor path costs nothing to keep.
pub(crate) fn learn_static_offset() -> u64 {
    let (desc, at): (u64, u64);
    // SAFETY: two address computations; nothing is read or written.
    unsafe {
        core::arch::asm!(
            "2:",
            concat!("lea ", thread_state_symbol!(), "@TLSDESC(%rip), %rax"),
            "lea 2b(%rip), {at}",
            out("rax") desc,
            at = out(reg) at,
            options(att_syntax, nostack, pure, nomem, preserves_flags),
        );
    }
    const LEA_RAX_RIP: [u8; 3] = [0x48, 0x8d, 0x05];
    const RETURN_ARG: [u8; 5] = [0x48, 0x8b, 0x40, 0x08, 0xc3];
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    // SAFETY: `at` is the instruction just above, in this library's mapped code.
    let insn = unsafe { core::ptr::read(at as *const [u8; 3]) };
    if insn != LEA_RAX_RIP {
        return 0;
    }
    // SAFETY: `desc` is this library's descriptor, in its GOT: two words the loader filled
    // (resolver, argument) before any code ran, readable from then on.
    let [resolver, arg] = unsafe { core::ptr::read(desc as *const [u64; 2]) };
    // SAFETY: the resolver is code the loader chose in a mapped module; nine bytes of it
    // are readable (a function at least `mov 8(%rax),%rax; ret` long, or the page holds it).
    let code = unsafe { core::ptr::read_unaligned(resolver as *const [u8; 9]) };
    let body = match code[..4] == ENDBR64 {
        true => &code[4..9],
        false => &code[..5],
    };
    if body != RETURN_ARG || arg == 0 {
        return 0;
    }
    // Checked against the descriptor sequence itself: they must agree in this thread.
    if thread_pointer().wrapping_add(arg) != by_descriptor() {
        return 0;
    }
    STATIC_OFFSET.store(arg, Relaxed);
    arg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills the stack below the caller with `fill`: a state built there and copied out
    /// brings its padding from it, which must follow the fill too (left as the earlier tests
    /// on this thread left it, a padding byte came out equal and non-zero under both fills).
    #[inline(never)]
    fn dirty_stack(fill: u8) {
        let mut page = [fill; 64 << 10];
        core::hint::black_box(&mut page);
    }

    /// A new state written over `fill`, as bytes.
    #[inline(never)]
    fn new_state_over(fill: u8) -> Vec<u8> {
        let n = core::mem::size_of::<ThreadState>();
        let mut buf = Box::new(core::mem::MaybeUninit::<ThreadState>::uninit());
        // SAFETY: the buffer holds one ThreadState; filling it first is allowed.
        unsafe {
            core::ptr::write_bytes(buf.as_mut_ptr() as *mut u8, fill, n);
            core::ptr::write(buf.as_mut_ptr(), ThreadState::new());
            core::slice::from_raw_parts(buf.as_ptr() as *const u8, n).to_vec()
        }
    }

    /// The TLS symbol starts zero-filled: every byte of a new state that is not padding must
    /// be zero. Padding is told from data by writing the state over two different fills.
    #[test]
    fn a_new_state_is_all_zeros() {
        let n = core::mem::size_of::<ThreadState>();
        let bytes = |fill: u8| {
            dirty_stack(fill);
            new_state_over(fill)
        };
        let (a, b) = (bytes(0x00), bytes(0xff));
        let data_nonzero: Vec<usize> = (0..n).filter(|&i| a[i] == b[i] && a[i] != 0).collect();
        assert!(
            data_nonzero.is_empty(),
            "non-zero bytes at {data_nonzero:?}"
        );
    }

    /// In an executable (this test) the linker resolved the descriptor to a constant offset
    /// already: nothing to learn, and `current` keeps the descriptor path.
    #[test]
    fn an_executable_has_no_offset_to_learn() {
        assert_eq!(learn_static_offset(), 0);
        assert_eq!(STATIC_OFFSET.load(Relaxed), 0);
    }

    #[test]
    fn each_thread_has_its_own_state() {
        let here = current() as *const ThreadState as usize;
        assert_eq!(here, current() as *const ThreadState as usize);
        current().busy.set(true);
        let there = std::thread::spawn(|| {
            let s = current();
            (s as *const ThreadState as usize, s.busy.get())
        })
        .join()
        .unwrap();
        current().busy.set(false);
        assert_ne!(here, there.0);
        assert!(!there.1, "a new thread starts with a new state");
    }
}
