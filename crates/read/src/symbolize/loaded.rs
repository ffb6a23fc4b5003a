//! One module file opened for symbolizing: its ELF (and separate debug file), its DWARF as an
//! addr2line context, and an index of its symbol table for the fallback.

use super::bounds::{fde_bounds, symbol_holds};
use super::debug_files::{find_debug_file, find_sup_file, read_link};
use super::demangle::demangle;
use super::dwarf::{decompressed_size, has_dwarf, load_dwarf};
use super::mapping::Mapping;
use super::types::{Elf, Hdr, Slice, SymError, SymFrame};
use object::read::elf::Sym as _;

/// A symbol-table entry kept for address lookup; names are read from the table on demand
/// so that a big table costs 24 bytes per function.
#[derive(Clone, Copy)]
pub(super) struct SymEntry {
    pub(super) address: u64,
    /// `st_size`; 0 when the table does not say (see [`symbol_holds`]).
    pub(super) size: u64,
    pub(super) index: u32,
}

/// Function symbols sorted by address, and which table they index.
pub(super) struct SymbolIndex {
    pub(super) in_debug_file: bool,
    pub(super) dynamic: bool,
    pub(super) entries: Vec<SymEntry>,
}

/// One parsed module file with its debug info.
///
/// Field order is drop order: `dwarf`, `elf` and `debug_elf` borrow from `_decompressed`
/// and `_mappings` through `'static` slices, so they must go first.
pub(super) struct Loaded {
    pub(super) dwarf: Option<addr2line::Context<Slice>>,
    pub(super) symbols: Option<SymbolIndex>,
    pub(super) elf: Elf,
    pub(super) debug_elf: Option<Elf>,
    pub(super) _decompressed: Vec<Vec<u8>>,
    pub(super) _mappings: Vec<Mapping>,
}

impl Loaded {
    pub(super) fn open(
        path: &[u8],
        separate_debug: bool,
        budget: &mut u64,
    ) -> Result<Loaded, SymError> {
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
    pub(super) fn dwarf_frames(&self, svma: u64, out: &mut Vec<SymFrame>) {
        let Some(ctx) = &self.dwarf else { return };
        let first = out.len();
        // Split DWARF (.dwo) is not loaded: skipped units just give fewer details.
        let Ok(mut frames) = ctx.find_frames(svma).skip_all_loads() else {
            return;
        };
        while let Ok(Some(frame)) = frames.next() {
            let function = frame.function.as_ref().and_then(|f| {
                let name = f.raw_name().ok()?;
                // gdb writes a C++ function's parameters even where there is no mangled name
                // to demangle them from (`main()`).
                if is_cpp(f.language) && !name.starts_with("_Z") && !name.contains('(') {
                    if let Some(full) = cpp_name(ctx, svma, &name) {
                        return Some(full);
                    }
                }
                Some(demangle(&name))
            });
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

    /// The function symbol that holds `svma`, and the offset from it: the nearest one at or
    /// below it, if it reaches that far ([`symbol_holds`]).
    pub(super) fn symbol_for(&mut self, svma: u64) -> Option<(&'static str, u64)> {
        if self.symbols.is_none() {
            self.symbols = Some(self.build_symbol_index());
        }
        let symbols = self.symbols.as_ref()?;
        let pos = symbols.entries.partition_point(|e| e.address <= svma);
        let entry = symbols.entries.get(pos.checked_sub(1)?)?;
        let fde = || {
            fde_bounds(&self.elf, svma)
                .or_else(|| self.debug_elf.as_ref().and_then(|d| fde_bounds(d, svma)))
        };
        if !symbol_holds(entry.address, entry.size, svma, fde) {
            return None;
        }
        let file = if symbols.in_debug_file {
            self.debug_elf.as_ref()?
        } else {
            &self.elf
        };
        let name = symbol_name(file, symbols.dynamic, entry.index)?;
        Some((name, svma - entry.address))
    }

    pub(super) fn build_symbol_index(&self) -> SymbolIndex {
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
                    size: word(sym.st_size(endian)),
                    index: u32::try_from(index.0).ok()?,
                })
            })
            .collect();
        // Aliases share an address (malloc / __libc_malloc): put the preferred name first
        // and keep only it, with the largest size any of them states.
        entries.sort_unstable_by_key(|e| (e.address, alias_rank(file, dynamic, e.index)));
        entries.dedup_by(|later, kept| {
            let same = later.address == kept.address;
            if same {
                kept.size = kept.size.max(later.size);
            }
            same
        });
        entries.shrink_to_fit();
        SymbolIndex {
            in_debug_file,
            dynamic,
            entries,
        }
    }
}

/// Widens an ELF word (`u32` in ELF32, `u64` in ELF64) to an address.
pub(super) fn word<W: Into<u64>>(w: W) -> u64 {
    w.into()
}

pub(super) fn symbol_table(
    file: &Elf,
    dynamic: bool,
) -> &object::read::elf::SymbolTable<'static, Hdr> {
    if dynamic {
        file.elf_dynamic_symbol_table()
    } else {
        file.elf_symbol_table()
    }
}

pub(super) fn symbol_name(file: &Elf, dynamic: bool, index: u32) -> Option<&'static str> {
    let table = symbol_table(file, dynamic);
    let sym = table
        .symbol(object::SymbolIndex(usize::try_from(index).ok()?))
        .ok()?;
    let name = table.symbol_name(file.endian(), sym).ok()?;
    std::str::from_utf8(name).ok().filter(|n| !n.is_empty())
}

/// Lower is preferred: global over weak over local, then fewer leading underscores
/// (`malloc` over `__libc_malloc`), as gdb users would name the function.
pub(super) fn alias_rank(file: &Elf, dynamic: bool, index: u32) -> (u8, usize) {
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

/// gdb's name for the C++ function `name` without a linkage name, in the unit that holds
/// `svma` (see `cpp_names`).
fn cpp_name(ctx: &addr2line::Context<Slice>, svma: u64, name: &str) -> Option<String> {
    let unit = ctx.find_dwarf_and_unit(svma).skip_all_loads()?;
    super::cpp_names::with_parameters(unit, name)
}

/// Whether a unit's language is C++ (any of its standards).
fn is_cpp(language: Option<addr2line::gimli::DwLang>) -> bool {
    use addr2line::gimli::constants as c;
    [
        c::DW_LANG_C_plus_plus,
        c::DW_LANG_C_plus_plus_03,
        c::DW_LANG_C_plus_plus_11,
        c::DW_LANG_C_plus_plus_14,
    ]
    .iter()
    .any(|&l| language == Some(l))
}
