//! The DWARF sections a module carries (compressed or not), loaded for addr2line.

use super::types::{Elf, Slice};
use addr2line::gimli;
use object::{Object as _, ObjectSection as _};
use std::borrow::Cow;

pub(super) fn has_dwarf(file: &Elf) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

/// The DWARF sections addr2line reads.
pub(super) const DWARF_SECTIONS: [gimli::SectionId; 10] = [
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
pub(super) fn decompressed_size(file: &Elf) -> u64 {
    DWARF_SECTIONS
        .iter()
        .filter_map(|id| file.section_by_name(id.name()))
        .filter_map(|section| section.compressed_file_range().ok())
        .filter(|range| range.format != object::CompressionFormat::None)
        .fold(0, |sum, range| sum.saturating_add(range.uncompressed_size))
}

/// Builds the DWARF sections addr2line reads; the rest stay empty so that they are
/// neither decompressed nor kept.
pub(super) fn load_dwarf(file: &Elf, decompressed: &mut Vec<Vec<u8>>) -> gimli::Dwarf<Slice> {
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
