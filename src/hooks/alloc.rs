//! `malloc`, `calloc`, `realloc`, `reallocarray` and `free`: the calls every program makes.

use crate::allocator::{self, Underneath};
use core::ffi::c_void;
use core::ptr;
use mem_trace_core::format::Block;
use mem_trace_core::guard::Guard;
use mem_trace_core::record::{self, nested, tagged, Disposition};
use mem_trace_core::store::tags;

/// Where a hook was called from: the caller's stack pointer once the hook returns, and its
/// rbp, read by the hook's first two instructions and passed on as extra arguments. The
/// stack recorded then starts at the caller's frame: walking up from the capture through
/// the tracer's own frames cost ~4 steps of the walk on every allocation, for frames that
/// are dropped anyway. The entries are naked so that nothing moves rsp or rbp before they
/// are read, and they jump (not call) so that the hook returns straight to its caller.
#[derive(Clone, Copy)]
struct Caller {
    sp: u64,
    bp: u64,
}

impl Caller {
    /// Stacks recorded while the result lives start at this caller's frame, unless an
    /// allocator wrapper in the program set where they start (`None`).
    ///
    /// # Safety
    /// `self` was read at the entry of the hook now running on this thread.
    #[inline(always)]
    unsafe fn start<'g>(self, g: &'g Guard) -> Option<record::StartHere<'g>> {
        // SAFETY: forwarded contract: the return address is at `sp - 8`, the hook running.
        unsafe { record::start_at_caller(g, self.sp, self.bp) }
    }
}

/// The first lines of `malloc`'s and `calloc`'s untouched path: the thread's state in rax,
/// at the thread pointer plus `sample::FAST` (operand `fast`); a jump to `4f` when that is 0:
/// the path is closed, or the state is reached only through the TLS descriptor (after an
/// attach).
macro_rules! state_by_offset_or_4f {
    () => {
        concat!(
            "mov {fast}(%rip), %rax\n",
            "test %rax, %rax\n",
            "jz 4f\n",
            "add %fs:0, %rax",
        )
    };
}

/// With the thread's state in rax and an allocation's size in `$size`: the size taken off
/// the thread's countdown (operands `busy` and `countdown`), as `sample::Local::skip` does
/// on a call that stays above the sample point; a jump to `2f` when the thread is inside the
/// tracer or the size reaches the point. Unsigned, as the countdown is never negative: a size
/// past `i64::MAX` is one no countdown covers. Uses rdx.
macro_rules! countdown_takes_or_2f {
    ($size:literal) => {
        concat!(
            "cmpb $0, {busy}(%rax)\n",
            "jne 2f\n",
            "mov {countdown}(%rax), %rdx\n",
            "cmp %rdx, ",
            $size,
            "\n",
            "jae 2f\n",
            "sub ",
            $size,
            ", %rdx\n",
            "mov %rdx, {countdown}(%rax)",
        )
    };
}
pub(super) use {countdown_takes_or_2f, state_by_offset_or_4f};

/// The body of `malloc`'s entry, for the hook and its twin (`hooks::local`).
macro_rules! malloc_entry {
    () => {
        core::arch::naked_asm!(
            // Sampling's untouched path (see `sample::PASS`), in assembly because nearly every
            // call takes it: compiled, it saved three registers around glibc's call and went
            // through the entry's jump first. The thread's state is at the thread pointer
            // plus `sample::FAST` when that is set (the library loaded at start), else by
            // the TLS descriptor (after an attach).
            $crate::hooks::alloc::state_by_offset_or_4f!(),
            // Keeps `size` for a null result, and aligns the stack for the calls below.
            "push %rdi",
            "5:",
            $crate::hooks::alloc::countdown_takes_or_2f!("%rdi"),
            "call *{real}(%rip)",
            "pop %rdi",
            // Out of memory: the full path gives glibc the quarantine's blocks and asks again.
            "test %rax, %rax",
            "jz 3f",
            "ret",
            "4:",
            "cmpb $0, {pass}(%rip)",
            "je 3f",
            "push %rdi",
            mem_trace_core::thread_state_in_rax!(),
            "jmp 5b",
            "2:",
            "pop %rdi",
            "3:",
            // The caller's registers as `malloc_from`'s second and third arguments (see `Caller`).
            "lea 8(%rsp), %rsi",
            "mov %rbp, %rdx",
            "jmp {from}",
            fast = sym mem_trace_core::sample::FAST,
            pass = sym mem_trace_core::sample::PASS,
            busy = const mem_trace_core::state::offsets::BUSY,
            countdown = const mem_trace_core::state::offsets::COUNTDOWN,
            real = sym $crate::allocator::MALLOC,
            from = sym $crate::hooks::alloc::malloc_from,
            options(att_syntax),
        )
    };
}
pub(super) use malloc_entry;

