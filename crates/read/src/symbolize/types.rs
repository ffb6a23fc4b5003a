//! The types every part of symbolization shares: the ELF and DWARF reader types, and what a
//! lookup yields ([`SymFrame`]) or fails with ([`SymError`]). A leaf: `symbolize` and each of
//! its submodules import it, and it imports none of them.

use addr2line::gimli;
use std::fmt;

/// The DWARF reader: slices into our own mappings (or decompressed copies), which the
/// owning `loaded::Loaded` keeps alive for as long as anything borrows them.
pub(super) type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// ELF header of the process's own class and byte order; other files fail to parse, which
/// is right because such a file cannot have been loaded into this process.
#[cfg(target_pointer_width = "64")]
pub(super) type Hdr = object::elf::FileHeader64<object::NativeEndian>;
#[cfg(target_pointer_width = "32")]
pub(super) type Hdr = object::elf::FileHeader32<object::NativeEndian>;
pub(super) type Elf = object::read::elf::ElfFile<'static, Hdr>;

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
    /// The module's file was deleted or replaced since it was loaded, and the file as loaded
    /// cannot be opened (a reader outside the process: see `target::Symbols`).
    FileChanged,
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
            SymError::FileChanged => {
                f.write_str("module file deleted or replaced since it was loaded")
            }
        }
    }
}

impl std::error::Error for SymError {}
