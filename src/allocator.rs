//! The allocator underneath the tracer: the one the program would have used without it.
//!
//! That is the next definition of `malloc` after this library in the lookup order: glibc's
//! in most programs, but jemalloc's, tcmalloc's or mimalloc's in a program linked with one of
//! them (servers often are: Debian's `redis-server` links `libjemalloc.so.2`). Every call of
//! the family goes to that one library, chosen once: a block it allocated must be freed,
//! resized and measured (`malloc_usable_size`) by it, and the program's own calls into it
//! (`mallctl`, its statistics) keep seeing its blocks. Where it lacks a function (`pvalloc`,
//! say), the hook makes it from the ones it has rather than borrow glibc's.
//!
//! The choice is made at the first call into the family, before any block exists: each
//! function's pointer starts at a stand-in that chooses, then calls the chosen function. The
//! choice looks the names up with `dlsym(RTLD_NEXT, ...)` and `dladdr`, which allocate nothing
//! in glibc 2.34 and later when the name is found (docs/FINDINGS.md, "Finding glibc's
//! allocator without a bootstrap heap"); should one allocate all the same, the nested call is
//! served by glibc's `__libc_*` entry points, which need no lookup.
//!
//! The entries read the pointers directly (`call *MALLOC(%rip)`): as cheap as the GOT entry of
//! `__libc_malloc` they used before.
//!
//! What depends on glibc's chunk layout (block tags, the check of a wild pointer against
//! glibc's heap) is off on another allocator (`mem_trace_core::real`).

use crate::dl::{dladdr1, RTLD_DL_SYMENT};
use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use mem_trace_core::real::RealAlloc;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
    fn gnu_get_libc_version() -> *const core::ffi::c_char;
}

/// The start of an ELF64 symbol table entry, up to the section index `dladdr1` is asked for.
#[repr(C)]
struct Elf64Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    /// 0 (`SHN_UNDEF`): not defined in this module.
    st_shndx: u16,
}

type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Calloc = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type Realloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Memalign = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type UsableSize = unsafe extern "C" fn(*mut c_void) -> usize;
type PosixMemalign = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;

/// The chosen functions, read by the hooks' entries as plain words.
pub static MALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_malloc as *mut c_void);
pub static CALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_calloc as *mut c_void);
pub static FREE: AtomicPtr<c_void> = AtomicPtr::new(first_free as *mut c_void);
static REALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_realloc as *mut c_void);
static MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(first_memalign as *mut c_void);
/// `aligned_alloc`, `valloc`, `pvalloc`, `malloc_usable_size`: null where the chosen
/// allocator has none (then made from the others, or 0 for the size).
static ALIGNED_ALLOC: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static VALLOC: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static PVALLOC: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static USABLE_SIZE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Not chosen yet, being chosen (by the thread in [`CHOOSER`]), chosen.
static STATE: AtomicU32 = AtomicU32::new(0);
static CHOOSER: AtomicUsize = AtomicUsize::new(0);
const CHOSEN: u32 = 2;

/// Chooses the allocator, once; returns when it is chosen. A call from inside the choice
/// (`dlsym` allocating) returns false at once: the caller then uses glibc's entry.
#[cold]
#[inline(never)]
fn choose() -> bool {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as usize;
    match STATE.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
        Ok(_) => CHOOSER.store(me, Ordering::Relaxed),
        Err(CHOSEN) => return true,
        Err(_) if CHOOSER.load(Ordering::Relaxed) == me => return false,
        Err(_) => {
            while STATE.load(Ordering::Acquire) != CHOSEN {
                core::hint::spin_loop();
            }
            return true;
        }
    }
    let found = other_allocator();
    if found.is_none() {
        MALLOC.store(__libc_malloc as *mut c_void, Ordering::Relaxed);
        CALLOC.store(__libc_calloc as *mut c_void, Ordering::Relaxed);
        FREE.store(__libc_free as *mut c_void, Ordering::Relaxed);
        REALLOC.store(__libc_realloc as *mut c_void, Ordering::Relaxed);
        MEMALIGN.store(__libc_memalign as *mut c_void, Ordering::Relaxed);
        VALLOC.store(__libc_valloc as *mut c_void, Ordering::Relaxed);
        PVALLOC.store(__libc_pvalloc as *mut c_void, Ordering::Relaxed);
        ALIGNED_ALLOC.store(next_in(c"aligned_alloc", glibc_base()), Ordering::Relaxed);
        USABLE_SIZE.store(
            next_in(c"malloc_usable_size", glibc_base()),
            Ordering::Relaxed,
        );
    }
    STATE.store(CHOSEN, Ordering::Release);
    // Attached, the program's lookups find its own malloc by design: the GOT entries do the
    // redirecting.
    if !crate::attach::loaded_late() {
        say_if_shadowed();
    }
    true
}

