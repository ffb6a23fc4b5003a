//! `dlclose`: after an unload the unwinder must forget the module.

use crate::next;
use core::ffi::{c_int, c_void};
use mem_trace_core::capture::modules;
use mem_trace_core::guard::Guard;

#[cfg_attr(not(test), no_mangle)]
/// `dlclose(3)`: after an unload the unwinder must forget the module before another library
/// can be mapped at the same addresses.
///
/// # Safety
/// As for glibc's `dlclose`.
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let real = {
        let _g = Guard::enter();
        next::DLCLOSE.get()
    };
    if real == 0 {
        return -1;
    }
    // SAFETY: glibc's dlclose, found with RTLD_NEXT.
    let f: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { core::mem::transmute(real) };
    // SAFETY: forwarded contract.
    let rc = unsafe { f(handle) };
    modules::invalidate();
    rc
}
