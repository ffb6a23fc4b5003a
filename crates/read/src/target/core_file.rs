//! A core file as a target: its `PT_LOAD` segments as memory, its notes for the mapped files,
//! threads and executable.
//!
//! The file is mapped read-only, never copied: a core can be gigabytes. What a segment does
//! not hold (bytes past its `p_filesz`, or a whole mapping gdb's `gcore` left out: unmodified
//! code and read-only data of mapped files) is read from the file `NT_FILE` names for that
//! address, at its offset; anonymous memory the core lacks is unreadable. Every size and
//! count comes from the file and is checked against the file's length before use. (A core cut
//! shorter while it is being read, by whatever is still writing it, would fault on access past
//! its new end: cores are read once written.)

use super::core_notes::{FileEntry, Notes, AT_EXECFN, AT_PHDR};
use super::errors::TargetError;
use super::modules::{self, Policy};
use super::types::{Mapping, ProcessFacts, Target};
use crate::memory::{extent, Memory, Unreadable};
use crate::symbolize::mapping::Mapping as FileMap;
use crate::symbolize::SymError;
use object::elf::{FileHeader64, ProgramHeader64, EM_X86_64, ET_CORE, PT_LOAD, PT_NOTE};
use object::read::elf::{FileHeader as _, ProgramHeader as _};
use object::LittleEndian as LE;
use std::cell::OnceCell;
use std::fs::File;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// The longest executable name read from the core's memory (`AT_EXECFN`).
const MAX_PATH: usize = 4096;

/// One `PT_LOAD` segment.
#[derive(Clone, Copy, Debug)]
struct Segment {
    vaddr: u64,
    memsz: u64,
    offset: u64,
    filesz: u64,
    flags: u32,
}

/// A mapped file that fills in what the core lacks, opened on first use.
struct Backing {
    path: PathBuf,
    file: OnceCell<Option<File>>,
}

/// A file-backed range of the address space: `NT_FILE` entry `start..end` at `offset`.
struct FileRange {
    start: u64,
    end: u64,
    offset: u64,
    backing: usize,
}

/// The memory of a core file.
pub(super) struct CoreMemory {
    map: FileMap,
    /// By `vaddr`; the kernel writes them in address order, a sort makes sure.
    segments: Vec<Segment>,
    /// By `start`.
    ranges: Vec<FileRange>,
    backings: Vec<Backing>,
    /// Where there is anything to read, merged (for [`Memory::extent_holds`]).
    runs: extent::Runs,
}

/// The same memory without the mapped files: only what the core itself holds.
struct Dumped<'a>(&'a CoreMemory);

impl Memory for CoreMemory {
    fn extent_holds(&self, addr: u64, len: u64) -> Result<(), u64> {
        extent::holds_in(&self.runs, addr, len)
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
        self.read_from(addr, buf, true)
    }
}

impl Memory for Dumped<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
        self.0.read_from(addr, buf, false)
    }
}

impl CoreMemory {
    /// Fills `buf` piece by piece: each piece from the segment that holds it, else (when
    /// `files`) from the mapped file.
    fn read_from(&self, addr: u64, buf: &mut [u8], files: bool) -> Result<(), Unreadable> {
        let fail = Unreadable {
            addr,
            len: buf.len(),
        };
        let core = self.map.as_slice();
        let mut done = 0;
        while done < buf.len() {
            let at = addr.checked_add(done as u64).ok_or(fail)?;
            let want = (buf.len() - done) as u64;
            let i = self.segments.partition_point(|s| s.vaddr <= at);
            let seg = i
                .checked_sub(1)
                .map(|i| self.segments[i])
                .filter(|s| at - s.vaddr < s.memsz);
            // How far the bytes at `at` come from one place.
            let n = match seg {
                Some(s) if at - s.vaddr < s.filesz => {
                    let n = want.min(s.filesz - (at - s.vaddr));
                    let from = (s.offset + (at - s.vaddr)) as usize;
                    buf[done..done + n as usize].copy_from_slice(&core[from..from + n as usize]);
                    n
                }
                _ if files => {
                    // Up to the end of the segment, or the start of the next one.
                    let limit = match seg {
                        Some(s) => s.vaddr.saturating_add(s.memsz) - at,
                        None => self.segments.get(i).map_or(u64::MAX, |s| s.vaddr - at),
                    };
                    self.read_file(at, &mut buf[done..done + want.min(limit) as usize])
                        .ok_or(fail)?
                }
                _ => return Err(fail),
            };
            done += n as usize;
        }
        Ok(())
    }