#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
/// `malloc(3)`.
///
/// # Safety
/// As for glibc's `malloc`.
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    malloc_entry!()
}

/// `malloc` on the full path, called by its entry with the caller's registers (see
/// [`Caller`]).
///
/// # Safety
/// As for glibc's `malloc`; `sp` and `bp` as [`Caller`] says.
pub(super) unsafe extern "C" fn malloc_from(size: usize, sp: u64, bp: u64) -> *mut c_void {
    allocator::ensure_chosen();
    let caller = Caller { sp, bp };
    let Some(g) = Guard::enter() else {
        return nested_malloc(size);
    };
    // SAFETY: forwarded contract.
    let _start = unsafe { caller.start(&g) };
    if let Some(room) = tagged::room(size) {
        let mut p0 = record::reuse(&g, room, &Underneath);
        if p0.is_null() {
            // SAFETY: the allocator's malloc has no preconditions.
            p0 = from_allocator(&g, room, || unsafe { allocator::malloc(room) });
        }
        // SAFETY: a fresh or recycled chunk of `room` bytes, or null.
        return unsafe { tagged::tag(&g, p0, size) };
    }
    let mut p = record::reuse(&g, size, &Underneath);
    if p.is_null() {
        // SAFETY: the allocator's malloc has no preconditions.
        p = from_allocator(&g, size, || unsafe { allocator::malloc(size) });
    }
    record::allocated(&g, p, size);
    p
}

/// A `malloc` inside the tracer (the guard held): the allocator's, or the arena's while the tracer
/// asks for that (`record::nested`).
#[cold]
#[inline(never)]
fn nested_malloc(size: usize) -> *mut c_void {
    match nested::malloc(size) {
        // SAFETY: the allocator's malloc has no preconditions.
        p if p.is_null() => unsafe { allocator::malloc(size) },
        p => p,
    }
}

/// A `calloc` inside the tracer, as [`nested_malloc`].
#[cold]
#[inline(never)]
fn nested_calloc(n: usize, size: usize) -> *mut c_void {
    match nested::calloc(n, size) {
        // SAFETY: the allocator's calloc has no preconditions.
        p if p.is_null() => unsafe { allocator::calloc(n, size) },
        p => p,
    }
}

/// `ask()`, a call into the allocator for `size` bytes (marked, see `Guard::in_glibc`),
/// and once more through [`again`] if it returned null.
#[inline(always)]
pub(super) fn from_allocator(g: &Guard, size: usize, ask: impl Fn() -> *mut c_void) -> *mut c_void {
    match g.in_glibc(&ask) {
        p if p.is_null() => again(g, size, ask),
        p => p,
    }
}

/// The allocator returned null for `size` bytes: if it ran out of memory (`ENOMEM`, not a bad
/// argument), the quarantine gives it back every block it holds and it is asked once more
/// (`ask`); null if nothing was held. Without this, blocks held back for the program's
/// protection would make it fail where it would not without the tracer.
#[cold]
#[inline(never)]
pub(super) fn again(g: &Guard, size: usize, ask: impl FnOnce() -> *mut c_void) -> *mut c_void {
    // SAFETY: errno is this thread's.
    let out_of_memory = unsafe { *libc::__errno_location() } == libc::ENOMEM;
    // glibc refuses more than PTRDIFF_MAX bytes without trying: giving back would not help.
    if out_of_memory && size <= isize::MAX as usize && record::give_back(g, &Underneath) {
        return g.in_glibc(ask);
    }
    ptr::null_mut()
}