/// Says so on stderr when the program's lookups of `malloc` find another definition before
/// this library's: a program that defines its own (Chromium's allocator shim, linked into its
/// executable) never calls the hooks, and its blocks are invisible to the tracer.
fn say_if_shadowed() {
    // SAFETY: dlsym with a NUL-terminated name.
    let first = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = object_of(say_if_shadowed as *mut c_void);
    if first.is_null() || ours == 0 || object_of(first) == ours {
        return;
    }
    // SAFETY: all-zero is a valid Dl_info; dladdr1 only writes it and `sym`.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut entry: *mut c_void = core::ptr::null_mut();
    // SAFETY: `info` and `entry` are locals dladdr1 may write (RTLD_DL_SYMENT: the symbol's
    // table entry).
    let found = unsafe { dladdr1(first, &mut info, &mut entry, RTLD_DL_SYMENT) } != 0;
    let sym = entry.cast::<Elf64Sym>();
    // SAFETY: a non-null entry is the loader's, in the module's mapped symbol table.
    let defined = found && !sym.is_null() && unsafe { (*sym).st_shndx } != 0;
    if !defined || info.dli_saddr != first {
        // No definition there: a non-PIE executable that takes `malloc`'s address makes its
        // PLT stub the symbol's address (an undefined entry with a value: Debian's
        // /usr/bin/python3.11), and the stub calls the hook.
        return;
    }
    mem_trace_core::real::shadowed(file_name(&info).unwrap_or("the program's executable"));
}

/// Where glibc is loaded. Not found from `__libc_malloc`: tcmalloc defines that name too
/// (for glibc's own internal calls), and comes first in the lookup order of a program that
/// links it.
fn glibc_base() -> usize {
    object_of(gnu_get_libc_version as *mut c_void)
}

/// `name`'s definition after this library in the lookup order: `RTLD_NEXT` when preloaded;
/// when `dlopen`ed by `mem-trace attach` (local, after everything the program loaded), the
/// program's own (`RTLD_DEFAULT`), which the hooks do not shadow.
fn lookup(name: &CStr) -> *mut c_void {
    let handle = match crate::attach::loaded_late() {
        true => libc::RTLD_DEFAULT,
        false => libc::RTLD_NEXT,
    };
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

/// What `dladdr` knows of the object holding `f`.
fn dl_info(f: *mut c_void) -> Option<libc::Dl_info> {
    // SAFETY: all-zero is a valid Dl_info; dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `info` is a local dladdr may write.
    (unsafe { libc::dladdr(f, &mut info) } != 0).then_some(info)
}

/// The base address of the object holding `f`, 0 if none is known.
fn object_of(f: *mut c_void) -> usize {
    dl_info(f).map_or(0, |info| info.dli_fbase as usize)
}

/// The object's file name in `info`, when there is one (and it is UTF-8).
fn file_name(info: &libc::Dl_info) -> Option<&'static str> {
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string the loader keeps while the object
    // is loaded, and an allocator or the executable stays loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    (!name.is_empty()).then_some(name)
}

/// The next definition of `name` if it is in the object at `base`, else null.
fn next_in(name: &CStr, base: usize) -> *mut c_void {
    let f = lookup(name);
    if f.is_null() || object_of(f) != base {
        return core::ptr::null_mut();
    }
    f
}