    /// Reads into `buf` from the file mapped at `at`, up to the end of that mapping; the
    /// bytes read, or `None` when no file is mapped there or it cannot be read.
    fn read_file(&self, at: u64, buf: &mut [u8]) -> Option<u64> {
        let i = self
            .ranges
            .partition_point(|r| r.start <= at)
            .checked_sub(1)?;
        let range = &self.ranges[i];
        if at >= range.end {
            return None;
        }
        let n = (buf.len() as u64).min(range.end - at) as usize;
        let backing = &self.backings[range.backing];
        let file = backing
            .file
            .get_or_init(|| regular_file(&backing.path))
            .as_ref()?;
        file.read_exact_at(&mut buf[..n], range.offset + (at - range.start))
            .ok()?;
        Some(n as u64)
    }

    /// Reads the file `path` in place of `old` wherever the core maps `old`.
    fn substitute(&mut self, old: &str, path: &Path) {
        for b in &mut self.backings {
            if b.path.as_os_str().as_bytes() == old.as_bytes() {
                b.path = path.to_path_buf();
                b.file = OnceCell::new();
            }
        }
    }
}

/// The core file `path` mapped, its notes, its `NT_FILE` entries, and the `NT_FILE` path of
/// its executable when the notes tell it.
fn read_core(
    path: &Path,
) -> Result<(CoreMemory, Notes, Vec<FileEntry>, Option<String>), TargetError> {
    let map = FileMap::open(path.as_os_str().as_bytes()).map_err(|e| match e {
        SymError::NotAFile => TargetError::NotACore {
            path: path.to_path_buf(),
            why: "it is empty or not a regular file".into(),
        },
        SymError::Open(errno) | SymError::Map(errno) => {
            TargetError::io(path, std::io::Error::from_raw_os_error(errno))
        }
        other => TargetError::io(path, std::io::Error::other(other.to_string())),
    })?;
    let (segments, notes) = parse(map.as_slice()).map_err(|e| e.at(path))?;
    let Some(files) = notes.files.clone() else {
        return Err(TargetError::NotACore {
            path: path.to_path_buf(),
            why: "it has no NT_FILE note listing its mapped files, which cores of Linux and of gdb's gcore have".into(),
        });
    };
    let memory = CoreMemory::new(map, segments, &files);
    let exe_entry = executable(&notes, &files, &Dumped(&memory));
    Ok((memory, notes, files, exe_entry))
}

/// The executable that dumped the core file `path`, as [`open`] finds it without `--exe`:
/// the file its notes name, without a ` (deleted)` mark.
pub(super) fn executable_of(path: &Path) -> Result<PathBuf, TargetError> {
    match read_core(path)?.3 {
        Some(entry) => Ok(PathBuf::from(strip_deleted(&entry))),
        None => Err(TargetError::ExeUnknown {
            core: path.to_path_buf(),
        }),
    }
}