/// The body of `calloc`'s entry, for the hook and its twin (`hooks::local`).
macro_rules! calloc_entry {
    () => {
        core::arch::naked_asm!(
            // Sampling's untouched path, as in `malloc`, for the product.
            "mov %rdi, %rax",
            "mul %rsi",
            // An overflowing product is glibc's to refuse, on the full path.
            "jo 3f",
            "mov %rax, %rcx",
            $crate::hooks::alloc::state_by_offset_or_4f!(),
            // Keep `n` and `size` for a null result; three words align the stack for the calls.
            "push %rdi",
            "push %rsi",
            "push %rcx",
            "5:",
            $crate::hooks::alloc::countdown_takes_or_2f!("%rcx"),
            "call *{real}(%rip)",
            "pop %rcx",
            "pop %rsi",
            "pop %rdi",
            "test %rax, %rax",
            "jz 3f",
            "ret",
            "4:",
            "cmpb $0, {pass}(%rip)",
            "je 3f",
            "push %rdi",
            "push %rsi",
            "push %rcx",
            mem_trace_core::thread_state_in_rax!(),
            "jmp 5b",
            "2:",
            "pop %rcx",
            "pop %rsi",
            "pop %rdi",
            "3:",
            // The caller's registers as `calloc_from`'s third and fourth arguments (see `Caller`).
            "lea 8(%rsp), %rdx",
            "mov %rbp, %rcx",
            "jmp {from}",
            fast = sym mem_trace_core::sample::FAST,
            pass = sym mem_trace_core::sample::PASS,
            busy = const mem_trace_core::state::offsets::BUSY,
            countdown = const mem_trace_core::state::offsets::COUNTDOWN,
            real = sym $crate::allocator::CALLOC,
            from = sym $crate::hooks::alloc::calloc_from,
            options(att_syntax),
        )
    };
}
pub(super) use calloc_entry;

#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
/// `calloc(3)`; overflow of `n * size` is glibc's to report (NULL, `ENOMEM`).
///
/// # Safety
/// As for glibc's `calloc`.
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    calloc_entry!()
}

/// `calloc` on the full path, called by its entry with the caller's registers (see
/// [`Caller`]).
///
/// # Safety
/// As for glibc's `calloc`; `sp` and `bp` as [`Caller`] says.
pub(super) unsafe extern "C" fn calloc_from(
    n: usize,
    size: usize,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    allocator::ensure_chosen();
    let caller = Caller { sp, bp };
    let Some(g) = Guard::enter() else {
        return nested_calloc(n, size);
    };
    // SAFETY: forwarded contract.
    let _start = unsafe { caller.start(&g) };
    if let Some(room) = n.checked_mul(size).and_then(tagged::room) {
        let mut p0 = record::reuse(&g, room, &Underneath);
        if p0.is_null() {
            // SAFETY: the allocator's calloc has no preconditions.
            p0 = from_allocator(&g, room, || unsafe { allocator::calloc(1, room) });
        } else {
            // SAFETY: a recycled chunk of at least `room` bytes, now this call's.
            unsafe { ptr::write_bytes(p0.cast::<u8>(), 0, room) };
        }
        // SAFETY: a fresh or recycled chunk of `room` bytes, or null.
        return unsafe { tagged::tag(&g, p0, n * size) };
    }
    let recycled = n
        .checked_mul(size)
        .map(|total| (total, record::reuse(&g, total, &Underneath)));
    let p = match recycled {
        Some((total, p)) if !p.is_null() => {
            // SAFETY: a recycled block of at least `total` bytes, now this call's.
            unsafe { ptr::write_bytes(p.cast::<u8>(), 0, total) };
            p
        }
        // SAFETY: the allocator's calloc has no preconditions.
        _ => from_allocator(&g, n.saturating_mul(size), || unsafe {
            allocator::calloc(n, size)
        }),
    };
    // Non-null means the product did not overflow.
    record::allocated(&g, p, n.wrapping_mul(size));
    p
}

