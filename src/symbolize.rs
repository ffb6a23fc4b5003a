//! In-process symbolization for `print_trace` (and the profiler's reports).
//!
//! gdb may call `print_trace` while any other thread is stopped anywhere, holding any lock
//! (DESIGN.md facts 3 and 9). So this module takes no lock at all: it does not ask the
//! dynamic linker for the module list (`dl_iterate_phdr` takes the loader lock), does not
//! use the `backtrace` crate (global mutex) and does not touch stdio. The caller hands in
//! the module (path, load bias, mapped range) from its own unwinder registry, and this
//! module maps the ELF file read-only with plain `open`/`mmap` and reads DWARF and symbol
//! tables straight out of the mapping with `object` and `addr2line`.
//!
//! Lookup order for one address:
//! 1. DWARF of the file itself, else of its separate debug file
//!    (`/usr/lib/debug/.build-id/xx/yyyy.debug`, then `.gnu_debuglink` next to the file,
//!    in `.debug/` or under `/usr/lib/debug/<dir>`), with a dwz supplementary file from
//!    `.gnu_debugaltlink` when there is one. Inlined frames come first.
//! 2. The ELF symbol table (`.symtab`, the debug file's `.symtab`, else `.dynsym`): the
//!    nearest function symbol at or below the address, as `name+0xoff`.
//!
//! Anything that fails becomes a [`SymError`]; the caller then prints `module+0xoffset`.

use std::borrow::Cow;
use std::fmt;

use addr2line::gimli;
use object::read::elf::Sym as _;
use object::{Object as _, ObjectSection as _};

/// The DWARF reader: slices into our own mappings (or decompressed copies), which the
/// owning [`Loaded`] keeps alive for as long as anything borrows them.
type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// ELF header of the process's own class and byte order; other files fail to parse, which
/// is right because such a file cannot have been loaded into this process.
#[cfg(target_pointer_width = "64")]
type Hdr = object::elf::FileHeader64<object::NativeEndian>;
#[cfg(target_pointer_width = "32")]
type Hdr = object::elf::FileHeader32<object::NativeEndian>;
type Elf = object::read::elf::ElfFile<'static, Hdr>;

/// Where `.gnu_debuglink` and `.build-id` debug files are installed by distributions.
const DEBUG_ROOT: &[u8] = b"/usr/lib/debug";

/// One loaded module as the unwinder registry knows it.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRef<'a> {
    /// File the module was loaded from; empty for the main executable (read through
    /// `/proc/self/exe`). A name without `/` (such as `linux-vdso.so.1`) has no file.
    pub path: &'a [u8],
    /// Load bias: actual address = address stated in the file + `bias`.
    pub bias: u64,
    /// First actual address of the module's mappings.
    pub start: u64,
    /// One past the last actual address of the module's mappings.
    pub end: u64,
}

/// One symbolized frame; an address inside inlined code yields several, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymFrame {
    /// Demangled function name (without Rust hash); `name+0xoff` when it comes from the
    /// symbol table rather than DWARF.
    pub function: Option<String>,
    /// Source file, as full a path as the debug info gives.
    pub file: Option<String>,
    /// Source line; 0 when unknown.
    pub line: u32,
    /// Source column; 0 when unknown (or the left edge).
    pub column: u32,
    /// True when this function was inlined into the frame that follows it.
    pub inlined: bool,
}

impl fmt::Display for SymFrame {
    /// `function at file:line:column`, leaving out what is unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.function.as_deref().unwrap_or("??"))?;
        if let Some(file) = &self.file {
            write!(f, " at {file}")?;
            if self.line != 0 {
                write!(f, ":{}", self.line)?;
                if self.column != 0 {
                    write!(f, ":{}", self.column)?;
                }
            }
        }
        Ok(())
    }
}

/// Why an address could not be symbolized. Cheap to copy, so failures can be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymError {
    /// The probe address lies outside the module's mapped range.
    NotInModule,
    /// The module has no file to read (the vDSO and similar pseudo-modules).
    NoFile,
    /// The path contains a NUL byte, or `/proc/self/exe` could not be resolved.
    BadPath,
    /// `open` or `fstat` failed with this errno.
    Open(i32),
    /// The path is not a regular file, or it is empty.
    NotAFile,
    /// `mmap` failed with this errno.
    Map(i32),
    /// The file is not a well-formed ELF file of this process's class.
    Elf(object::Error),
    /// Neither debug info nor any symbol covers the address.
    NoSymbol,
}

impl fmt::Display for SymError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SymError::NotInModule => f.write_str("address outside the module"),
            SymError::NoFile => f.write_str("module has no file"),
            SymError::BadPath => f.write_str("unusable module path"),
            SymError::Open(e) => write!(f, "cannot open module file (errno {e})"),
            SymError::NotAFile => f.write_str("module path is not a regular non-empty file"),
            SymError::Map(e) => write!(f, "cannot map module file (errno {e})"),
            SymError::Elf(e) => write!(f, "malformed ELF file: {e}"),
            SymError::NoSymbol => f.write_str("no debug info or symbol for the address"),
        }
    }
}

