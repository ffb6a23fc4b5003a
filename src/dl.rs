//! glibc's loader functions the `libc` crate does not declare, with the request numbers this
//! library uses (`<dlfcn.h>`).

use core::ffi::{c_int, c_void};

/// `dladdr1`'s request for the symbol's table entry (`ElfW(Sym) *`).
pub const RTLD_DL_SYMENT: c_int = 1;
/// `dladdr1`'s request for the module's `struct link_map`.
pub const RTLD_DL_LINKMAP: c_int = 2;
/// `dlinfo` requests: the search path, and its size.
pub const RTLD_DI_SERINFO: c_int = 4;
pub const RTLD_DI_SERINFOSIZE: c_int = 5;

extern "C" {
    /// `dladdr`, and in `extra` what `flags` asks for.
    pub fn dladdr1(
        addr: *const c_void,
        info: *mut libc::Dl_info,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
    /// Facts about the module `handle`.
    pub fn dlinfo(handle: *mut c_void, request: c_int, arg: *mut c_void) -> c_int;
}