/// The body of `free`'s entry, for the hook and its twin (`hooks::local`).
macro_rules! free_entry {
    () => {
        core::arch::naked_asm!(
            "test %rdi, %rdi",
            "jz 2f",
            // Sampling's untouched path (see `sample::PASS`): the filter's count for `p` is 0,
            // so it is surely no sampled block and glibc's alone.
            "cmpb $0, {pass}(%rip)",
            "je 3f",
            "movabs ${mul}, %rax",
            "imul %rdi, %rax",
            "shr ${shift}, %rax",
            "lea {counts}(%rip), %rcx",
            "cmpb $0, (%rcx,%rax)",
            "jne 3f",
            "jmp *{real}(%rip)",
            "2:",
            "ret",
            "3:",
            // The caller's registers as `free_from`'s second and third arguments (see `Caller`).
            "lea 8(%rsp), %rsi",
            "mov %rbp, %rdx",
            "jmp {from}",
            pass = sym mem_trace_core::sample::PASS,
            mul = const mem_trace_core::sample::FILTER_MUL,
            shift = const mem_trace_core::sample::FILTER_SHIFT,
            counts = sym mem_trace_core::sample::COUNTS,
            real = sym $crate::allocator::FREE,
            from = sym $crate::hooks::alloc::free_from,
            options(att_syntax),
        )
    };
}
pub(super) use free_entry;

#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
/// `free(3)`. A freed block may be held in quarantine instead of going back to glibc at once,
/// and a double or invalid free is reported and kept from glibc (which would abort).
///
/// # Safety
/// `p` is null or a live block of this process's allocator (violations are reported).
pub unsafe extern "C" fn free(p: *mut c_void) {
    free_entry!()
}

