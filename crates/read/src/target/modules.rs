//! The ELF modules among a target's mappings, their load bias, the files to read them from,
//! and `MEM_TRACE_HEADER`.
//!
//! A module is found from its mappings alone: the dynamic linker maps a file's `PT_LOAD`
//! segments in order from file offset 0, so a run of mappings of one file starting at offset
//! 0 whose first bytes (read from the target's memory) are an x86_64 ELF header is a loaded
//! module. Its program headers, read from memory too, give the bias. A file mapped whole by
//! some other code (mem-trace's own symbolizer maps ELF files read-only) is a one-mapping run:
//! of several runs of one file the one with the most mappings is the module, since a loaded
//! ELF file with code and data has at least two.
//!
//! The loaded image carries its GNU build id in its first page (the kernel and gdb both dump
//! that page), so the file to read symbols from can be checked against what ran.

use super::errors::TargetError;
use super::types::{Mapping, Module};
use crate::memory::{read_plain, Memory};
use crate::symbolize::mapping::Mapping as FileMap;
use crate::symbolize::SymError;
use object::elf::{FileHeader64, ProgramHeader64, EM_X86_64, PT_LOAD, PT_NOTE};
use object::read::elf::{FileHeader as _, NoteIterator, ProgramHeader as _};
use object::{LittleEndian as LE, Object as _, ObjectSymbol as _};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// The symbol mem-trace's tables hang off (docs/LAYOUT.md "Finding the header").
pub(super) const HEADER_SYMBOL: &str = "MEM_TRACE_HEADER";
/// More program headers than any linker writes for a loadable file: a bound on a corrupt
/// header's read.
const MAX_PHDRS: u16 = 256;
/// The most note bytes read from a loaded image for its build id.
const MAX_NOTES: u64 = 64 << 10;
const PAGE: u64 = 4096;

/// A module found among the mappings, before a file is chosen for it.
pub(super) struct Loaded {
    /// The module; `file` still `None`.
    pub(super) module: Module,
    /// The GNU build id in the loaded image, when the memory holds it.
    pub(super) build_id: Option<Vec<u8>>,
    /// The first mapping of the run (`/proc/PID/map_files/` names a file by it).
    pub(super) first: (u64, u64),
    /// Its `PT_LOAD` segments: (file offset, file size, flags).
    segments: Vec<(u64, u64, u32)>,
}

impl Loaded {
    /// Permissions (read, write, exec) of the segment that maps file offset `offset`.
    pub(super) fn permissions_at(&self, offset: u64) -> Option<(bool, bool, bool)> {
        let &(_, _, flags) = self
            .segments
            .iter()
            .find(|&&(o, size, _)| o & !(PAGE - 1) <= offset && offset < o + size)?;
        Some((flags & 4 != 0, flags & 2 != 0, flags & 1 != 0))
    }
}

/// The ELF modules among `mappings` (by start address). `image` reads the loaded image (for
/// a core, with what the core lacks read from the mapped files); `dumped` reads only what the
/// target itself holds, for the build id.
pub(super) fn find(image: &dyn Memory, dumped: &dyn Memory, mappings: &[Mapping]) -> Vec<Loaded> {
    let mut runs: BTreeMap<&str, Vec<Vec<&Mapping>>> = BTreeMap::new();
    for m in mappings.iter().filter(|m| m.name.starts_with('/')) {
        let file_runs = runs.entry(&m.name).or_default();
        if m.offset == 0 {
            file_runs.push(vec![m]);
        } else if let Some(run) = file_runs.last_mut() {
            run.push(m);
        }
    }
    let mut found: Vec<Loaded> = runs
        .into_values()
        .filter_map(|file_runs| {
            // The first of the longest runs; none for a file mapped only past its start (a
            // memfd pool's second half), which is no module.
            let run = file_runs.iter().rev().max_by_key(|run| run.len())?;
            describe(image, dumped, run)
        })
        .collect();
    found.sort_by_key(|l| l.module.start);
    found
}