/// When the next `malloc` is not glibc's: stores that library's family and says which it is
/// (`mem_trace_core::real`); `None` for glibc, or for a library lacking one of the functions
/// no other can stand in for (the program then gets glibc's, whole).
fn other_allocator() -> Option<()> {
    let malloc = lookup(c"malloc");
    let base = object_of(malloc);
    if malloc.is_null() || base == 0 || base == glibc_base() {
        return None;
    }
    let free = next_in(c"free", base);
    let calloc = next_in(c"calloc", base);
    let realloc = next_in(c"realloc", base);
    let memalign = next_in(c"memalign", base);
    let aligned_alloc = next_in(c"aligned_alloc", base);
    let posix = next_in(c"posix_memalign", base);
    if free.is_null() || calloc.is_null() || realloc.is_null() {
        return None;
    }
    let memalign = match (memalign, aligned_alloc, posix) {
        (m, _, _) if !m.is_null() => m,
        (_, a, _) if !a.is_null() => a,
        (_, _, p) if !p.is_null() => {
            POSIX_MEMALIGN.store(p, Ordering::Relaxed);
            memalign_by_posix as *mut c_void
        }
        _ => return None,
    };
    MALLOC.store(malloc, Ordering::Relaxed);
    CALLOC.store(calloc, Ordering::Relaxed);
    FREE.store(free, Ordering::Relaxed);
    REALLOC.store(realloc, Ordering::Relaxed);
    MEMALIGN.store(memalign, Ordering::Relaxed);
    ALIGNED_ALLOC.store(aligned_alloc, Ordering::Relaxed);
    VALLOC.store(next_in(c"valloc", base), Ordering::Relaxed);
    PVALLOC.store(next_in(c"pvalloc", base), Ordering::Relaxed);
    USABLE_SIZE.store(next_in(c"malloc_usable_size", base), Ordering::Relaxed);
    let info = dl_info(malloc);
    mem_trace_core::real::set_other(
        info.as_ref()
            .and_then(file_name)
            .unwrap_or("another library"),
    );
    Some(())
}

/// `posix_memalign` of an allocator with no `memalign` or `aligned_alloc`.
static POSIX_MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

unsafe extern "C" fn memalign_by_posix(align: usize, size: usize) -> *mut c_void {
    let mut p = core::ptr::null_mut();
    // SAFETY: set before this function is chosen, to a posix_memalign of that signature.
    let f = unsafe { load::<PosixMemalign>(&POSIX_MEMALIGN) };
    // posix_memalign wants a multiple of the word size.
    let align = align.max(core::mem::size_of::<usize>()).next_power_of_two();
    // SAFETY: `p` is a local it may write.
    match unsafe { f(&mut p, align, size) } {
        0 => p,
        e => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = e };
            core::ptr::null_mut()
        }
    }
}

/// Defines the stand-in a pointer starts at: chooses, then calls the chosen function (glibc's
/// entry when called from inside the choice).
macro_rules! first {
    ($name:ident, $slot:ident, $ty:ty, $glibc:ident, ($($arg:ident: $t:ty),*) $(-> $ret:ty)?) => {
        unsafe extern "C" fn $name($($arg: $t),*) $(-> $ret)? {
            if !choose() {
                // SAFETY: glibc's entry, of the same contract.
                return unsafe { $glibc($($arg),*) };
            }
            // SAFETY: the chosen function, of this signature; forwarded contract.
            unsafe { load::<$ty>(&$slot)($($arg),*) }
        }
    };
}

first!(first_malloc, MALLOC, Malloc, __libc_malloc, (size: usize) -> *mut c_void);
first!(first_calloc, CALLOC, Calloc, __libc_calloc, (n: usize, size: usize) -> *mut c_void);
first!(first_free, FREE, Free, __libc_free, (p: *mut c_void));
first!(first_realloc, REALLOC, Realloc, __libc_realloc, (p: *mut c_void, size: usize) -> *mut c_void);
first!(first_memalign, MEMALIGN, Memalign, __libc_memalign, (align: usize, size: usize) -> *mut c_void);

/// The function `slot` holds, of type `F`.
///
/// # Safety
/// `slot` holds a function of type `F` (a stand-in until chosen, or the chosen one).
#[inline(always)]
unsafe fn load<F: Copy>(slot: &AtomicPtr<c_void>) -> F {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<*mut c_void>()) };
    // SAFETY: forwarded contract; `F` is a function pointer, of a pointer's size.
    unsafe { core::mem::transmute_copy(&slot.load(Ordering::Relaxed)) }
}