impl std::error::Error for SymError {}

/// Per-call cache of opened/parsed files.
///
/// A `print_trace` call symbolizes ~20-60 addresses, usually in a few modules, so each file
/// is mapped and parsed once per `Symbolizer`; failures are cached too, so a missing file
/// costs one `open`. Dropping it unmaps everything.
pub struct Symbolizer {
    files: Vec<CachedFile>,
    /// Separate debug files are looked up only when set; tests clear it to reach the
    /// symbol-table fallback on files whose debug package is installed.
    separate_debug: bool,
    /// Bytes still allowed for decompressed debug sections across all files.
    decompress_budget: u64,
}

/// Default cap on decompressed debug sections per [`Symbolizer`]: glibc's compressed
/// debug file needs 8.6 MB; a file needing more than this falls back to its symbol table.
pub const DEFAULT_DECOMPRESS_LIMIT: u64 = 64 << 20;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// An empty cache; nothing is opened until the first [`Symbolizer::symbolize`].
    pub fn new() -> Self {
        Symbolizer {
            files: Vec::new(),
            separate_debug: true,
            decompress_budget: DEFAULT_DECOMPRESS_LIMIT,
        }
    }

    /// Caps the heap spent on decompressing `SHF_COMPRESSED` debug sections by the files
    /// opened from now on (default [`DEFAULT_DECOMPRESS_LIMIT`]). Files over the budget
    /// are symbolized from their symbol table only.
    pub fn set_decompress_limit(&mut self, bytes: u64) {
        self.decompress_budget = bytes;
    }

    /// Appends the frames for `probe` to `out`: inlined functions innermost first
    /// (`inlined: true`), then the function they were inlined into (`inlined: false`).
    ///
    /// `probe` is an actual address inside the module; callers pass `return_address - 1`
    /// so that the call instruction, not the one after it, is looked up. On error `out` is
    /// left as it was.
    pub fn symbolize(
        &mut self,
        module: &ModuleRef<'_>,
        probe: u64,
        out: &mut Vec<SymFrame>,
    ) -> Result<(), SymError> {
        if probe < module.start || probe >= module.end {
            return Err(SymError::NotInModule);
        }
        let separate_debug = self.separate_debug;
        let budget = &mut self.decompress_budget;
        let index = match self.files.iter().position(|f| f.path == module.path) {
            Some(i) => i,
            None => {
                let loaded = Loaded::open(module.path, separate_debug, budget).map(Box::new);
                self.files.push(CachedFile {
                    path: module.path.to_vec(),
                    loaded,
                });
                self.files.len() - 1
            }
        };
        let loaded = match &mut self.files[index].loaded {
            Ok(loaded) => loaded,
            Err(e) => return Err(*e),
        };
        // Wrapping: a bogus bias must give a wrong answer, never an overflow panic.
        let svma = probe.wrapping_sub(module.bias);
        let first = out.len();
        loaded.dwarf_frames(svma, out);
        let found_dwarf = out.len() > first;
        if found_dwarf {
            let last = out.len() - 1;
            for frame in &mut out[first..last] {
                frame.inlined = true;
            }
            if out[last].function.is_none() {
                // Line tables without a subprogram entry (assembly, some C objects): the
                // symbol table still knows the function.
                out[last].function = loaded.symbol_for(svma).map(|(name, _)| demangle(name));
            }
            return Ok(());
        }
        match loaded.symbol_for(svma) {
            Some((name, offset)) => {
                out.push(SymFrame {
                    function: Some(format!("{}+{:#x}", demangle(name), offset)),
                    ..SymFrame::default()
                });
                Ok(())
            }
            None => Err(SymError::NoSymbol),
        }
    }
}

/// One module path and what opening it gave.
struct CachedFile {
    path: Vec<u8>,
    loaded: Result<Box<Loaded>, SymError>,
}