/// The module whose mappings are `run`, when its first bytes are an x86_64 ELF header.
fn describe(image: &dyn Memory, dumped: &dyn Memory, run: &[&Mapping]) -> Option<Loaded> {
    let start = run[0].start;
    let mut ehdr = [0u8; core::mem::size_of::<FileHeader64<LE>>()];
    image.read(start, &mut ehdr).ok()?;
    let header = FileHeader64::<LE>::parse(&ehdr[..]).ok()?;
    if !header.is_class_64()
        || !header.is_little_endian()
        || header.e_machine(LE) != EM_X86_64
        || usize::from(header.e_phentsize(LE)) != core::mem::size_of::<ProgramHeader64<LE>>()
        || header.e_phnum(LE) > MAX_PHDRS
    {
        return None;
    }
    let phnum = usize::from(header.e_phnum(LE));
    let mut bytes = vec![0u8; phnum * core::mem::size_of::<ProgramHeader64<LE>>()];
    image
        .read(start.checked_add(header.e_phoff(LE))?, &mut bytes)
        .ok()?;
    let (phdrs, _) = object::pod::slice_from_bytes::<ProgramHeader64<LE>>(&bytes, phnum).ok()?;
    let loads: Vec<&ProgramHeader64<LE>> =
        phdrs.iter().filter(|p| p.p_type(LE) == PT_LOAD).collect();
    // The segment mapped from file offset 0 sits at the run's first address.
    let first = loads.iter().find(|p| p.p_offset(LE) < PAGE)?;
    let bias = start.wrapping_sub(first.p_vaddr(LE) & !(PAGE - 1));
    let image_end = loads
        .iter()
        .filter_map(|p| p.p_vaddr(LE).checked_add(p.p_memsz(LE)))
        .max()?
        .wrapping_add(bias);
    let run_end = run.last().expect("a run has a mapping").end;
    // .bss past the file's last page is an anonymous mapping of its own: still the module's.
    let end = if image_end > run_end && image_end - run_end < 1 << 32 {
        image_end.next_multiple_of(PAGE)
    } else {
        run_end
    };
    let build_id = phdrs
        .iter()
        .filter(|p| p.p_type(LE) == PT_NOTE)
        .find_map(|p| loaded_build_id(dumped, p, bias));
    Some(Loaded {
        module: Module {
            path: PathBuf::from(&run[0].name),
            start,
            end,
            bias,
            file: None,
        },
        build_id,
        first: (start, run[0].end),
        segments: loads
            .iter()
            .map(|p| (p.p_offset(LE), p.p_filesz(LE), p.p_flags(LE).0))
            .collect(),
    })
}

/// The GNU build id in a loaded `PT_NOTE` segment, when `memory` holds it.
fn loaded_build_id(memory: &dyn Memory, note: &ProgramHeader64<LE>, bias: u64) -> Option<Vec<u8>> {
    let size = note.p_filesz(LE).min(MAX_NOTES) as usize;
    let mut bytes = vec![0u8; size];
    memory
        .read(note.p_vaddr(LE).wrapping_add(bias), &mut bytes)
        .ok()?;
    gnu_build_id(&bytes, note.p_align(LE))
}

/// The `NT_GNU_BUILD_ID` note among notes `bytes`.
pub(super) fn gnu_build_id(bytes: &[u8], align: u64) -> Option<Vec<u8>> {
    let mut notes = NoteIterator::<FileHeader64<LE>>::new(LE, align, bytes).ok()?;
    while let Ok(Some(note)) = notes.next() {
        if note.name() == object::elf::ELF_NOTE_GNU
            && note.n_type(LE) == object::elf::NT_GNU_BUILD_ID
        {
            return Some(note.desc().to_vec());
        }
    }
    None
}

/// What the file on disk says.
struct OnDisk {
    build_id: Option<Vec<u8>>,
    /// The stated value of `MEM_TRACE_HEADER` when the file defines it.
    header: Option<u64>,
}

fn read_file(path: &Path) -> Result<OnDisk, std::io::Error> {
    let map = FileMap::open(path.as_os_str().as_bytes()).map_err(|e| match e {
        SymError::Open(errno) | SymError::Map(errno) => std::io::Error::from_raw_os_error(errno),
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
    })?;
    let elf = object::read::elf::ElfFile64::<LE>::parse(map.as_slice())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    // The library exports it; an executable linking the `Traced` wrapper defines it without
    // exporting it (nothing links against an executable), so its symbol table is read too.
    let header = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| !s.is_undefined() && s.name_bytes() == Ok(HEADER_SYMBOL.as_bytes()))
        .map(|s| s.address());
    Ok(OnDisk {
        build_id: elf.build_id().ok().flatten().map(<[u8]>::to_vec),
        header,
    })
}

/// Hex of a build id, as `file` and `readelf -n` print it.
pub(super) fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// How the file for a module is chosen.
pub(super) enum Policy {
    /// A running process: a candidate whose build id differs is passed over (the next one,
    /// `/proc/PID/map_files/`, reads the file as loaded); a module left without a file is
    /// symbolized as raw addresses.
    Lenient,
    /// A core: a file whose build id differs is an error.
    Strict,
}