/// Opens the core file `path`; `exe` is the executable when the notes do not name it.
pub(super) fn open(path: &Path, exe: Option<&Path>) -> Result<Target, TargetError> {
    let (mut memory, notes, files, exe_entry) = read_core(path)?;
    // The executable's entry in NT_FILE, and the file to read it from.
    let (exe_entry, exe_file) = match (exe_entry, exe) {
        (None, None) => {
            return Err(TargetError::ExeUnknown {
                core: path.to_path_buf(),
            })
        }
        (Some(entry), None) => {
            let file = PathBuf::from(strip_deleted(&entry));
            (entry, file)
        }
        (named, Some(exe)) => {
            let entry = named.or_else(|| by_file_name(&files, exe)).ok_or_else(|| {
                TargetError::OtherBuild {
                    path: exe.to_path_buf(),
                    why: format!("{} maps no file of that name", path.display()),
                }
            })?;
            memory.substitute(strip_deleted(&entry), exe);
            (entry, exe.to_path_buf())
        }
    };
    let mut mappings = mappings(&memory.segments, &files);
    name_vdso(&mut mappings, notes.aux(AT_SYSINFO_EHDR));
    let found = modules::find(&memory, &Dumped(&memory), &mappings);
    infer_permissions(&mut mappings, &memory.segments, &found);
    let candidates = |l: &modules::Loaded| {
        if l.module.path.as_os_str().as_bytes() == exe_entry.as_bytes() {
            vec![exe_file.clone()]
        } else {
            vec![PathBuf::from(strip_deleted(
                &l.module.path.to_string_lossy(),
            ))]
        }
    };
    let mut resolved = modules::resolve(found, candidates, Policy::Strict)?;
    let exe_name = Path::new(strip_deleted(&exe_entry))
        .file_name()
        .map_or_else(|| exe_entry.clone(), |n| n.to_string_lossy().into_owned());
    let name = format!("core file {} ({exe_name})", path.display());
    let pid = notes.threads.first().map(|t| t.tid as i32);
    Ok(Target {
        header: resolved.header(&name, &memory)?,
        modules: resolved.modules,
        mappings,
        threads: notes.threads,
        name,
        live: false,
        process: ProcessFacts {
            pid,
            executable: Some(PathBuf::from(&exe_entry)),
            command: notes.psargs.clone(),
        },
        memory: Box::new(memory),
    })
}

/// A path as named by the kernel, without its ` (deleted)` mark.
fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(super::maps::DELETED).unwrap_or(path)
}

/// Why the bytes are not a readable core, before the path is known to the message.
#[derive(Debug, PartialEq, Eq)]
enum Invalid {
    NotACore(String),
    Truncated(String),
}

impl Invalid {
    fn at(self, path: &Path) -> TargetError {
        let path = path.to_path_buf();
        match self {
            Invalid::NotACore(why) => TargetError::NotACore { path, why },
            Invalid::Truncated(why) => TargetError::TruncatedCore { path, why },
        }
    }
}

fn truncated(what: &str, needed: u64, len: usize) -> Invalid {
    Invalid::Truncated(format!(
        "{what} end at byte {needed} but the file has {len} bytes: {} bytes are missing",
        needed - len as u64
    ))
}

/// The segments and notes of the core file `data`.
fn parse(data: &[u8]) -> Result<(Vec<Segment>, Notes), Invalid> {
    let not = |why: String| Invalid::NotACore(why);
    if data.get(..4) != Some(&object::elf::ELFMAG[..]) {
        return Err(not("it is not an ELF file".into()));
    }
    let header = FileHeader64::<LE>::parse(data).map_err(|_| {
        if data.len() < core::mem::size_of::<FileHeader64<LE>>() {
            truncated("its ELF header should", 64, data.len())
        } else {
            not("a 32-bit or big-endian ELF file".into())
        }
    })?;
    if header.e_machine(LE) != EM_X86_64 {
        return Err(not(format!(
            "an ELF file for machine {}, not x86_64",
            header.e_machine(LE).0
        )));
    }
    let kind = header.e_type(LE);
    if kind != ET_CORE {
        let what = match kind.0 {
            1 => "an ELF object file".into(),
            2 => "an ELF executable".into(),
            3 => "an ELF shared object or position-independent executable".into(),
            n => format!("an ELF file of type {n}"),
        };
        return Err(not(format!("{what}, not a core")));
    }
    let phnum = header
        .phnum(LE, data)
        .map_err(|e| not(format!("its program header count: {e}")))? as u64;
    let phsize = core::mem::size_of::<ProgramHeader64<LE>>() as u64;
    if usize::from(header.e_phentsize(LE)) != phsize as usize {
        return Err(not(format!(
            "program headers of {} bytes",
            header.e_phentsize(LE)
        )));
    }
    let table_end = header.e_phoff(LE).saturating_add(phnum * phsize);
    if table_end > data.len() as u64 {
        return Err(truncated("its program headers", table_end, data.len()));
    }
    let phdrs = header
        .program_headers(LE, data)
        .map_err(|e| not(format!("its program headers: {e}")))?;
    let mut needed = 0u64;
    for p in phdrs {
        let end = p.p_offset(LE).checked_add(p.p_filesz(LE));
        needed = needed.max(end.ok_or_else(|| not("a segment past 2^64 bytes".into()))?);
    }
    if needed > data.len() as u64 {
        return Err(truncated("its segments", needed, data.len()));
    }
    let mut notes = Notes::default();
    let mut segments = Vec::new();
    for p in phdrs {
        let (offset, filesz) = (p.p_offset(LE), p.p_filesz(LE));
        if p.p_type(LE) == PT_NOTE {
            let bytes = &data[offset as usize..(offset + filesz) as usize];
            notes.add_segment(bytes, p.p_align(LE)).map_err(not)?;
        } else if p.p_type(LE) == PT_LOAD && p.p_memsz(LE) > 0 {
            segments.push(Segment {
                vaddr: p.p_vaddr(LE),
                memsz: p.p_memsz(LE),
                offset,
                filesz: filesz.min(p.p_memsz(LE)),
                flags: p.p_flags(LE).0,
            });
        }
    }
    segments.sort_by_key(|s| s.vaddr);
    Ok((segments, notes))
}

