//! The loaded modules, as the unwinder and `print_trace` see them.
//!
//! A `ModuleSet` is built from `dl_iterate_phdr`: each module's executable range, load bias,
//! path, and its `.eh_frame_hdr`/`.eh_frame` as they sit in memory (no copy, no file access).
//! Sets are immutable once published and never freed, so readers — every stack capture, and
//! `print_trace` while gdb holds the process — use the current one without a lock. A new set
//! is built when a module appears (the unwinder meets an address outside every known module
//! and `dl_iterate_phdr`'s add/remove counters have moved) or disappears (`dlclose`, hooked).
//! Each rebuild leaks the previous set, a few KB: programs dlopen rarely.
//!
//! A set allocates through the global allocator (in the preload, the tracer's arena): the
//! framehop unwinder it holds takes no allocator parameter, so its parts could not be
//! placed elsewhere anyway. Sets are built rarely and outside `print_trace`.

use crate::sync::SpinLock;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};

/// A loaded module.
pub struct ModuleInfo {
    /// File path as the dynamic loader knows it; the main program is `/proc/self/exe` resolved.
    pub path: Vec<u8>,
    /// The name of the file `path` leads to, after symbolic links (`libsqlite3.so.0.8.6` for
    /// the loader's `libsqlite3.so.0`): a frame without a name is `name+0xoffset`, as the
    /// readers, which know only the mapped files, spell it too.
    pub name: Vec<u8>,
    /// Load bias: actual address = address in the file + bias.
    pub bias: u64,
    /// Executable range in memory.
    pub start: u64,
    pub end: u64,
    /// The module's `.eh_frame_hdr` and `.eh_frame` where they are mapped (empty slices when it
    /// has none). The unwinder reads its CFI rules here, in place: their addresses are the base
    /// addresses of the pointer encodings in them.
    pub eh_frame_hdr: &'static [u8],
    pub eh_frame: &'static [u8],
}

/// An immutable snapshot of the loaded modules.
pub struct ModuleSet {
    generation: u64,
    adds: u64,
    subs: u64,
    /// The CFI unwinder over these modules.
    pub unwinder: UnwinderX86_64<&'static [u8]>,
    /// Sorted by `start`.
    pub modules: Vec<ModuleInfo>,
    /// Executable range of mem-trace itself, whose frames a capture skips.
    own: Range<u64>,
}

impl ModuleSet {
    /// The module whose executable range holds `pc`.
    pub fn find(&self, pc: u64) -> Option<&ModuleInfo> {
        let i = self.modules.partition_point(|m| m.start <= pc);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (pc < m.end).then_some(m)
    }

    /// Whether `pc` lies in mem-trace's own code.
    #[inline]
    pub fn is_own(&self, pc: u64) -> bool {
        self.own.contains(&pc)
    }
}

static CURRENT: AtomicPtr<ModuleSet> = AtomicPtr::new(core::ptr::null_mut());
/// Set when the tracer is linked into the program itself (an allocator wrapper): its module
/// is then the program's, whose frames are all kept, and the wrapper says where a walk starts
/// instead (`record::start_here`).
static IN_PROGRAM: AtomicBool = AtomicBool::new(false);

/// Notes that the tracer is linked into the program (see [`IN_PROGRAM`]); before the first
/// capture.
pub fn tracer_in_program() {
    IN_PROGRAM.store(true, Ordering::Relaxed);
}

/// Whether [`tracer_in_program`] was called.
pub(crate) fn tracer_in_program_set() -> bool {
    IN_PROGRAM.load(Ordering::Relaxed)
}

/// Bumped when a module is known to be gone (`dlclose`); a set of an older generation is
/// rebuilt before use.
static GENERATION: AtomicU64 = AtomicU64::new(1);
static BUILD: SpinLock<()> = SpinLock::new(());

