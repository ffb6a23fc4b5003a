//! `dlopen` in an attached process: the module it loads gets its GOT entries pointed at the
//! hooks, as every module had at the attach, and the caller's own search path still finds
//! it.
//!
//! Under the preload nothing of this is needed (a new module binds `malloc` to the hook by
//! symbol lookup), so this hook is not exported: an attach puts it in the modules' GOTs
//! (`local::redirected`). glibc's `dlopen` searches a bare name (no `/`) along the path of the
//! *calling* module, found from its return address: that module's `DT_RPATH` or `DT_RUNPATH`
//! with `$ORIGIN` its own directory. Called from here, it would search ours, and a program
//! whose plugins sit in `$ORIGIN/plugins` would find none (memray's #212). So the caller's
//! search path is asked of glibc (`dlinfo(RTLD_DI_SERINFO)` on the caller's module) and each
//! directory that it has and this library has not (its RPATH, LD_LIBRARY_PATH, its RUNPATH,
//! in glibc's order) is tried with a full path first; what is left (ld.so.cache and the
//! default directories) does not depend on the caller. A name holding `$ORIGIN`, which glibc
//! expands to the caller's directory, is expanded here against the caller's.

use core::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::dl::{dladdr1, dlinfo, RTLD_DI_SERINFO, RTLD_DI_SERINFOSIZE, RTLD_DL_LINKMAP};

/// glibc's `Dl_serpath`.
#[repr(C)]
struct SerPath {
    name: *const c_char,
    flags: c_uint,
}

/// glibc's `Dl_serinfo`, its array of [`SerPath`] following.
#[repr(C)]
struct SerInfo {
    size: usize,
    count: c_uint,
}

/// The hook, with the caller's return address (`local`'s naked entry reads it).
///
/// # Safety
/// As for glibc's `dlopen`.
pub unsafe extern "C" fn dlopen_from(
    name: *const c_char,
    mode: c_int,
    caller: usize,
) -> *mut c_void {
    // SAFETY: forwarded contract.
    let handle = unsafe { open(name, mode, caller) };
    if !handle.is_null() && crate::attach::attached() {
        crate::attach::patch_new_modules();
    }
    handle
}

/// glibc's `dlopen` of `name` as called from `caller`'s module.
unsafe fn open(name: *const c_char, mode: c_int, caller: usize) -> *mut c_void {
    // SAFETY: forwarded contract.
    let plain = || unsafe { libc::dlopen(name, mode) };
    if name.is_null() {
        return plain();
    }
    // SAFETY: the caller passes a NUL-terminated name.
    let bare = unsafe { CStr::from_ptr(name) }.to_bytes();
    if let Some(mut path) = with_origin(bare, caller as *const c_void) {
        path.push(0);
        // SAFETY: a NUL-terminated path.
        return unsafe { libc::dlopen(path.as_ptr().cast(), mode) };
    }
    if bare.contains(&b'/') || bare.is_empty() {
        return plain();
    }
    // Already loaded (by name or soname): found without a search.
    // SAFETY: as above.
    if !unsafe { libc::dlopen(name, mode | libc::RTLD_NOLOAD) }.is_null() {
        // The NOLOAD handle took a reference: the one returned below is the caller's.
        // SAFETY: as above.
        let handle = plain();
        // SAFETY: dropping the reference the probe took.
        unsafe { libc::dlclose(handle) };
        return handle;
    }
    let theirs = search_path(caller as *const c_void);
    let ours = search_path(dlopen_from as *const c_void);
    // What both share at the end (LD_LIBRARY_PATH may be there too, the defaults always)
    // the plain call searches in the same order.
    let shared = theirs
        .iter()
        .rev()
        .zip(ours.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    for dir in &theirs[..theirs.len() - shared] {
        let mut path = dir.clone();
        path.push(b'/');
        path.extend_from_slice(bare);
        path.push(0);
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::access(path.as_ptr().cast(), libc::F_OK) } != 0 {
            continue;
        }
        // SAFETY: as above; a file glibc cannot load there makes it search on, as we do.
        let handle = unsafe { libc::dlopen(path.as_ptr().cast(), mode) };
        if !handle.is_null() {
            return handle;
        }
    }
    plain()
}