impl CoreMemory {
    fn new(map: FileMap, segments: Vec<Segment>, files: &[FileEntry]) -> Self {
        let mut backings: Vec<Backing> = Vec::new();
        let mut ranges: Vec<FileRange> = files
            .iter()
            .map(|f| {
                let path = Path::new(strip_deleted(&f.path));
                let backing = match backings.iter().position(|b| b.path == path) {
                    Some(i) => i,
                    None => {
                        backings.push(Backing {
                            path: path.to_path_buf(),
                            file: OnceCell::new(),
                        });
                        backings.len() - 1
                    }
                };
                FileRange {
                    start: f.start,
                    end: f.end,
                    offset: f.offset,
                    backing,
                }
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        // What the core holds itself, and what the mapped files fill in.
        let held = segments
            .iter()
            .filter(|s| s.filesz > 0)
            .map(|s| (s.vaddr, s.vaddr.saturating_add(s.filesz.min(s.memsz))));
        let runs = extent::merge(
            held.chain(ranges.iter().map(|r| (r.start, r.end)))
                .collect(),
        );
        CoreMemory {
            map,
            segments,
            ranges,
            backings,
            runs,
        }
    }
}

/// The `NT_FILE` path of the executable: the file mapped where its program headers are
/// (`AT_PHDR`), else the one `AT_EXECFN` names, else the one file named as `pr_fname`.
fn executable(notes: &Notes, files: &[FileEntry], dumped: &dyn Memory) -> Option<String> {
    if let Some(phdr) = notes.aux(AT_PHDR) {
        if let Some(f) = files.iter().find(|f| f.start <= phdr && phdr < f.end) {
            return Some(f.path.clone());
        }
    }
    if let Some(execfn) = notes.aux(AT_EXECFN).and_then(|at| c_string_at(dumped, at)) {
        if let Some(f) = files.iter().find(|f| strip_deleted(&f.path) == execfn) {
            return Some(f.path.clone());
        }
    }
    // pr_fname is the file name, cut to 15 bytes: accept it only when one file fits.
    let fname = notes.fname.as_deref().filter(|n| !n.is_empty())?.as_bytes();
    let fits = |name: &[u8]| name == fname || (fname.len() == 15 && name.starts_with(fname));
    let mut fitting = files.iter().filter(|f| {
        f.offset == 0
            && Path::new(strip_deleted(&f.path))
                .file_name()
                .is_some_and(|n| fits(n.as_bytes()))
    });
    let first = fitting.next()?;
    fitting
        .all(|f| f.path == first.path)
        .then(|| first.path.clone())
}

/// The `NT_FILE` path whose file name is `exe`'s.
fn by_file_name(files: &[FileEntry], exe: &Path) -> Option<String> {
    let name = exe.file_name()?;
    files
        .iter()
        .find(|f| Path::new(strip_deleted(&f.path)).file_name() == Some(name))
        .map(|f| f.path.clone())
}

/// A NUL-terminated string at `addr`, read a piece at a time up to [`MAX_PATH`] bytes.
fn c_string_at(memory: &dyn Memory, addr: u64) -> Option<String> {
    let mut bytes = Vec::new();
    let mut piece = [0u8; 64];
    while bytes.len() < MAX_PATH {
        // Not past the end of the page: the next one may be absent.
        let at = addr.checked_add(bytes.len() as u64)?;
        let n = piece.len().min((4096 - at % 4096) as usize);
        memory.read(at, &mut piece[..n]).ok()?;
        if let Some(end) = piece[..n].iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&piece[..end]);
            return String::from_utf8(bytes).ok();
        }
        bytes.extend_from_slice(&piece[..n]);
    }
    None
}