/// The chosen allocator's `malloc`.
///
/// # Safety
/// As for `malloc`.
#[inline(always)]
pub unsafe fn malloc(size: usize) -> *mut c_void {
    // SAFETY: the slot's function, of this type; forwarded contract.
    unsafe { load::<Malloc>(&MALLOC)(size) }
}

/// The chosen allocator's `calloc`.
///
/// # Safety
/// As for `calloc`.
#[inline(always)]
pub unsafe fn calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: the slot's function, of this type; forwarded contract.
    unsafe { load::<Calloc>(&CALLOC)(n, size) }
}

/// The chosen allocator's `realloc`.
///
/// # Safety
/// As for `realloc`, `p` one of its blocks.
#[inline(always)]
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the slot's function, of this type; forwarded contract.
    unsafe { load::<Realloc>(&REALLOC)(p, size) }
}

/// The chosen allocator's `free`.
///
/// # Safety
/// As for `free`, `p` one of its blocks.
#[inline(always)]
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the slot's function, of this type; forwarded contract.
    unsafe { load::<Free>(&FREE)(p) }
}

/// The chosen allocator's `memalign` (or what stands in for it).
///
/// # Safety
/// As for `memalign`.
pub unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the slot's function, of this type; forwarded contract.
    unsafe { load::<Memalign>(&MEMALIGN)(align, size) }
}

/// The chosen allocator's `aligned_alloc`, whose rules are that library's (glibc 2.38 rejects
/// alignments that are not powers of two); `memalign` where it has none.
///
/// # Safety
/// As for `aligned_alloc`.
pub unsafe fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    ensure_chosen();
    match ALIGNED_ALLOC.load(Ordering::Relaxed) {
        // SAFETY: forwarded contract.
        f if f.is_null() => unsafe { memalign(align, size) },
        // SAFETY: the slot's function, of this type; forwarded contract.
        _ => unsafe { load::<Memalign>(&ALIGNED_ALLOC)(align, size) },
    }
}

/// The chosen allocator's `valloc`, or a page-aligned `memalign`.
///
/// # Safety
/// As for `valloc`.
pub unsafe fn valloc(size: usize) -> *mut c_void {
    ensure_chosen();
    match VALLOC.load(Ordering::Relaxed) {
        // SAFETY: forwarded contract.
        f if f.is_null() => unsafe { memalign(page(), size) },
        // SAFETY: the slot's function, of this type; forwarded contract.
        _ => unsafe { load::<Malloc>(&VALLOC)(size) },
    }
}

/// The chosen allocator's `pvalloc`, or a `memalign` of whole pages.
///
/// # Safety
/// As for `pvalloc`.
pub unsafe fn pvalloc(size: usize) -> *mut c_void {
    ensure_chosen();
    match PVALLOC.load(Ordering::Relaxed) {
        f if f.is_null() => {
            let Some(whole) = size.max(1).checked_next_multiple_of(page()) else {
                // SAFETY: errno is this thread's.
                unsafe { *libc::__errno_location() = libc::ENOMEM };
                return core::ptr::null_mut();
            };
            // SAFETY: forwarded contract.
            unsafe { memalign(page(), whole) }
        }
        // SAFETY: the slot's function, of this type; forwarded contract.
        _ => unsafe { load::<Malloc>(&PVALLOC)(size) },
    }
}

/// The chosen allocator's `malloc_usable_size`; 0 where it has none.
///
/// # Safety
/// `p` is null or one of its live blocks.
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    ensure_chosen();
    match USABLE_SIZE.load(Ordering::Relaxed) {
        f if f.is_null() => 0,
        // SAFETY: the slot's function, of this type; forwarded contract.
        _ => unsafe { load::<UsableSize>(&USABLE_SIZE)(p) },
    }
}

/// Chooses the allocator if that is not done yet: before the tracer initialises, which
/// switches off what needs glibc's heap when another allocator is chosen.
#[inline(always)]
pub fn ensure_chosen() {
    if STATE.load(Ordering::Acquire) != CHOSEN {
        choose();
    }
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// The allocator underneath the tracer: what the quarantine lets go returns here.
pub struct Underneath;

impl RealAlloc for Underneath {
    const GLIBC_HEAP: bool = true;

    #[inline(always)]
    unsafe fn free(&self, block: *mut c_void) {
        // SAFETY: a block the allocator returned that nobody uses any more (the trait's
        // contract).
        unsafe { free(block) }
    }
}