/// `name` with each `$ORIGIN` / `${ORIGIN}` replaced by the directory of the module holding
/// `addr`, as glibc would for that caller; `None` when it holds none (or the module's file
/// is not found: glibc then gets the name as it is).
fn with_origin(name: &[u8], addr: *const c_void) -> Option<Vec<u8>> {
    const TOKENS: [&[u8]; 2] = [b"${ORIGIN}", b"$ORIGIN"];
    // A token only when what follows cannot continue a name (glibc's is_dst).
    let token_at = |i: usize| {
        TOKENS.iter().find(|t| {
            name[i..].starts_with(t)
                && (t[1] == b'{'
                    || name
                        .get(i + t.len())
                        .is_none_or(|&c| !(c.is_ascii_alphanumeric() || c == b'_')))
        })
    };
    if !(0..name.len()).any(|i| token_at(i).is_some()) {
        return None;
    }
    let origin = origin_of(addr)?;
    let mut out = Vec::with_capacity(name.len() + origin.len());
    let mut i = 0;
    while i < name.len() {
        match token_at(i) {
            Some(t) => {
                out.extend_from_slice(&origin);
                i += t.len();
            }
            None => {
                out.push(name[i]);
                i += 1;
            }
        }
    }
    Some(out)
}

/// The directory of the file of the module holding `addr`, symbolic links resolved (glibc's
/// `l_origin`): the program's from /proc/self/exe.
fn origin_of(addr: *const c_void) -> Option<Vec<u8>> {
    // SAFETY: an all-zero Dl_info is a valid buffer.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr writes the info.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated name from glibc.
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    let file = if file.to_bytes().is_empty() || !file.to_bytes().contains(&b'/') {
        c"/proc/self/exe"
    } else {
        file
    };
    let mut buf = [0u8; libc::PATH_MAX as usize];
    // SAFETY: realpath writes at most PATH_MAX bytes into `buf` (no allocation with a buffer).
    if unsafe { libc::realpath(file.as_ptr(), buf.as_mut_ptr().cast()) }.is_null() {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0)?;
    let slash = buf[..len].iter().rposition(|&b| b == b'/')?;
    Some(buf[..slash.max(1)].to_vec())
}

/// The directories glibc searches for a bare name `dlopen`ed from the module holding
/// `addr`, in order, `$ORIGIN` expanded; empty if that module is not found.
fn search_path(addr: *const c_void) -> Vec<Vec<u8>> {
    // SAFETY: an all-zero Dl_info is a valid buffer.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: dladdr1 writes the info and the link map pointer.
    if unsafe { dladdr1(addr, &mut info, &mut map, RTLD_DL_LINKMAP) } == 0 || map.is_null() {
        return Vec::new();
    }
    let mut size = SerInfo { size: 0, count: 0 };
    // SAFETY: a link_map is a handle for dlinfo; SERINFOSIZE fills the two counts.
    if unsafe { dlinfo(map, RTLD_DI_SERINFOSIZE, (&raw mut size).cast()) } != 0 {
        return Vec::new();
    }
    // u64 words: the structure's alignment.
    let mut buf = vec![0u64; size.size.div_ceil(8)];
    let head = buf.as_mut_ptr().cast::<SerInfo>();
    // SAFETY: `buf` holds `size.size` bytes; glibc wants the counts filled in first.
    unsafe {
        (*head).size = size.size;
        (*head).count = size.count;
    }
    // SAFETY: as above, with a buffer of the size glibc asked for.
    if unsafe { dlinfo(map, RTLD_DI_SERINFO, head.cast()) } != 0 {
        return Vec::new();
    }
    // SAFETY: glibc wrote `count` entries after the header, each name NUL-terminated inside
    // the buffer.
    unsafe {
        let count = (*head).count as usize;
        let paths = head.add(1).cast::<SerPath>();
        (0..count)
            .map(|i| CStr::from_ptr((*paths.add(i)).name).to_bytes().to_vec())
            .collect()
    }
}
