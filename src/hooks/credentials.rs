//! `setuid`, `setgroups` and the rest: glibc makes every thread of the process repeat the
//! change and aborts if one fails, so the profiler's thread is not there while they run (see
//! `mem_trace_core::profile::changing_credentials`).
//!
//! Calls glibc makes itself (`initgroups`'s `setgroups`) do not come through here; `initgroups`
//! does.

use crate::next::Next;
use core::ffi::{c_char, c_int};
use mem_trace_core::guard::Guard;
use mem_trace_core::profile;

/// Defines the exported hook `$name($arg: $ty, ...) -> c_int`, which calls glibc's with the
/// profiler's thread stopped; -1 with `ENOSYS` if there is none.
macro_rules! credential_hook {
    ($name:ident ( $($arg:ident : $ty:ty),* )) => {
        #[cfg_attr(not(test), no_mangle)]
        #[doc = concat!("`", stringify!($name), "`, as glibc's, with no thread of the tracer's.")]
        ///
        /// # Safety
        #[doc = concat!("As for glibc's `", stringify!($name), "`.")]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static REAL: Next = Next::new(
                match core::ffi::CStr::from_bytes_with_nul(
                    concat!(stringify!($name), "\0").as_bytes(),
                ) {
                    Ok(name) => name,
                    Err(_) => panic!("a function name has no NUL inside"),
                },
            );
            let real = {
                let _g = Guard::enter();
                REAL.get()
            };
            if real == 0 {
                // SAFETY: __errno_location returns this thread's errno.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return -1;
            }
            type Real = unsafe extern "C" fn($($ty),*) -> c_int;
            // SAFETY: glibc's function of that name, found with RTLD_NEXT, of this signature.
            let real: Real = unsafe { core::mem::transmute(real) };
            profile::changing_credentials(|| {
                // SAFETY: forwarded contract.
                unsafe { real($($arg),*) }
            })
        }
    };
}

credential_hook!(setuid(uid: libc::uid_t));
credential_hook!(setgid(gid: libc::gid_t));
credential_hook!(seteuid(uid: libc::uid_t));
credential_hook!(setegid(gid: libc::gid_t));
credential_hook!(setreuid(ruid: libc::uid_t, euid: libc::uid_t));
credential_hook!(setregid(rgid: libc::gid_t, egid: libc::gid_t));
credential_hook!(setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t));
credential_hook!(setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t));
credential_hook!(setgroups(size: libc::size_t, list: *const libc::gid_t));
credential_hook!(initgroups(user: *const c_char, group: libc::gid_t));