/// `free` on the full path, called by its entry with the caller's registers (see
/// [`Caller`]), `p` not null.
///
/// Profile mode's free of a tagged block (most frees there) is done here; the other cases
/// are functions of their own. With all of them inlined here, `live` ran 1.57x plain in
/// profile mode against 1.38x split so (docs/FINDINGS.md, "Profile mode on `live`").
///
/// # Safety
/// As for [`free`]; `sp` and `bp` as [`Caller`] says.
pub(super) unsafe extern "C" fn free_from(p: *mut c_void, sp: u64, bp: u64) {
    allocator::ensure_chosen();
    let caller = Caller { sp, bp };
    let Some(g) = Guard::enter() else {
        // SAFETY: forwarded contract.
        return unsafe { free_nested(p) };
    };
    if !tagged::frees_kept() {
        // SAFETY: forwarded contract.
        match unsafe { tagged::untag(&g, p) } {
            Some(block) => {
                let chunk = tagged::freed(&block);
                // SAFETY: the tagged block's chunk, which the tracer no longer refers to.
                g.in_glibc(|| unsafe { allocator::free(chunk) });
            }
            // SAFETY: forwarded contract.
            None => unsafe { free_recorded(g, p, caller) },
        }
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { free_kept(g, p, caller) }
}

/// [`free_from`] when frees are kept (debug mode): a tagged block's free is recorded and held.
///
/// # Safety
/// As for [`free_from`].
#[inline(never)]
unsafe fn free_kept(g: Guard, p: *mut c_void, caller: Caller) {
    // Until this free is written down: another thread's free of the same block waits for it
    // rather than judge the block unknown (`record::racing`).
    let _freeing = record::freeing(&g, p as u64);
    // SAFETY: forwarded contract.
    let Some(block) = (unsafe { tagged::untag_once(&g, p) }) else {
        // SAFETY: forwarded contract.
        return unsafe { free_recorded(g, p, caller) };
    };
    let chunk = {
        // SAFETY: forwarded contract.
        let _start = unsafe { caller.start(&g) };
        record::free_tagged(&g, block, &Underneath)
    };
    if let Some(chunk) = chunk {
        // SAFETY: the tagged block's chunk, which the tracer no longer refers to.
        g.in_glibc(|| unsafe { allocator::free(chunk) });
    }
}

/// [`free_from`] for a block with no tag: recorded in the table (or not the tracer's).
///
/// # Safety
/// As for [`free_from`].
#[inline(never)]
unsafe fn free_recorded(g: Guard, p: *mut c_void, caller: Caller) {
    let disposition = {
        // SAFETY: forwarded contract.
        let _start = unsafe { caller.start(&g) };
        record::free(&g, p, &Underneath)
    };
    // The tracer no longer refers to the block: glibc gets it outside the guard.
    drop(g);
    if disposition == Disposition::Release {
        // SAFETY: forwarded contract.
        unsafe { allocator::free(p) };
    }
}

/// [`free_from`] inside the tracer (a nested call, or a signal handler's).
///
/// # Safety
/// As for [`free_from`].
#[inline(never)]
unsafe fn free_nested(p: *mut c_void) {
    // SAFETY: forwarded contract.
    if unsafe { nested::free(p) } {
        return;
    }
    // SAFETY: forwarded contract.
    match unsafe { tagged::untag_uncounted(p) } {
        // SAFETY: the tagged block's chunk, given up by the program.
        Some(p0) => unsafe { allocator::free(p0) },
        // SAFETY: forwarded contract; the tracer does not refer to the block.
        None => unsafe { allocator::free(p) },
    }
}

#[cfg_attr(not(test), no_mangle)]
#[unsafe(naked)]
/// `realloc(3)`: the result is recorded as a new block allocated here (ASan does the same);
/// when the block moves, or size 0 frees it, the old one joins the freed-block history.
///
/// # Safety
/// As for glibc's `realloc`.
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // The caller's registers as `realloc_from`'s third and fourth arguments (see `Caller`).
    core::arch::naked_asm!(
        "lea rdx, [rsp + 8]",
        "mov rcx, rbp",
        "jmp {from}",
        from = sym realloc_from,
    )
}

/// `realloc`, called by its entry with the caller's registers (see [`Caller`]).
///
/// # Safety
/// As for glibc's `realloc`; `sp` and `bp` as [`Caller`] says.
pub(super) unsafe extern "C" fn realloc_from(
    p: *mut c_void,
    size: usize,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n), for the same caller.
        return unsafe { malloc_from(size, sp, bp) };
    }
    allocator::ensure_chosen();
    let Some(g) = Guard::enter() else {
        // SAFETY: forwarded contract.
        if let Some(q) = unsafe { nested::realloc(p, size) } {
            return q;
        }
        // SAFETY: forwarded contract.
        if let Some(old) = unsafe { tags::read(p) } {
            // SAFETY: forwarded contract.
            return unsafe { realloc_tagged_uncounted(p, size, old.size) };
        }
        // SAFETY: forwarded contract.
        return unsafe { allocator::realloc(p, size) };
    };
    // SAFETY: forwarded contract.
    let _start = unsafe { Caller { sp, bp }.start(&g) };
    // SAFETY: forwarded contract.
    if let Some(old) = unsafe { tagged::untag(&g, p) } {
        // SAFETY: `old` was just untagged from `p`.
        return unsafe { realloc_tagged(&g, old, size) };
    }
    let old = record::take(&g, p);
    if old.is_none() {
        // A block a signal handler got from the tracer's arena (`nested`), then kept.
        // SAFETY: forwarded contract.
        if let Some(q) = unsafe { nested::realloc(p, size) } {
            return q;
        }
        if !record::realloc_unknown(&g, p, &Underneath) {
            // A freed (or never allocated) block: glibc would corrupt its heap or abort.
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            return core::ptr::null_mut();
        }
    }
    // SAFETY: forwarded contract.
    let ask = || unsafe { allocator::realloc(p, size) };
    let mut q = g.in_glibc(ask);
    // Size 0 freed `p`: a null result is no failure. Otherwise `p` is untouched and may be
    // asked for again.
    if q.is_null() && size != 0 {
        q = again(&g, size, ask);
    }
    record::reallocated(&g, old, p, q, size);
    q
}

