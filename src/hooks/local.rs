//! The hooks' addresses inside this library, for an attach to put in the modules' GOTs.
//!
//! Taking the address of an exported hook (`malloc as usize`) goes through this library's
//! own GOT, which the loader fills by symbol lookup: under the preload that finds the hook,
//! but in a library `dlopen`ed into a running process it finds glibc's `malloc`, which the
//! program's modules found first. So each hook gets a twin here that is not exported and
//! reaches the hook without a lookup: the naked entries repeat the hook's three instructions
//! (a Rust wrapper's own frame would shift the caller's stack pointer they read; those of
//! `malloc`, `calloc` and `free` are the same macro), the others
//! are one direct call, which rustc makes without the PLT.

use super::{aligned, alloc, dlclose, dlopen, threads};
use core::ffi::{c_char, c_int, c_void};

/// A naked twin of a hook whose entry reads the caller's registers (`alloc::Caller`): the
/// same instructions, jumping to the same body.
macro_rules! entry {
    ($name:ident ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $sp:literal, $bp:literal, $from:path) => {
        #[unsafe(naked)]
        unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            core::arch::naked_asm!(
                concat!("lea ", $sp, ", [rsp + 8]"),
                concat!("mov ", $bp, ", rbp"),
                "jmp {from}",
                from = sym $from,
            )
        }
    };
}

/// Where the twins of `malloc` and `free` are, read by `mem-trace detach`: while attached, the
/// program's calls reach them, not glibc's (or its allocator's) entries, whose callers are
/// then the tracer's hooks; a thread at a twin's entry, called from the program, is at a safe
/// point to detach.
#[repr(C)]
pub struct AttachedEntries {
    malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
}

#[cfg_attr(not(test), no_mangle)]
#[used]
pub static MEM_TRACE_ATTACHED_ENTRIES: AttachedEntries = AttachedEntries { malloc, free };

/// `malloc`'s twin: the same entry, untouched path included.
#[unsafe(naked)]
unsafe extern "C" fn malloc(_size: usize) -> *mut c_void {
    alloc::malloc_entry!()
}

/// `calloc`'s twin, as `malloc`'s.
#[unsafe(naked)]
unsafe extern "C" fn calloc(_n: usize, _size: usize) -> *mut c_void {
    alloc::calloc_entry!()
}

/// `free`'s twin, as `malloc`'s.
#[unsafe(naked)]
unsafe extern "C" fn free(_p: *mut c_void) {
    alloc::free_entry!()
}

entry!(realloc(_p: *mut c_void, _size: usize) -> *mut c_void, "rdx", "rcx", alloc::realloc_from);

/// The `dlopen` hook's entry: the caller's return address, which glibc's `dlopen` would
/// have read to find the caller's search path, as a third argument.
#[unsafe(naked)]
unsafe extern "C" fn dlopen_entry(_name: *const c_char, _mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rdx, [rsp]",
        "jmp {from}",
        from = sym dlopen::dlopen_from,
    )
}

/// A twin that calls the hook directly.
macro_rules! direct {
    ($name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty, $hook:path) => {
        unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's contract is the hook's.
            unsafe { $hook($($arg),*) }
        }
    };
}

type Start = extern "C" fn(*mut c_void) -> *mut c_void;

direct!(reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void, alloc::reallocarray);
direct!(posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int, aligned::posix_memalign);
direct!(aligned_alloc(align: usize, size: usize) -> *mut c_void, aligned::aligned_alloc);
direct!(memalign(align: usize, size: usize) -> *mut c_void, aligned::memalign);
direct!(valloc(size: usize) -> *mut c_void, aligned::valloc);
direct!(pvalloc(size: usize) -> *mut c_void, aligned::pvalloc);
direct!(malloc_usable_size(p: *mut c_void) -> usize, aligned::malloc_usable_size);
direct!(
    pthread_create(
        thread: *mut libc::pthread_t,
        attr: *const libc::pthread_attr_t,
        routine: Start,
        arg: *mut c_void
    ) -> c_int,
    threads::pthread_create
);
direct!(dlclose(handle: *mut c_void) -> c_int, dlclose::dlclose);

/// The hooks an attach puts in the modules' GOTs (`attach::got`), by the name each replaces:
/// the malloc family, the two calls whose hooks keep the unwinder right (a thread's stack
/// bounds, a module unloaded), and `dlopen`, whose hook patches the modules it loads.
pub(crate) fn redirected() -> [(&'static [u8], usize); 14] {
    [
        (b"malloc", malloc as *const () as usize),
        (b"free", free as *const () as usize),
        (b"calloc", calloc as *const () as usize),
        (b"realloc", realloc as *const () as usize),
        (b"reallocarray", reallocarray as *const () as usize),
        (b"posix_memalign", posix_memalign as *const () as usize),
        (b"aligned_alloc", aligned_alloc as *const () as usize),
        (b"memalign", memalign as *const () as usize),
        (b"valloc", valloc as *const () as usize),
        (b"pvalloc", pvalloc as *const () as usize),
        (
            b"malloc_usable_size",
            malloc_usable_size as *const () as usize,
        ),
        (b"pthread_create", pthread_create as *const () as usize),
        (b"dlclose", dlclose as *const () as usize),
        (b"dlopen", dlopen_entry as *const () as usize),
    ]
}