/// The current module set, building it first if needed. Returns `None` only if building
/// failed (out of memory).
#[inline]
pub(crate) fn current() -> Option<&'static ModuleSet> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: published sets are never freed.
    if let Some(set) = unsafe { p.as_ref() } {
        if set.generation == GENERATION.load(Ordering::Relaxed) {
            return Some(set);
        }
    }
    rebuild()
}

/// Takes (`true`) or releases (`false`) the build lock around `fork`.
pub(crate) fn fork_lock(lock: bool) {
    if lock {
        BUILD.raw().lock();
    } else {
        BUILD.raw().unlock();
    }
}

/// The current set without building anything (for `print_trace`, which must not wait).
pub fn snapshot() -> Option<&'static ModuleSet> {
    // SAFETY: published sets are never freed.
    unsafe { CURRENT.load(Ordering::Acquire).as_ref() }
}

/// Called after `dlclose`: the next capture rebuilds the set.
pub fn invalidate() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Called when the unwinder met an unknown address: rebuilds if modules were added or removed
/// since `seen` was built. Returns the new set if there is one.
pub(crate) fn refresh_if_changed(seen: &ModuleSet) -> Option<&'static ModuleSet> {
    let (adds, subs) = counters();
    if adds == seen.adds && subs == seen.subs {
        return None;
    }
    rebuild()
}

#[cold]
#[inline(never)]
fn rebuild() -> Option<&'static ModuleSet> {
    let _build = BUILD.lock();
    let generation = GENERATION.load(Ordering::Relaxed);
    // SAFETY: published sets are never freed.
    if let Some(set) = unsafe { CURRENT.load(Ordering::Acquire).as_ref() } {
        let (adds, subs) = counters();
        if set.generation == generation && set.adds == adds && set.subs == subs {
            return Some(set);
        }
    }
    let set = Box::new(build(generation));
    let p = Box::into_raw(set);
    CURRENT.store(p, Ordering::Release);
    // SAFETY: just published, never freed.
    Some(unsafe { &*p })
}

fn counters() -> (u64, u64) {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the `(u64, u64)` below; `info` is valid during the callback.
        unsafe {
            let out = &mut *(data as *mut (u64, u64));
            *out = ((*info).dlpi_adds, (*info).dlpi_subs);
        }
        1 // the counters are the same in every entry: stop after the first
    }
    let mut out = (0u64, 0u64);
    // SAFETY: the callback only writes `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut out as *mut (u64, u64)).cast()) };
    out
}

struct Raw {
    name: Vec<u8>,
    bias: u64,
    phdrs: Vec<libc::Elf64_Phdr>,
}

/// A set built afresh and not published (tests of what happens when the set changes).
#[cfg(test)]
pub(crate) fn build_for_tests() -> ModuleSet {
    build(0)
}

fn build(generation: u64) -> ModuleSet {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the Vec below; `info` and what it points to are valid during the
        // callback (the loader holds its lock).
        unsafe {
            let out = &mut *(data as *mut (Vec<Raw>, u64, u64));
            let info = &*info;
            out.1 = info.dlpi_adds;
            out.2 = info.dlpi_subs;
            let name = if info.dlpi_name.is_null() {
                Vec::new()
            } else {
                core::ffi::CStr::from_ptr(info.dlpi_name)
                    .to_bytes()
                    .to_vec()
            };
            let phdrs =
                core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize).to_vec();
            out.0.push(Raw {
                name,
                bias: info.dlpi_addr,
                phdrs,
            });
        }
        0
    }
    let mut raw: (Vec<Raw>, u64, u64) = (Vec::new(), 0, 0);
    // SAFETY: the callback only touches `raw`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut raw as *mut (Vec<Raw>, u64, u64)).cast()) };

    let own_pc = build as fn(u64) -> ModuleSet as usize as u64;
    let mut unwinder = UnwinderX86_64::new();
    let mut modules = Vec::new();
    let mut own = 0..0;
    for (i, r) in raw.0.iter().enumerate() {
        let Some(exec) = exec_range(r) else { continue };
        if exec.contains(&own_pc) && !IN_PROGRAM.load(Ordering::Relaxed) {
            own = exec.clone();
        }
        let path = if i == 0 && r.name.is_empty() {
            self_exe()
        } else {
            r.name.clone()
        };
        let sections = cfi_sections(r);
        if let Some((hdr, eh_frame)) = sections {
            unwinder.add_module(unwind_module(r, exec.clone(), &path, hdr, eh_frame));
        }
        let (eh_frame_hdr, eh_frame) = sections.unwrap_or((&[], &[]));
        let name = file_name(&path);
        modules.push(ModuleInfo {
            name,
            path,
            bias: r.bias,
            start: exec.start,
            end: exec.end,
            eh_frame_hdr,
            eh_frame,
        });
    }
    modules.sort_by_key(|m| m.start);
    ModuleSet {
        generation,
        adds: raw.1,
        subs: raw.2,
        unwinder,
        modules,
        own,
    }
}