/// The modules with their files chosen, and the header's address.
pub(super) struct Resolved {
    pub(super) modules: Vec<Module>,
    /// Every `MEM_TRACE_HEADER` found, the library's first.
    pub(super) headers: Vec<u64>,
    /// Why a module named like the library has no file, to say instead of "not loaded".
    pub(super) problem: Option<TargetError>,
}

/// Chooses each module's file among `candidates(loaded)` (first that opens and matches the
/// loaded build id) and finds `MEM_TRACE_HEADER`: in the modules whose file name contains
/// `mem_trace` first, then the rest (an executable may define it too).
pub(super) fn resolve(
    found: Vec<Loaded>,
    candidates: impl Fn(&Loaded) -> Vec<PathBuf>,
    policy: Policy,
) -> Result<Resolved, TargetError> {
    let mut modules = Vec::with_capacity(found.len());
    let mut headers = Vec::new();
    let mut problem = None;
    for loaded in &found {
        let mut module = loaded.module.clone();
        let candidates = candidates(loaded);
        let mut changed = module
            .path
            .to_string_lossy()
            .ends_with(super::maps::DELETED);
        // The first candidate's failure says most: the file the target names.
        let mut first_error = None;
        for path in &candidates {
            match read_file(path) {
                Ok(disk) => match (&loaded.build_id, &disk.build_id) {
                    (Some(mem), Some(file)) if mem != file => {
                        let e = TargetError::OtherBuild {
                            path: path.clone(),
                            why: format!(
                                "build id {} when loaded, {} on disk",
                                hex(mem),
                                hex(file)
                            ),
                        };
                        if let Policy::Strict = policy {
                            return Err(e);
                        }
                        changed = true;
                        first_error.get_or_insert(e);
                    }
                    _ => {
                        if let Some(value) = disk.header {
                            headers.push((is_library(&module), value.wrapping_add(module.bias)));
                        }
                        module.file = Some(path.clone());
                        break;
                    }
                },
                Err(error) => {
                    first_error.get_or_insert(TargetError::io(path, error));
                }
            }
        }
        if module.file.is_none() {
            if is_library(&module) && problem.is_none() {
                problem = first_error;
            }
            // A file that cannot be opened is still named, so that symbolizing says why;
            // one known to differ from what was loaded is not read at all.
            if !changed {
                module.file = candidates.into_iter().next();
            }
        }
        modules.push(module);
    }
    // Stable: among equals, the lowest address.
    headers.sort_by_key(|&(library, _)| !library);
    Ok(Resolved {
        modules,
        headers: headers.into_iter().map(|(_, addr)| addr).collect(),
        problem,
    })
}

fn is_library(module: &Module) -> bool {
    module
        .path
        .file_name()
        .is_some_and(|n| n.as_bytes().windows(9).any(|w| w == b"mem_trace"))
}