/// A read-only private mapping of a whole file; unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; moving it to another
// thread moves nothing but the right to read and unmap it.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the file at `path` (no NUL byte allowed in it).
    fn open(path: &[u8]) -> Result<Mapping, SymError> {
        if path.contains(&0) {
            return Err(SymError::BadPath);
        }
        let mut cpath = Vec::with_capacity(path.len() + 1);
        cpath.extend_from_slice(path);
        cpath.push(0);
        let fd = loop {
            // SAFETY: `cpath` is NUL-terminated and outlives the call.
            let fd = unsafe { libc::open(cpath.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
            if fd >= 0 {
                break fd;
            }
            let errno = last_errno();
            if errno != libc::EINTR {
                return Err(SymError::Open(errno));
            }
        };
        let result = Self::map_fd(fd);
        // SAFETY: `fd` was opened above and is closed exactly once; the mapping (if any)
        // stays valid after the descriptor is closed.
        unsafe { libc::close(fd) };
        result
    }

    fn map_fd(fd: libc::c_int) -> Result<Mapping, SymError> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: `st` points to writable storage of the right type; `fd` is open.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return Err(SymError::Open(last_errno()));
        }
        // SAFETY: fstat succeeded, so it filled `st` (which was zeroed besides).
        let st = unsafe { st.assume_init() };
        // Only regular files: a FIFO or device would block or map something unbounded.
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size <= 0 {
            return Err(SymError::NotAFile);
        }
        let len = usize::try_from(st.st_size).map_err(|_| SymError::NotAFile)?;
        // SAFETY: a fresh read-only private mapping of an open regular file; the kernel
        // picks the address, so nothing existing is replaced.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SymError::Map(last_errno()));
        }
        Ok(Mapping { ptr, len })
    }

    /// The mapped bytes, with a lifetime the borrow checker cannot see.
    ///
    /// # Safety
    /// The slice (and everything borrowed from it) must not be used after this `Mapping`
    /// is dropped. [`Loaded`] guarantees it by dropping its parsers before its mappings.
    unsafe fn bytes(&self) -> &'static [u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping until `drop`; the caller
        // promises not to outlive it.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping made by `map_fd` and unmapped only here.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A symbol-table entry kept for address lookup; names are read from the table on demand
/// so that a big table costs 16 bytes per function.
#[derive(Clone, Copy)]
struct SymEntry {
    address: u64,
    index: u32,
}

/// Function symbols sorted by address, and which table they index.
struct SymbolIndex {
    in_debug_file: bool,
    dynamic: bool,
    entries: Vec<SymEntry>,
}

/// One parsed module file with its debug info.
///
/// Field order is drop order: `dwarf`, `elf` and `debug_elf` borrow from `_decompressed`
/// and `_mappings` through `'static` slices, so they must go first.
struct Loaded {
    dwarf: Option<addr2line::Context<Slice>>,
    symbols: Option<SymbolIndex>,
    elf: Elf,
    debug_elf: Option<Elf>,
    _decompressed: Vec<Vec<u8>>,
    _mappings: Vec<Mapping>,
}

impl Loaded {
    fn open(path: &[u8], separate_debug: bool, budget: &mut u64) -> Result<Loaded, SymError> {
        let exe_path;
        let (open_path, real_path): (&[u8], Option<&[u8]>) = if path.is_empty() {
            exe_path = read_link(b"/proc/self/exe\0");
            (b"/proc/self/exe", exe_path.as_deref())
        } else if !path.contains(&b'/') {
            return Err(SymError::NoFile);
        } else {
            (path, Some(path))
        };
        let mut mappings = Vec::new();
        let mut decompressed = Vec::new();
        let main_map = Mapping::open(open_path)?;
        // SAFETY: the slice is used only by `elf`, `debug_elf` and `dwarf`, which are
        // stored in the same `Loaded` as `mappings` and dropped before it.
        let elf = Elf::parse(unsafe { main_map.bytes() }).map_err(SymError::Elf)?;
        mappings.push(main_map);

        let mut debug_elf = None;
        let mut debug_path = None;
        if separate_debug && !has_dwarf(&elf) {
            if let Some(found) = find_debug_file(&elf, real_path) {
                debug_elf = Some(found.file);
                mappings.push(found.map);
                debug_path = Some(found.path);
            }
        }
        let dwarf_file = debug_elf.as_ref().unwrap_or(&elf);
        let dwarf_path = debug_path.as_deref().or(real_path);
        let sup = if separate_debug && has_dwarf(dwarf_file) {
            find_sup_file(dwarf_file, dwarf_path)
        } else {
            None
        };
        let needed = decompressed_size(dwarf_file)
            .saturating_add(sup.as_ref().map_or(0, |s| decompressed_size(&s.file)));
        let dwarf = if has_dwarf(dwarf_file) && needed <= *budget {
            *budget -= needed;
            let mut dwarf = load_dwarf(dwarf_file, &mut decompressed);
            if let Some(sup) = sup {
                dwarf.set_sup(load_dwarf(&sup.file, &mut decompressed));
                // The parsed file is dropped here; the Dwarf only borrows the mapping.
                mappings.push(sup.map);
            }
            // Broken DWARF only costs the file:line part; the symbol table still answers.
            addr2line::Context::from_dwarf(dwarf).ok()
        } else {
            None
        };
        Ok(Loaded {
            dwarf,
            symbols: None,
            elf,
            debug_elf,
            _decompressed: decompressed,
            _mappings: mappings,
        })
    }