fn exec_range(r: &Raw) -> Option<Range<u64>> {
    let mut lo = u64::MAX;
    let mut hi = 0;
    for p in &r.phdrs {
        if p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0 {
            lo = lo.min(r.bias + p.p_vaddr);
            hi = hi.max(r.bias + p.p_vaddr + p.p_memsz);
        }
    }
    (lo < hi).then_some(lo..hi)
}

fn self_exe() -> Vec<u8> {
    let mut buf = [0u8; 4096];
    // SAFETY: readlink writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return b"/proc/self/exe".to_vec();
    }
    buf[..n as usize].to_vec()
}

/// The last component of the file `path` names once symbolic links are followed (a few,
/// against loops); `path`'s own last component when it is no link or cannot be read.
fn file_name(path: &[u8]) -> Vec<u8> {
    let base = |p: &[u8]| p.rsplit(|&c| c == b'/').next().unwrap_or(p).to_vec();
    let mut current = path.to_vec();
    for _ in 0..8 {
        let mut c_path = current.clone();
        c_path.push(0);
        let mut buf = [0u8; 4096];
        // SAFETY: `c_path` is NUL-terminated; readlink writes at most `buf.len()` bytes.
        let n =
            unsafe { libc::readlink(c_path.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let target = &buf[..n as usize];
        current = match (target.first(), current.iter().rposition(|&c| c == b'/')) {
            (Some(b'/'), _) | (_, None) => target.to_vec(),
            (_, Some(slash)) => [&current[..=slash], target].concat(),
        };
    }
    base(&current)
}

/// A module's in-memory `.eh_frame_hdr` and `.eh_frame`, found from `PT_GNU_EH_FRAME`.
fn cfi_sections(r: &Raw) -> Option<(&'static [u8], &'static [u8])> {
    let hdr = r.phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME)?;
    let hdr_avma = r.bias + hdr.p_vaddr;
    // SAFETY: PT_GNU_EH_FRAME lies inside a loaded segment of a module that is loaded now.
    let hdr_data: &'static [u8] =
        unsafe { core::slice::from_raw_parts(hdr_avma as *const u8, hdr.p_memsz as usize) };
    let eh_frame_avma = eh_frame_address(hdr_data, hdr_avma)?;
    // `.eh_frame` has no program header of its own: it runs at most to the end of the loaded
    // segment holding it, and the unwinders only read the entries the header's table names.
    let seg = r.phdrs.iter().find(|p| {
        p.p_type == libc::PT_LOAD
            && (r.bias + p.p_vaddr..r.bias + p.p_vaddr + p.p_memsz).contains(&eh_frame_avma)
    })?;
    let seg_end = r.bias + seg.p_vaddr + seg.p_memsz;
    // SAFETY: from the `.eh_frame` start to its segment's end is mapped while the module is.
    let eh_frame: &'static [u8] = unsafe {
        core::slice::from_raw_parts(
            eh_frame_avma as *const u8,
            (seg_end - eh_frame_avma) as usize,
        )
    };
    Some((hdr_data, eh_frame))
}