impl Resolved {
    /// The header's address, or why there is none.
    ///
    /// A process can hold two: a Rust program that links the `Traced` allocator wrapper
    /// defines one in its executable, and run under the preload it has the library's too. The
    /// wrapper then hands its records to the preload and leaves its own header uninitialised,
    /// so the initialised one (header flag bit 0, read from `mem`) is the one with the tables;
    /// when none is, the first (the library's before an executable's).
    pub(super) fn header(
        &mut self,
        target: &str,
        mem: &(impl Memory + ?Sized),
    ) -> Result<u64, TargetError> {
        let initialised = |&addr: &u64| {
            let at = addr + core::mem::offset_of!(mem_trace_format::Header, flags) as u64;
            read_plain::<u64>(mem, at).is_ok_and(|f| f & mem_trace_format::FLAG_INITIALISED != 0)
        };
        let chosen = match self.headers.iter().find(|a| initialised(a)) {
            Some(&addr) => Some(addr),
            None => self.headers.first().copied(),
        };
        match (chosen, self.problem.take()) {
            (Some(addr), _) => Ok(addr),
            (None, Some(problem)) => Err(problem),
            (None, None) => Err(TargetError::NotLoaded {
                target: target.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Process;
    use std::ffi::CStr;

    /// What the dynamic linker says: (path, bias) of every loaded object with a path.
    fn linker_modules() -> Vec<(String, u64)> {
        unsafe extern "C" fn each(
            info: *mut libc::dl_phdr_info,
            _size: usize,
            data: *mut libc::c_void,
        ) -> libc::c_int {
            // SAFETY: the loader passes a valid entry for the call's duration, and `data` is
            // the vector handed to dl_iterate_phdr below.
            let (info, out) = unsafe { (&*info, &mut *data.cast::<Vec<(String, u64)>>()) };
            if !info.dlpi_name.is_null() {
                // SAFETY: a non-null dlpi_name is a NUL-terminated string.
                let name = unsafe { CStr::from_ptr(info.dlpi_name) };
                out.push((name.to_string_lossy().into_owned(), info.dlpi_addr));
            }
            0
        }
        let mut out: Vec<(String, u64)> = Vec::new();
        // SAFETY: the callback matches the expected signature and only touches `out`.
        unsafe { libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<_>).cast()) };
        out
    }

    #[test]
    fn finds_this_process_modules_with_the_linkers_bias() {
        let maps = super::super::maps::parse(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let me = Process::this();
        let found = find(&me, &me, &maps);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let here = finds_this_process_modules_with_the_linkers_bias as fn() as usize as u64;
        let main = found
            .iter()
            .find(|l| l.module.path == exe)
            .expect("the test executable is a module");
        assert!(main.module.start <= here && here < main.module.end);
        let mut checked = 0;
        for (name, bias) in linker_modules() {
            let canonical = std::fs::canonicalize(&name).unwrap_or_else(|_| name.clone().into());
            let Some(l) = found.iter().find(|l| l.module.path == canonical) else {
                continue;
            };
            assert_eq!(l.module.bias, bias, "{name}");
            // The loaded image's build id is the file's.
            let disk = read_file(&l.module.path).unwrap();
            assert_eq!(l.build_id, disk.build_id, "{name}");
            assert!(l.build_id.is_some(), "{name} has a build id");
            checked += 1;
        }
        assert!(checked >= 2, "libc and the loader at least: {checked}");
        // The main program's bias, from its own phdrs: its code is where the linker put it.
        assert_eq!(
            Some(main.module.bias),
            linker_modules()
                .iter()
                .find(|(n, _)| n.is_empty())
                .map(|m| m.1)
        );
    }

    #[test]
    fn a_whole_file_mapping_is_not_the_module() {
        let maps = super::super::maps::parse(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let me = Process::this();
        let libc = find(&me, &me, &maps)
            .into_iter()
            .find(|l| l.module.path.to_string_lossy().contains("libc.so"))
            .expect("libc");
        // Map libc whole, as mem-trace's symbolizer does, and look again.
        let extra = FileMap::open(libc.module.path.as_os_str().as_bytes()).unwrap();
        let maps = super::super::maps::parse(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let again = find(&me, &me, &maps);
        let same: Vec<&Loaded> = again
            .iter()
            .filter(|l| l.module.path == libc.module.path)
            .collect();
        assert_eq!(same.len(), 1);
        assert_eq!(same[0].module, libc.module);
        assert_ne!(same[0].module.start, extra.as_slice().as_ptr() as u64);
    }

    /// A file mapped only from a nonzero offset (a memfd pool's second half) is no module,
    /// and the modules beside it are still found.
    #[test]
    fn a_file_mapped_only_past_its_start_is_no_module() {
        const POOL: usize = 64 << 10;
        // SAFETY: a new memfd, sized, and its second half mapped shared; both released below.
        let half = unsafe {
            let fd = libc::memfd_create(c"pool".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0 && libc::ftruncate(fd, POOL as i64) == 0);
            let half = libc::mmap(
                core::ptr::null_mut(),
                POOL / 2,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                (POOL / 2) as i64,
            );
            libc::close(fd);
            assert_ne!(half, libc::MAP_FAILED);
            half
        };
        let maps = super::super::maps::parse(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let pool = maps
            .iter()
            .find(|m| m.start == half as u64)
            .expect("the pool's mapping");
        assert!(pool.name.starts_with("/memfd:pool") && pool.offset == (POOL / 2) as u64);
        let me = Process::this();
        let found = find(&me, &me, &maps);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(half, POOL / 2) };
        assert!(found.iter().all(|l| !l.module.path.starts_with("/memfd:")));
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(found.iter().any(|l| l.module.path == exe));
    }

    #[test]
    fn build_ids_come_from_gnu_notes() {
        let mut notes = crate::target::core_notes::tests::note(b"GNU", 1, &[1, 0, 0, 0]);
        notes.extend(crate::target::core_notes::tests::note(
            b"GNU",
            3,
            &[0xab, 0xcd],
        ));
        assert_eq!(gnu_build_id(&notes, 4), Some(vec![0xab, 0xcd]));
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
        assert_eq!(gnu_build_id(&notes[..16], 4), None);
    }
}