/// `realloc` of a tagged block `old` (its tag erased, uncounted from its stack): the result
/// is tagged if it is small enough, else it goes to the table; a failure leaves `old` as it
/// was, tag and counts.
///
/// # Safety
/// `old` came from `tagged::untag` on this call's pointer.
#[inline(never)]
unsafe fn realloc_tagged(g: &Guard, old: Block, size: usize) -> *mut c_void {
    let p = old.addr as *mut c_void;
    let p0 = tags::chunk(p);
    if size == 0 {
        // glibc's realloc(p, 0) frees the block and returns null.
        record::freed_by_realloc(g, old);
        // SAFETY: the chunk of a block the program gave up.
        g.in_glibc(|| unsafe { allocator::free(p0) });
        return core::ptr::null_mut();
    }
    let q = match tagged::room(size) {
        Some(room) => {
            // SAFETY: `p0` is a live chunk of glibc's.
            let ask = || unsafe { allocator::realloc(p0, room) };
            match g.in_glibc(ask) {
                q0 if q0.is_null() => q0,
                // SAFETY: a chunk of `room` bytes from glibc's realloc of `old`'s.
                q0 => return unsafe { tagged::reallocated(g, &old, q0 != p0, q0, size) },
            }
        }
        // Too large for a tag: a table block of its own, the old bytes copied over.
        None => {
            // SAFETY: the allocator's malloc has no preconditions.
            let q = g.in_glibc(|| unsafe { allocator::malloc(size) });
            if !q.is_null() {
                // SAFETY: both blocks hold at least `old.size` bytes and are distinct.
                unsafe {
                    ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.size as usize)
                };
                // SAFETY: the chunk of the block just copied out.
                g.in_glibc(|| unsafe { allocator::free(p0) });
                record::moved(g, old, q, size);
            }
            q
        }
    };
    if q.is_null() {
        // SAFETY: the realloc failed, so `old`'s chunk is untouched and still the program's.
        unsafe { tagged::restore(g, &old) };
    }
    q
}

/// `realloc` of a tagged block where the tracer cannot count (see `tagged::untag_uncounted`):
/// the block moves to an untagged one of glibc's, unrecorded.
///
/// # Safety
/// `p` is a tagged block of `old_size` bytes (`tags::read` said so) the program reallocates.
#[cold]
unsafe fn realloc_tagged_uncounted(p: *mut c_void, size: usize, old_size: u64) -> *mut c_void {
    // glibc's realloc(p, 0) frees the block and returns null.
    let mut q = ptr::null_mut();
    if size != 0 {
        // SAFETY: the allocator's malloc has no preconditions.
        q = unsafe { allocator::malloc(size) };
        if q.is_null() {
            return q;
        }
        // SAFETY: both blocks hold at least the bytes copied, and are distinct.
        unsafe {
            ptr::copy_nonoverlapping(
                p.cast::<u8>(),
                q.cast::<u8>(),
                (old_size as usize).min(size),
            )
        };
    }
    // SAFETY: forwarded contract: the caller read `p`'s tag, and the program gives `p` up.
    unsafe { allocator::free(tags::erase(p)) };
    q
}

#[cfg_attr(not(test), no_mangle)]
/// `reallocarray(3)`: `ENOMEM` on overflow of `n * size`, like glibc, else `realloc`.
///
/// # Safety
/// As for glibc's `reallocarray`.
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded contract.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            core::ptr::null_mut()
        }
    }
}