/// Builds framehop's view of one module from its in-memory CFI sections.
fn unwind_module(
    r: &Raw,
    exec: Range<u64>,
    path: &[u8],
    hdr: &'static [u8],
    eh_frame: &'static [u8],
) -> Module<&'static [u8]> {
    let svma = |s: &[u8]| {
        let start = s.as_ptr() as u64 - r.bias;
        start..start + s.len() as u64
    };
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        eh_frame_hdr_svma: Some(svma(hdr)),
        eh_frame_hdr: Some(hdr),
        eh_frame_svma: Some(svma(eh_frame)),
        eh_frame: Some(eh_frame),
        ..Default::default()
    };
    let name = String::from_utf8_lossy(path).into_owned();
    Module::new(name, exec, r.bias, info)
}

/// Decodes `eh_frame_ptr` from an `.eh_frame_hdr` (LSB "Exception Frame Header").
fn eh_frame_address(hdr: &[u8], hdr_avma: u64) -> Option<u64> {
    if hdr.len() < 8 || hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let value: i64 = match enc & 0x0f {
        0x00 | 0x04 => i64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        0x03 => i64::from(u32::from_le_bytes(field.get(..4)?.try_into().ok()?)),
        0x0b => i64::from(i32::from_le_bytes(field.get(..4)?.try_into().ok()?)),
        0x0c => i64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => hdr_avma + 4, // pc-relative: relative to the field itself
        0x30 => hdr_avma,     // data-relative: relative to the header
        _ => return None,
    };
    Some(base.wrapping_add(value as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_test_and_libc() {
        let set = current().expect("module set");
        let here = finds_this_test_and_libc as fn() as usize as u64;
        let m = set.find(here).expect("test binary is a module");
        assert!(!m.path.is_empty());
        let malloc =
            libc::malloc as unsafe extern "C" fn(usize) -> *mut libc::c_void as usize as u64;
        let libc_m = set.find(malloc).expect("libc is a module");
        assert!(String::from_utf8_lossy(&libc_m.path).contains("libc"));
        assert!(set.find(0x10).is_none());
    }

    #[test]
    fn a_module_is_named_by_the_file_its_links_lead_to() {
        let dir = std::env::temp_dir().join(format!("mem-trace-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::fs::write(dir.join("real/libx.so.1.2.3"), b"").unwrap();
        // A relative link to an absolute one, as sonames and merged-/usr links are made.
        std::os::unix::fs::symlink(dir.join("real/libx.so.1.2.3"), dir.join("real/libx.so.1"))
            .unwrap();
        std::os::unix::fs::symlink("real/libx.so.1", dir.join("libx.so")).unwrap();
        let path = dir.join("libx.so");
        assert_eq!(
            file_name(path.as_os_str().as_encoded_bytes()),
            b"libx.so.1.2.3"
        );
        assert_eq!(file_name(b"/nonexistent/libz.so.1"), b"libz.so.1");
        std::fs::remove_dir_all(&dir).unwrap();
        let set = current().expect("module set");
        let malloc =
            libc::malloc as unsafe extern "C" fn(usize) -> *mut libc::c_void as usize as u64;
        let libc_m = set.find(malloc).expect("libc is a module");
        assert_eq!(libc_m.name, b"libc.so.6");
    }

    #[test]
    fn decodes_pcrel_sdata4() {
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&(-0x100i32).to_le_bytes());
        assert_eq!(
            eh_frame_address(&hdr, 0x10_0000),
            Some(0x10_0000 + 4 - 0x100)
        );
        assert_eq!(eh_frame_address(&[2, 0, 0, 0, 0, 0, 0, 0], 0), None);
    }
}