    /// Appends the DWARF frames for `svma` (a stated address); appends nothing when
    /// there is no usable debug info for it.
    fn dwarf_frames(&self, svma: u64, out: &mut Vec<SymFrame>) {
        let Some(ctx) = &self.dwarf else { return };
        let first = out.len();
        // Split DWARF (.dwo) is not loaded: skipped units just give fewer details.
        let Ok(mut frames) = ctx.find_frames(svma).skip_all_loads() else {
            return;
        };
        while let Ok(Some(frame)) = frames.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok())
                .map(|name| demangle(&name));
            let (file, line, column) = match &frame.location {
                Some(loc) => (
                    loc.file.map(str::to_owned),
                    loc.line.unwrap_or(0),
                    loc.column.unwrap_or(0),
                ),
                None => (None, 0, 0),
            };
            out.push(SymFrame {
                function,
                file,
                line,
                column,
                inlined: false,
            });
        }
        // A lookup that produced nothing but empty frames is no answer: let the caller
        // fall back to the symbol table instead of printing "??".
        if out[first..]
            .iter()
            .all(|f| f.function.is_none() && f.file.is_none())
        {
            out.truncate(first);
        }
    }

    /// The function symbol at or below `svma`, and the offset from it.
    fn symbol_for(&mut self, svma: u64) -> Option<(&'static str, u64)> {
        if self.symbols.is_none() {
            self.symbols = Some(self.build_symbol_index());
        }
        let symbols = self.symbols.as_ref()?;
        let pos = symbols.entries.partition_point(|e| e.address <= svma);
        let entry = symbols.entries.get(pos.checked_sub(1)?)?;
        let file = if symbols.in_debug_file {
            self.debug_elf.as_ref()?
        } else {
            &self.elf
        };
        let name = symbol_name(file, symbols.dynamic, entry.index)?;
        Some((name, svma - entry.address))
    }

    fn build_symbol_index(&self) -> SymbolIndex {
        // Full tables beat .dynsym, which lacks every static function.
        let (in_debug_file, dynamic, file) = if !self.elf.elf_symbol_table().is_empty() {
            (false, false, &self.elf)
        } else if let Some(debug) = self
            .debug_elf
            .as_ref()
            .filter(|d| !d.elf_symbol_table().is_empty())
        {
            (true, false, debug)
        } else {
            (false, true, &self.elf)
        };
        let endian = file.endian();
        let table = symbol_table(file, dynamic);
        let mut entries: Vec<SymEntry> = table
            .enumerate()
            .filter(|(_, sym)| {
                matches!(
                    sym.st_type(),
                    object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC
                ) && sym.st_shndx(endian) != object::elf::SHN_UNDEF
                    && word(sym.st_value(endian)) != 0
            })
            .filter_map(|(index, sym)| {
                Some(SymEntry {
                    address: word(sym.st_value(endian)),
                    index: u32::try_from(index.0).ok()?,
                })
            })
            .collect();
        // Aliases share an address (malloc / __libc_malloc): put the preferred name first
        // and keep only it.
        entries.sort_unstable_by_key(|e| (e.address, alias_rank(file, dynamic, e.index)));
        entries.dedup_by_key(|e| e.address);
        entries.shrink_to_fit();
        SymbolIndex {
            in_debug_file,
            dynamic,
            entries,
        }
    }
}

/// Widens an ELF word (`u32` in ELF32, `u64` in ELF64) to an address.
fn word<W: Into<u64>>(w: W) -> u64 {
    w.into()
}

fn symbol_table(file: &Elf, dynamic: bool) -> &object::read::elf::SymbolTable<'static, Hdr> {
    if dynamic {
        file.elf_dynamic_symbol_table()
    } else {
        file.elf_symbol_table()
    }
}

fn symbol_name(file: &Elf, dynamic: bool, index: u32) -> Option<&'static str> {
    let table = symbol_table(file, dynamic);
    let sym = table
        .symbol(object::SymbolIndex(usize::try_from(index).ok()?))
        .ok()?;
    let name = table.symbol_name(file.endian(), sym).ok()?;
    std::str::from_utf8(name).ok().filter(|n| !n.is_empty())
}

/// Lower is preferred: global over weak over local, then fewer leading underscores
/// (`malloc` over `__libc_malloc`), as gdb users would name the function.
fn alias_rank(file: &Elf, dynamic: bool, index: u32) -> (u8, usize) {
    let table = symbol_table(file, dynamic);
    let Ok(sym) = table.symbol(object::SymbolIndex(index as usize)) else {
        return (u8::MAX, usize::MAX);
    };
    let bind = match sym.st_bind() {
        object::elf::STB_GLOBAL => 0,
        object::elf::STB_WEAK => 1,
        _ => 2,
    };
    let underscores = symbol_name(file, dynamic, index)
        .map_or(usize::MAX, |n| n.bytes().take_while(|&b| b == b'_').count());
    (bind, underscores)
}

fn has_dwarf(file: &Elf) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

/// The DWARF sections addr2line reads.
const DWARF_SECTIONS: [gimli::SectionId; 10] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugAranges,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
];

