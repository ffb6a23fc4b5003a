//! Redirecting the malloc family of a running process to the hooks by rewriting GOT entries,
//! and putting them back.
//!
//! A preloaded library wins symbol lookup by coming first; a library loaded later does not,
//! since every module has bound `malloc` to glibc's already. What they call through is their
//! GOT: `R_X86_64_JUMP_SLOT` entries for calls through the PLT, `R_X86_64_GLOB_DAT` for
//! calls through the GOT (`-fno-plt`, Rust's full-RELRO binaries) and address-taking. Every
//! module but ld.so (it allocates through its own `__rtld_malloc`, and overwriting its `free`
//! crashed heaptrack's users), the vDSO and this library gets those entries naming a hooked
//! function pointed at the hook. glibc's own libc.so.6 is patched too: it reaches `malloc`
//! and `free` through GLOB_DAT entries, `realloc` and `calloc` through JUMP_SLOTs, so that
//! `strdup`, `fopen` and the rest allocate through the hooks, as under the preload.
//!
//! Entries inside `PT_GNU_RELRO` (full RELRO: all of them) are made writable for the store
//! and read-only again after. Each store is one aligned 8-byte atomic write, so a thread
//! calling through the entry meanwhile sees the old function or the new one. Every entry
//! patched is kept with its old value, for [`restore`].

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_GLOB_DAT: u64 = 6;
const R_X86_64_JUMP_SLOT: u64 = 7;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// A GOT entry pointed at a hook: where, what it held, what it holds now.
#[derive(Clone, Copy, Debug)]
struct Patch {
    at: usize,
    old: u64,
    new: u64,
}

/// Every entry patched and not yet restored.
static PATCHED: Mutex<Vec<Patch>> = Mutex::new(Vec::new());

/// What [`patch_all`] hands each module's walk.
struct Walk<'a> {
    hooks: &'a [(&'static [u8], usize)],
    /// Any address inside this library, to skip it.
    own: usize,
    patched: Vec<Patch>,
}

