//! Finding a module's separate debug file (`/usr/lib/debug/.build-id/xx/yyyy.debug`, then
//! `.gnu_debuglink` beside the file, in `.debug/` or under `/usr/lib/debug/<dir>`) and its dwz
//! supplementary file (`.gnu_debugaltlink`).

use super::mapping::Mapping;
use super::types::Elf;
use object::Object as _;

/// Where `.gnu_debuglink` and `.build-id` debug files are installed by distributions.
const DEBUG_ROOT: &[u8] = b"/usr/lib/debug";

/// Looks for the separate debug file of `elf` by build id, then by `.gnu_debuglink`.
pub(super) fn find_debug_file(elf: &Elf, real_path: Option<&[u8]>) -> Option<Found> {
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
pub(super) fn find_sup_file(file: &Elf, file_path: Option<&[u8]>) -> Option<Found> {
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
pub(super) struct Found {
    pub(super) file: Elf,
    pub(super) map: Mapping,
    pub(super) path: Vec<u8>,
}

/// Maps and parses `path`, accepting it only when its build id matches `expected` (files
/// without a build id are given the benefit of the doubt).
pub(super) fn open_matching(path: &[u8], expected: Option<&[u8]>) -> Option<Found> {
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
pub(super) fn build_id_path(id: &[u8]) -> Vec<u8> {
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
pub(super) fn dir_of(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b".",
    }
}

/// `readlink` of a NUL-terminated path.
pub(super) fn read_link(path: &[u8]) -> Option<Vec<u8>> {
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