/// Heap bytes that decompressing `file`'s DWARF sections would take, as the compression
/// headers state (decompression fails if the data disagrees).
fn decompressed_size(file: &Elf) -> u64 {
    DWARF_SECTIONS
        .iter()
        .filter_map(|id| file.section_by_name(id.name()))
        .filter_map(|section| section.compressed_file_range().ok())
        .filter(|range| range.format != object::CompressionFormat::None)
        .fold(0, |sum, range| sum.saturating_add(range.uncompressed_size))
}

/// Builds the DWARF sections addr2line reads; the rest stay empty so that they are
/// neither decompressed nor kept.
fn load_dwarf(file: &Elf, decompressed: &mut Vec<Vec<u8>>) -> gimli::Dwarf<Slice> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Slice, std::convert::Infallible> {
        let wanted = DWARF_SECTIONS.contains(&id);
        let data: &'static [u8] = match file.section_by_name(id.name()) {
            Some(section) if wanted => match section.uncompressed_data() {
                Ok(Cow::Borrowed(bytes)) => bytes,
                Ok(Cow::Owned(bytes)) => {
                    decompressed.push(bytes);
                    let stored = decompressed.last().map_or(&[][..], |v| v.as_slice());
                    // SAFETY: the bytes live in a `Vec` whose heap buffer never moves or
                    // changes while it sits in `decompressed`, which `Loaded` keeps until
                    // after the `Dwarf` built from it is dropped.
                    unsafe { std::slice::from_raw_parts(stored.as_ptr(), stored.len()) }
                }
                // Undecodable compression: treat as absent; the symbol table remains.
                Err(_) => &[],
            },
            _ => &[],
        };
        Ok(gimli::EndianSlice::new(data, endian))
    };
    let Ok(dwarf) = gimli::Dwarf::load(load);
    dwarf
}

/// Looks for the separate debug file of `elf` by build id, then by `.gnu_debuglink`.
fn find_debug_file(elf: &Elf, real_path: Option<&[u8]>) -> Option<Found> {
    let build_id = elf.build_id().ok().flatten().filter(|id| !id.is_empty());
    if let Some(id) = build_id {
        if let Some(found) = open_matching(&build_id_path(id), Some(id)) {
            return Some(found);
        }
    }
    let (name, _crc) = elf.gnu_debuglink().ok().flatten()?;
    let dir = dir_of(real_path?);
    // The CRC is not checked: it would mean reading the whole debug file. The build id,
    // when both files have one, catches a stale debug file instead.
    for candidate in [
        [dir, b"/", name].concat(),
        [dir, b"/.debug/", name].concat(),
        [DEBUG_ROOT, dir, b"/", name].concat(),
    ] {
        if let Some(found) = open_matching(&candidate, build_id) {
            return Some(found);
        }
    }
    None
}

/// Looks for the dwz supplementary file named by `.gnu_debugaltlink`.
fn find_sup_file(file: &Elf, file_path: Option<&[u8]>) -> Option<Found> {
    let (name, build_id) = file.gnu_debugaltlink().ok().flatten()?;
    let build_id = Some(build_id).filter(|id| !id.is_empty());
    if name.first() == Some(&b'/') {
        if let Some(found) = open_matching(name, build_id) {
            return Some(found);
        }
    } else if let Some(path) = file_path {
        if let Some(found) = open_matching(&[dir_of(path), b"/", name].concat(), build_id) {
            return Some(found);
        }
    }
    open_matching(&build_id_path(build_id?), build_id)
}

/// A separate debug or supplementary file. Field order is drop order: `file` borrows
/// from `map`.
struct Found {
    file: Elf,
    map: Mapping,
    path: Vec<u8>,
}

/// Maps and parses `path`, accepting it only when its build id matches `expected` (files
/// without a build id are given the benefit of the doubt).
fn open_matching(path: &[u8], expected: Option<&[u8]>) -> Option<Found> {
    let map = Mapping::open(path).ok()?;
    // SAFETY: the caller stores `map` next to the parsed file in a `Loaded`, which drops
    // the parsed file first.
    let file = Elf::parse(unsafe { map.bytes() }).ok()?;
    if let (Some(want), Ok(Some(have))) = (expected, file.build_id()) {
        if want != have {
            return None;
        }
    }
    Some(Found {
        file,
        map,
        path: path.to_vec(),
    })
}

/// `/usr/lib/debug/.build-id/xx/yyyy.debug` for build id `xxyyyy`.
fn build_id_path(id: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut path = Vec::with_capacity(DEBUG_ROOT.len() + 12 + 2 * id.len() + 6);
    path.extend_from_slice(DEBUG_ROOT);
    path.extend_from_slice(b"/.build-id/");
    for (i, byte) in id.iter().enumerate() {
        path.push(HEX[usize::from(byte >> 4)]);
        path.push(HEX[usize::from(byte & 0xf)]);
        if i == 0 {
            path.push(b'/');
        }
    }
    path.extend_from_slice(b".debug");
    path
}