/// The hooks of the attach, kept by [`patch_all`] for [`patch_new_modules`].
static HOOKS: Mutex<Vec<(&'static [u8], usize)>> = Mutex::new(Vec::new());

/// Points every GOT entry of every loaded module (but ld.so, the vDSO and this library) that
/// names one of `hooks` at the hook, and keeps `hooks` for the modules loaded later. Returns
/// the number of entries patched.
pub(crate) fn patch_all(hooks: &[(&'static [u8], usize)]) -> usize {
    if let Ok(mut kept) = HOOKS.lock() {
        kept.clear();
        kept.extend_from_slice(hooks);
    }
    patch(hooks)
}

/// Points the GOT entries of modules loaded since the attach at the hooks the attach gave
/// [`patch_all`] (entries already patched are left as they are). Called after a `dlopen` in
/// an attached process. A `dlopen` that sees the process attached before the attach kept its
/// hooks loaded its module before the attach's own walk, which patches it.
pub(crate) fn patch_new_modules() {
    let hooks = HOOKS.lock().map(|h| h.clone()).unwrap_or_default();
    patch(&hooks);
}

/// [`patch_all`]'s walk.
fn patch(hooks: &[(&'static [u8], usize)]) -> usize {
    let mut walk = Walk {
        hooks,
        own: patch_all as *const () as usize,
        patched: Vec::new(),
    };
    // SAFETY: the callback gets `walk` back as `data` and only reads the module's headers.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut walk).cast()) };
    let n = walk.patched.len();
    if let Ok(mut all) = PATCHED.lock() {
        all.extend(walk.patched);
    }
    n
}

/// Puts back every patched entry that still holds our hook (one the loader or the program
/// rewrote since is theirs now, and one whose module was unloaded is gone). Returns the number
/// restored.
pub(crate) fn restore() -> usize {
    let Ok(mut all) = PATCHED.lock() else {
        return 0;
    };
    let maps = Maps::read();
    let mut n = 0;
    for p in all.drain(..) {
        let Some(writable) = maps.writable(p.at) else {
            continue;
        };
        // SAFETY: a mapped, aligned GOT entry of a module loaded when it was patched (had it
        // been unloaded, whatever is mapped there now would not hold our hook's address).
        if unsafe { store_if(p.at, p.new, p.old, !writable) } {
            n += 1;
        }
    }
    n
}

unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Walk` `patch_all` passed, alive for the whole iteration.
    let walk = unsafe { &mut *data.cast::<Walk>() };
    // SAFETY: glibc hands a valid entry for the duration of the call.
    let info = unsafe { &*info };
    // SAFETY: the program headers of a loaded module.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let base = info.dlpi_addr as usize;
    if skipped(info, phdrs, walk.own) {
        return 0;
    }
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return 0;
    };
    // The pages ld.so made read-only: it rounds both ends down, so a partial last page
    // stays writable (and must stay so).
    let relro = phdrs.iter().find(|p| p.p_type == PT_GNU_RELRO).map(|p| {
        let lo = page_of(base + p.p_vaddr as usize).0;
        let hi = page_of(base + (p.p_vaddr + p.p_memsz) as usize).0;
        (lo, hi)
    });
    // SAFETY: the module's dynamic section, mapped while it is loaded.
    let table =
        unsafe { DynamicTable::read((base + dynamic.p_vaddr as usize) as *const Dyn, base) };
    let Some(table) = table else {
        return 0;
    };
    for (rel, len) in [
        (table.jmprel, table.jmprel_len),
        (table.rela, table.rela_len),
    ] {
        if rel == 0 {
            continue;
        }
        // SAFETY: the module's relocation table, as its dynamic section describes it.
        let rels = unsafe {
            core::slice::from_raw_parts(rel as *const Rela, len / core::mem::size_of::<Rela>())
        };
        for r in rels {
            let kind = r.info & 0xffff_ffff;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            // SAFETY: the relocation's symbol, in the module's own tables.
            let name = unsafe { table.symbol_name(r.info >> 32) };
            let Some(&(_, hook)) = walk.hooks.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let at = base + r.offset as usize;
            // SAFETY: a GOT entry of this module (its relocation's target).
            let old = unsafe { AtomicU64::from_ptr(at as *mut u64) }.load(Ordering::Acquire);
            if old == hook as u64 {
                continue;
            }
            let protected = relro.is_some_and(|(lo, hi)| (lo..hi).contains(&at));
            // SAFETY: as above; made writable for the store if RELRO made it read-only.
            if unsafe { store(at, hook as u64, protected) } {
                walk.patched.push(Patch {
                    at,
                    old,
                    new: hook as u64,
                });
            }
        }
    }
    0
}

/// Whether a module is one the walk leaves alone: ld.so, the vDSO, this library, or one with
/// no loadable segment.
fn skipped(info: &libc::dl_phdr_info, phdrs: &[libc::Elf64_Phdr], own: usize) -> bool {
    let base = info.dlpi_addr as usize;
    // SAFETY: getauxval has no preconditions.
    let (interp, vdso) = unsafe {
        (
            libc::getauxval(libc::AT_BASE) as usize,
            libc::getauxval(libc::AT_SYSINFO_EHDR) as usize,
        )
    };
    let name = if info.dlpi_name.is_null() {
        &b""[..]
    } else {
        // SAFETY: a NUL-terminated name from glibc.
        unsafe { CStr::from_ptr(info.dlpi_name as *const c_char) }.to_bytes()
    };
    let is_interp = base == interp || contains(name, b"/ld-linux");
    let is_vdso = (vdso != 0 && base == vdso) || name.starts_with(b"linux-vdso");
    let is_own = phdrs.iter().any(|p| {
        p.p_type == PT_LOAD
            && (base + p.p_vaddr as usize..base + (p.p_vaddr + p.p_memsz) as usize).contains(&own)
    });
    let loaded = phdrs.iter().any(|p| p.p_type == PT_LOAD);
    is_interp || is_vdso || is_own || !loaded
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The parts of a module's dynamic section the walk needs, as addresses.
struct DynamicTable {
    strtab: usize,
    symtab: usize,
    jmprel: usize,
    jmprel_len: usize,
    rela: usize,
    rela_len: usize,
}

impl DynamicTable {
    /// # Safety
    /// `d` is a loaded module's dynamic section, `base` its load bias.
    unsafe fn read(mut d: *const Dyn, base: usize) -> Option<Self> {
        let mut t = DynamicTable {
            strtab: 0,
            symtab: 0,
            jmprel: 0,
            jmprel_len: 0,
            rela: 0,
            rela_len: 0,
        };
        // ld.so rewrites the pointers in a writable dynamic section to addresses; a read-only
        // one keeps offsets from the load bias.
        let at = |v: u64| {
            let v = v as usize;
            if v < base {
                base + v
            } else {
                v
            }
        };
        loop {
            // SAFETY: within the section, which ends with DT_NULL (caller).
            let e = unsafe { &*d };
            match e.tag {
                DT_NULL => break,
                DT_STRTAB => t.strtab = at(e.val),
                DT_SYMTAB => t.symtab = at(e.val),
                DT_JMPREL => t.jmprel = at(e.val),
                DT_PLTRELSZ => t.jmprel_len = e.val as usize,
                DT_RELA => t.rela = at(e.val),
                DT_RELASZ => t.rela_len = e.val as usize,
                _ => {}
            }
            // SAFETY: not past DT_NULL yet.
            d = unsafe { d.add(1) };
        }
        (t.strtab != 0 && t.symtab != 0).then_some(t)
    }

    /// The name of symbol `index`.
    ///
    /// # Safety
    /// `index` is a symbol index from one of the module's relocations.
    unsafe fn symbol_name(&self, index: u64) -> &'static [u8] {
        // SAFETY: forwarded contract: the symbol and its name are in the module's tables.
        unsafe {
            let sym = &*(self.symtab as *const Sym).add(index as usize);
            CStr::from_ptr((self.strtab + sym.name as usize) as *const c_char).to_bytes()
        }
    }
}

/// The page-aligned range holding the 8 bytes at `at`.
fn page_of(at: usize) -> (usize, usize) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    (at & !(page - 1), page)
}

/// Stores `value` at `at`, making its page writable first and read-only again after if
/// `protected`. False if the page could not be made writable.
///
/// # Safety
/// `at` is an aligned GOT entry of a loaded module.
unsafe fn store(at: usize, value: u64, protected: bool) -> bool {
    let (page, len) = page_of(at);
    if protected {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a page of the module's RELRO segment, made writable for the store only.
        if unsafe { libc::mprotect(page as *mut c_void, len, rw) } != 0 {
            return false;
        }
    }
    // SAFETY: forwarded contract; the page is writable now.
    unsafe { AtomicU64::from_ptr(at as *mut u64) }.store(value, Ordering::Release);
    if protected {
        // SAFETY: as above; RELRO pages are read-only once the loader is done with them.
        unsafe { libc::mprotect(page as *mut c_void, len, libc::PROT_READ) };
    }
    true
}

/// Stores `value` at `at` if it still holds `expected` (its page made writable for the store
/// if `protected`); whether it did.
///
/// # Safety
/// `at` is a mapped, aligned GOT entry of a loaded module.
unsafe fn store_if(at: usize, expected: u64, value: u64, protected: bool) -> bool {
    // SAFETY: forwarded contract.
    let now = unsafe { AtomicU64::from_ptr(at as *mut u64) }.load(Ordering::Acquire);
    // SAFETY: forwarded contract.
    now == expected && unsafe { store(at, value, protected) }
}

/// The process's mappings and whether each is writable, from /proc/self/maps (read once, at
/// detach).
struct Maps(Vec<(usize, usize, bool)>);

impl Maps {
    fn read() -> Self {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        Maps(text.lines().filter_map(parse_line).collect())
    }

    /// Whether `at` is writable; `None` if it is not mapped.
    fn writable(&self, at: usize) -> Option<bool> {
        self.0
            .iter()
            .find(|&&(lo, hi, _)| (lo..hi).contains(&at))
            .map(|&(_, _, w)| w)
    }
}

/// `(start, end, writable)` of one line of /proc/self/maps.
fn parse_line(line: &str) -> Option<(usize, usize, bool)> {
    let mut f = line.split_whitespace();
    let (lo, hi) = f.next()?.split_once('-')?;
    let perms = f.next()?;
    Some((
        usize::from_str_radix(lo, 16).ok()?,
        usize::from_str_radix(hi, 16).ok()?,
        perms.as_bytes().get(1) == Some(&b'w'),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_holds_the_entry() {
        let (page, len) = page_of(0x1234_5678);
        assert!(page <= 0x1234_5678 && 0x1234_5678 + 8 <= page + len);
    }

    #[test]
    fn a_writable_page_is_seen_writable() {
        let x = Box::new(0u64);
        let maps = Maps::read();
        assert_eq!(maps.writable(&*x as *const u64 as usize), Some(true));
        assert_eq!(maps.writable(page_of as *const () as usize), Some(false));
        assert_eq!(maps.writable(8), None);
    }
}
