//! Whether the nearest symbol at or below an address names the function that holds it.
//!
//! A stripped file keeps only `.dynsym`, the exported functions: the nearest one below an
//! address inside a static function can end kilobytes earlier (Debian's sqlite3 named frames
//! `sqlite3ApiExit+212`, an 18-byte function). A symbol therefore names an address only
//! within its `st_size`; a symbol without a size (assembly, some linker-made symbols) names
//! it only when the call-frame information (`.eh_frame`, else `.debug_frame`) has a function
//! holding the address that starts at the symbol. Anything else is left unnamed, for the
//! caller to spell as `module+0xoffset`.

use super::types::{Elf, Slice};
use addr2line::gimli::{
    self, BaseAddresses, DebugFrame, EhFrame, EhFrameHdr, RunTimeEndian, UnwindSection as _,
};
use object::{Object as _, ObjectSection as _};

/// Whether the function symbol at `start` with size `size` holds `svma`, given the bounds
/// `(start, length)` of the call-frame-information function that holds `svma`, asked for
/// only when the symbol has no size.
pub(super) fn symbol_holds(
    start: u64,
    size: u64,
    svma: u64,
    fde_bounds: impl FnOnce() -> Option<(u64, u64)>,
) -> bool {
    if svma < start {
        return false;
    }
    if size != 0 {
        return svma - start < size;
    }
    // No size: the symbol is the function only if the unwind tables agree where the
    // function holding the address begins.
    fde_bounds().is_some_and(|(fde_start, _)| fde_start == start)
}

/// The `(start, length)` of the function whose FDE holds `svma` (a stated address) in `elf`:
/// by `.eh_frame_hdr`'s binary search table when there is one, else by a scan of
/// `.eh_frame`, else of `.debug_frame`. `None` when no FDE holds it or the tables are
/// malformed.
pub(super) fn fde_bounds(elf: &Elf, svma: u64) -> Option<(u64, u64)> {
    let endian = if elf.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let section = |name: &str| {
        let s = elf.section_by_name(name)?;
        Some((s.address(), s.data().ok()?))
    };
    let address_size = if elf.is_64() { 8 } else { 4 };
    let text = elf.section_by_name(".text").map_or(0, |s| s.address());
    let bounds = |fde: gimli::FrameDescriptionEntry<Slice>| (fde.initial_address(), fde.len());
    if let Some((eh_addr, eh_data)) = section(".eh_frame") {
        let mut eh = EhFrame::new(eh_data, endian);
        eh.set_address_size(address_size);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(eh_addr)
            .set_text(text);
        if let Some((hdr_addr, hdr_data)) = section(".eh_frame_hdr") {
            bases = bases.set_eh_frame_hdr(hdr_addr);
            let parsed = EhFrameHdr::new(hdr_data, endian).parse(&bases, address_size);
            if let Some(table) = parsed.as_ref().ok().and_then(|p| p.table()) {
                return table
                    .fde_for_address(&eh, &bases, svma, EhFrame::cie_from_offset)
                    .ok()
                    .map(bounds);
            }
        }
        return eh
            .fde_for_address(&bases, svma, EhFrame::cie_from_offset)
            .ok()
            .map(bounds);
    }
    let (_, data) = section(".debug_frame")?;
    let mut debug = DebugFrame::new(data, endian);
    debug.set_address_size(address_size);
    debug
        .fde_for_address(&BaseAddresses::default(), svma, DebugFrame::cie_from_offset)
        .ok()
        .map(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sized_symbol_holds_only_its_own_bytes() {
        let no_fde = || panic!("a sized symbol needs no unwind tables");
        assert!(symbol_holds(0x1000, 0x12, 0x1000, no_fde));
        assert!(symbol_holds(0x1000, 0x12, 0x1011, no_fde));
        // One past the end, and far past it (sqlite3ApiExit+212 on an 18-byte function).
        assert!(!symbol_holds(0x1000, 0x12, 0x1012, no_fde));
        assert!(!symbol_holds(0x1000, 0x12, 0x1000 + 212, no_fde));
        assert!(!symbol_holds(0x1000, 0x12, 0xfff, no_fde));
    }

    #[test]
    fn a_sizeless_symbol_needs_an_fde_that_starts_at_it() {
        assert!(symbol_holds(0x2000, 0, 0x2040, || Some((0x2000, 0x80))));
        // The FDE holding the address is another function: a static one the table lacks.
        assert!(!symbol_holds(0x2000, 0, 0x2140, || Some((0x2100, 0x80))));
        // No FDE holds it: nothing says how far the symbol reaches.
        assert!(!symbol_holds(0x2000, 0, 0x2040, || None));
    }
}