/// Everything before the last `/` ("" for `/name`, "." for a bare name).
fn dir_of(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b".",
    }
}

/// `readlink` of a NUL-terminated path.
fn read_link(path: &[u8]) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `path` is NUL-terminated (callers pass literals ending in \0) and `buf` is
    // writable for its full length.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).ok()?;
    // A full buffer may be a truncated link.
    if n == 0 || n >= buf.len() {
        return None;
    }
    buf.truncate(n);
    Some(buf)
}

/// Rust (v0 and legacy, without the hash), then C++ (Itanium), else the name as is.
fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name.as_bytes()) {
            if let Ok(s) = sym.demangle() {
                return s;
            }
        }
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The module containing `addr`, found the way a test may (dladdr + /proc/self/maps),
    /// with an empty path when it is the main executable.
    fn module_of(addr: usize) -> (Vec<u8>, u64, u64, u64) {
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        // SAFETY: `info` is writable; dladdr only fills it.
        let ok = unsafe { libc::dladdr(addr as *const libc::c_void, info.as_mut_ptr()) };
        assert_ne!(ok, 0, "dladdr found no module for {addr:#x}");
        // SAFETY: dladdr succeeded, so `info` is filled.
        let info = unsafe { info.assume_init() };
        let base = info.dli_fbase as u64;
        // Find the file backing `base` and the range of its mappings.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut file = None;
        for line in maps.lines() {
            let mut parts = line.split_whitespace();
            let range = parts.next().unwrap();
            let start = u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap();
            if start == base {
                file = parts.nth(4).map(str::to_owned);
            }
        }
        let file = file.expect("mapping at dli_fbase");
        let (mut start, mut end) = (u64::MAX, 0);
        for line in maps.lines() {
            if line.split_whitespace().nth(5) == Some(file.as_str()) {
                let range = line.split_whitespace().next().unwrap();
                let (s, e) = range.split_once('-').unwrap();
                start = start.min(u64::from_str_radix(s, 16).unwrap());
                end = end.max(u64::from_str_radix(e, 16).unwrap());
            }
        }
        let data = std::fs::read(&file).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        // PIE and shared objects are linked at 0, so the base is the bias.
        let bias = if elf.kind() == object::ObjectKind::Dynamic {
            base
        } else {
            0
        };
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let path = if exe.as_os_str().as_encoded_bytes() == file.as_bytes() {
            Vec::new()
        } else {
            file.into_bytes()
        };
        (path, bias, start, end)
    }

    fn symbolize_addr(sym: &mut Symbolizer, addr: usize) -> Result<Vec<SymFrame>, SymError> {
        let (path, bias, start, end) = module_of(addr);
        let module = ModuleRef {
            path: &path,
            bias,
            start,
            end,
        };
        let mut out = Vec::new();
        sym.symbolize(&module, addr as u64, &mut out).map(|()| out)
    }

    const MARKER_LINE: u32 = line!() + 3;
    #[inline(never)]
    fn marker_function(x: usize) -> usize {
        std::hint::black_box(x).wrapping_mul(31).wrapping_add(7)
    }

    #[test]
    fn own_function_has_name_file_and_line() {
        let mut sym = Symbolizer::new();
        let addr = marker_function as *const () as usize + 1;
        let frames = symbolize_addr(&mut sym, addr).unwrap();
        // black_box may be inlined at the probe; the last frame is the real function.
        let (f, inlined) = frames.split_last().unwrap();
        assert!(
            !f.inlined && inlined.iter().all(|f| f.inlined),
            "{frames:?}"
        );
        let name = f.function.as_deref().unwrap();
        assert!(name.ends_with("tests::marker_function"), "{name}");
        assert!(
            f.file.as_deref().unwrap().ends_with("symbolize.rs"),
            "{f:?}"
        );
        assert!((MARKER_LINE..MARKER_LINE + 3).contains(&f.line), "{f:?}");
        assert!(f.to_string().contains("marker_function at "));
        // A second lookup comes from the cache and agrees.
        assert_eq!(symbolize_addr(&mut sym, addr).unwrap(), frames);
        assert_eq!(sym.files.len(), 1);
    }

    /// Returns the address of an instruction inside its own (inlined) body.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[inline(always)]
    fn inlined_helper(x: usize) -> (usize, usize) {
        let pc: usize;
        // SAFETY: only reads the program counter into a register.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("lea {}, [rip]", out(reg) pc, options(nomem, nostack))
        };
        // SAFETY: only reads the program counter into a register.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!("adr {}, .", out(reg) pc, options(nomem, nostack))
        };
        (pc, std::hint::black_box(x) + 1)
    }

    const CALL_LINE: u32 = line!() + 4;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[inline(never)]
    fn outer_function(x: usize) -> (usize, usize) {
        let r = inlined_helper(x);
        (r.0, std::hint::black_box(r.1))
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn inlined_frames_come_first() {
        let (pc, _) = outer_function(1);
        let frames = symbolize_addr(&mut Symbolizer::new(), pc).unwrap();
        // The scheduler may place the instruction inside black_box's inlined code too, so
        // look at the last two frames: the helper inlined into its non-inlined caller.
        let [.., helper, outer] = frames.as_slice() else {
            panic!("expected an inlined frame: {frames:?}");
        };
        assert!(
            frames[..frames.len() - 1].iter().all(|f| f.inlined),
            "{frames:?}"
        );
        assert!(!outer.inlined, "{frames:?}");
        let helper_name = helper.function.as_deref().unwrap();
        let outer_name = outer.function.as_deref().unwrap();
        assert!(helper_name.ends_with("tests::inlined_helper"), "{frames:?}");
        assert!(outer_name.ends_with("tests::outer_function"), "{frames:?}");
        // The outer frame's line is the call site of the inlined helper.
        assert_eq!(outer.line, CALL_LINE, "{frames:?}");
        assert!(helper.file.as_deref().unwrap().ends_with("symbolize.rs"));
    }

    #[test]
    fn libc_function_from_symbol_table() {
        let mut sym = Symbolizer::new();
        sym.separate_debug = false;
        let addr = libc::malloc as *const () as usize + 1;
        let frames = symbolize_addr(&mut sym, addr).unwrap();
        assert_eq!(frames.len(), 1, "{frames:?}");
        let name = frames[0].function.as_deref().unwrap();
        // Stripped libc: .dynsym only; with symtab, any alias of malloc.
        assert!(name.ends_with("malloc+0x1"), "{name}");
        assert_eq!(frames[0].file, None);
    }

    #[test]
    fn libc_function_with_separate_debug_info() {
        let addr = libc::malloc as *const () as usize + 1;
        let frames = symbolize_addr(&mut Symbolizer::new(), addr).unwrap();
        let outer = frames.last().unwrap();
        assert!(
            outer.function.as_deref().unwrap().contains("malloc"),
            "{frames:?}"
        );
        let (path, ..) = module_of(addr);
        let data = std::fs::read(String::from_utf8(path).unwrap()).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let id = elf.build_id().unwrap().unwrap();
        // Only assert file:line where the distribution's debug file is installed
        // (libc6-dbg: compressed sections, found by build id).
        if std::path::Path::new(std::str::from_utf8(&build_id_path(id)).unwrap()).exists() {
            let file = outer.file.as_deref().unwrap();
            assert!(file.ends_with("malloc.c"), "{frames:?}");
            assert!(outer.line > 0);
            // Debian's debug files are compressed: with no budget, the symbol table
            // (here the debug file's full .symtab) answers instead.
            let mut sym = Symbolizer::new();
            sym.set_decompress_limit(0);
            let frames = symbolize_addr(&mut sym, addr).unwrap();
            assert_eq!(frames.len(), 1, "{frames:?}");
            assert_eq!(frames[0].file, None);
            assert!(frames[0]
                .function
                .as_deref()
                .unwrap()
                .ends_with("malloc+0x1"));
        }
    }

    #[test]
    fn errors_not_panics() {
        let mut sym = Symbolizer::new();
        let mut out = Vec::new();
        let m = ModuleRef {
            path: b"/nonexistent/libnothing.so",
            bias: 0,
            start: 0x1000,
            end: 0x2000,
        };
        assert_eq!(
            sym.symbolize(&m, 0x1500, &mut out),
            Err(SymError::Open(libc::ENOENT))
        );
        // Cached failure, same answer.
        assert_eq!(
            sym.symbolize(&m, 0x1500, &mut out),
            Err(SymError::Open(libc::ENOENT))
        );
        assert_eq!(
            sym.symbolize(&m, 0x2000, &mut out),
            Err(SymError::NotInModule)
        );
        let vdso = ModuleRef {
            path: b"linux-vdso.so.1",
            ..m
        };
        assert_eq!(
            sym.symbolize(&vdso, 0x1500, &mut out),
            Err(SymError::NoFile)
        );
        let dir = ModuleRef { path: b"/tmp", ..m };
        assert_eq!(
            sym.symbolize(&dir, 0x1500, &mut out),
            Err(SymError::NotAFile)
        );
        let nul = ModuleRef {
            path: b"/tmp/a\0b",
            ..m
        };
        assert_eq!(
            sym.symbolize(&nul, 0x1500, &mut out),
            Err(SymError::BadPath)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn truncated_and_corrupt_files_give_errors() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let dir = std::env::temp_dir().join(format!("symbolize-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = marker_function as *const () as usize + 1;
        let (_, bias, start, end) = module_of(target);
        let mut lengths = vec![
            1,
            4,
            16,
            63,
            64,
            65,
            200,
            4096,
            exe.len() / 2,
            exe.len() - 1,
        ];
        lengths.retain(|&n| n < exe.len());
        let mut corrupt = Vec::new();
        for &n in &lengths {
            corrupt.push(exe[..n].to_vec());
        }
        // Flip bytes in the ELF and section headers and across the file.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..24 {
            let mut copy = exe.clone();
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % copy.len();
                let at = if seed & 1 == 0 { at % 64 } else { at };
                copy[at] ^= (seed >> 32) as u8 | 1;
            }
            corrupt.push(copy);
        }
        for (i, bytes) in corrupt.iter().enumerate() {
            let path = dir.join(format!("bad{i}"));
            std::fs::write(&path, bytes).unwrap();
            let m = ModuleRef {
                path: path.as_os_str().as_encoded_bytes(),
                bias,
                start,
                end,
            };
            let mut sym = Symbolizer::new();
            sym.separate_debug = false;
            let mut out = Vec::new();
            // Any result is fine; reaching the next line (no panic, no crash) is the test.
            let r = sym.symbolize(&m, target as u64, &mut out);
            if i < lengths.len() && lengths[i] < 64 {
                assert!(matches!(r, Err(SymError::Elf(_))), "{i}: {r:?}");
            }
            assert_eq!(r.is_err(), out.is_empty());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn demangling() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
        assert_eq!(demangle("main"), "main");
    }

    #[test]
    fn build_id_paths() {
        assert_eq!(
            build_id_path(&[0xab, 0xcd, 0x01]),
            b"/usr/lib/debug/.build-id/ab/cd01.debug"
        );
        assert_eq!(dir_of(b"/lib/libc.so.6"), b"/lib");
        assert_eq!(dir_of(b"libc.so.6"), b".");
    }

    /// Times 20 addresses cold (fresh Symbolizer: map + parse) and warm (cached).
    /// `cargo test --release -- --nocapture timing` prints the numbers.
    #[test]
    fn timing_20_addresses() {
        let fns: [usize; 10] = [
            marker_function as *const () as usize,
            std::fs::read::<&str> as *const () as usize,
            std::env::var::<&str> as *const () as usize,
            String::from_utf8 as *const () as usize,
            str::to_lowercase as *const () as usize,
            std::thread::current as *const () as usize,
            std::time::Instant::now as *const () as usize,
            core::fmt::write as *const () as usize,
            std::io::stdout as *const () as usize,
            std::process::id as *const () as usize,
        ];
        let mut probes = Vec::new();
        for f in fns {
            probes.push(f + 1);
            probes.push(f + 9);
        }
        let modules: Vec<_> = probes.iter().map(|&a| module_of(a)).collect();
        let run = |sym: &mut Symbolizer| {
            let mut out = Vec::new();
            let mut ok = 0;
            for (addr, (path, bias, start, end)) in probes.iter().zip(&modules) {
                let m = ModuleRef {
                    path,
                    bias: *bias,
                    start: *start,
                    end: *end,
                };
                ok += usize::from(sym.symbolize(&m, *addr as u64, &mut out).is_ok());
            }
            (ok, out)
        };
        let mut sym = Symbolizer::new();
        let t = Instant::now();
        let (ok_cold, frames) = run(&mut sym);
        let cold = t.elapsed();
        let t = Instant::now();
        let (ok_warm, _) = run(&mut sym);
        let warm = t.elapsed();
        assert_eq!(ok_cold, probes.len());
        assert_eq!(ok_warm, probes.len());
        let exe_len = std::fs::metadata("/proc/self/exe").unwrap().len();
        println!(
            "20 addresses, {} frames, exe {} KiB: cold {:?}, warm {:?}",
            frames.len(),
            exe_len / 1024,
            cold,
            warm
        );
        for f in frames.iter().take(6) {
            println!("  {f}{}", if f.inlined { " [inlined]" } else { "" });
        }

        // libc through its separate debug file (compressed sections) when installed.
        let libc_fns = [
            libc::malloc as *const () as usize,
            libc::free as *const () as usize,
            libc::realloc as *const () as usize,
            libc::calloc as *const () as usize,
            libc::memcpy as *const () as usize,
        ];
        let (path, bias, start, end) = module_of(libc_fns[0]);
        let m = ModuleRef {
            path: &path,
            bias,
            start,
            end,
        };
        let mut sym = Symbolizer::new();
        let mut out = Vec::new();
        let t = Instant::now();
        for f in libc_fns {
            sym.symbolize(&m, f as u64 + 1, &mut out).unwrap();
        }
        let cold = t.elapsed();
        let t = Instant::now();
        for f in libc_fns {
            sym.symbolize(&m, f as u64 + 1, &mut out).unwrap();
        }
        println!(
            "libc, 5 addresses, {} frames: cold {cold:?}, warm {:?}; {}",
            out.len(),
            t.elapsed(),
            out[0]
        );
    }
}