/// The address space: every `PT_LOAD` segment with its permissions, named by the `NT_FILE`
/// entry that starts where it does; and the entries the core holds no segment for.
fn mappings(segments: &[Segment], files: &[FileEntry]) -> Vec<Mapping> {
    let file_at = |start: u64| files.iter().find(|f| f.start == start);
    let mut out: Vec<Mapping> = segments
        .iter()
        .map(|s| {
            let file = file_at(s.vaddr);
            Mapping {
                start: s.vaddr,
                end: file.map_or(s.vaddr.saturating_add(s.memsz), |f| f.end),
                read: s.flags & 4 != 0,
                write: s.flags & 2 != 0,
                exec: s.flags & 1 != 0,
                offset: file.map_or(0, |f| f.offset),
                name: file.map_or_else(String::new, |f| f.path.clone()),
            }
        })
        .collect();
    for f in files {
        if !segments.iter().any(|s| s.vaddr == f.start) {
            // Permissions unknown until the module's program headers say (below).
            out.push(Mapping {
                start: f.start,
                end: f.end,
                read: true,
                write: false,
                exec: false,
                offset: f.offset,
                name: f.path.clone(),
            });
        }
    }
    out.sort_by_key(|m| m.start);
    out
}

/// `AT_SYSINFO_EHDR`: where the kernel mapped the vDSO.
const AT_SYSINFO_EHDR: u64 = 33;

/// Names the vDSO's mapping as `/proc/PID/maps` does (`[vdso]`): the core's `NT_FILE` does not
/// list it (no file backs it), but the auxiliary vector says where it is, and its writable
/// data is a root of the leak scan as gdb counts it.
fn name_vdso(mappings: &mut [Mapping], at: Option<u64>) {
    let Some(at) = at else { return };
    if let Some(m) = mappings
        .iter_mut()
        .find(|m| m.start == at && m.name.is_empty())
    {
        m.name = "[vdso]".into();
    }
}

/// Mappings the core has no segment for (gcore leaves out code it can read from the files)
/// take the permissions of the module segment they map.
fn infer_permissions(mappings: &mut [Mapping], segments: &[Segment], found: &[modules::Loaded]) {
    for m in mappings {
        if segments.iter().any(|s| s.vaddr == m.start) {
            continue;
        }
        let module = found
            .iter()
            .find(|l| l.module.path.as_os_str().as_bytes() == m.name.as_bytes());
        if let Some((read, write, exec)) = module.and_then(|l| l.permissions_at(m.offset)) {
            (m.read, m.write, m.exec) = (read, write, exec);
        }
    }
}

/// The file at `path` opened for reading if it is a regular file. A path from a core's notes
/// names whatever was mapped then and may be anything by now: opening a FIFO without a writer
/// would wait forever (hence `O_NONBLOCK`, which regular files ignore), and a device's reads
/// could too.
pub(crate) fn regular_file(path: &std::path::Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

#[cfg(test)]
mod tests;
