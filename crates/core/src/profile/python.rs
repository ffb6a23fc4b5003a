//! CPython's own small-object allocator (pymalloc) serves objects of up to 512 bytes from
//! arenas it maps itself, without `malloc`: unless `PYTHONMALLOC=malloc`, most of a Python
//! program's objects are invisible to the tracer (a dict-building script peaked at 12 MB in
//! the reports against 162 MB with the variable set). The figures are not wrong, but they are
//! not the program's whole heap, and the user must be told: one line in every report, with
//! the fix, and one at start where the reports go to stderr. Nowhere else: a program that
//! reads its own or its children's stderr (CPython's test_subprocess compares a child's with
//! what it wrote: 35 of its tests failed) must find nothing of ours there unless reports
//! were asked for on it. `mem-trace run` sets the variable itself.

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Whether this process is a CPython whose small objects bypass `malloc`.
static BYPASSED: AtomicBool = AtomicBool::new(false);
/// Whether this process is a CPython.
static CPYTHON: AtomicBool = AtomicBool::new(false);

/// Whether this process is a CPython (known once the constructor has run).
pub(crate) fn is_cpython() -> bool {
    CPYTHON.load(Relaxed)
}

/// The line, as stderr and every report print it.
pub(crate) const LINE: &str = "mem-trace: this is CPython with its own small-object allocator (pymalloc): objects of up to 512 bytes bypass malloc and are missing from these figures; run with PYTHONMALLOC=malloc (mem-trace run sets it) to count them";

/// At start-up, once the program's libraries are loaded: notes whether this is such a
/// CPython, and says so on stderr when the reports go there.
pub(crate) fn check() {
    // `_PyRuntime` is defined by every CPython 3.7+, in the executable or libpython. It is
    // looked up only where it can be found: a failed `dlsym` at start-up cost every later
    // allocation (churn in profile mode went from 1.51x to 1.90x a plain run, for a lookup of
    // a symbol the program did not have), for reasons in glibc not understood here.
    if !maybe_python() {
        return;
    }
    // SAFETY: a NUL-terminated name; dlsym takes the loader's lock, which start-up may take.
    let python = !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_PyRuntime".as_ptr()) }.is_null();
    if !python {
        return;
    }
    CPYTHON.store(true, Relaxed);
    // SAFETY: a NUL-terminated name; start-up runs before the program can change the
    // environment from another thread.
    let value = unsafe { libc::getenv(c"PYTHONMALLOC".as_ptr()) };
    let value = (!value.is_null()).then(|| {
        // SAFETY: getenv returned a NUL-terminated string, which stays while we read it.
        unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes()
    });
    if !bypassed(value) {
        return;
    }
    BYPASSED.store(true, Relaxed);
    if !crate::config::REPORTS.load(Relaxed) || crate::config::OUT_DIR.get().is_some() {
        return;
    }
    let mut line = [0u8; LINE.len() + 1];
    line[..LINE.len()].copy_from_slice(LINE.as_bytes());
    line[LINE.len()] = b'\n';
    crate::out::note(&line);
}

/// Whether the executable's name begins with `python`, or a loaded module's path names
/// `libpython`: the only processes where `_PyRuntime` is looked up.
fn maybe_python() -> bool {
    let mut exe = [0u8; 4096];
    // SAFETY: readlink writes at most `exe.len()` bytes into our buffer.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            exe.as_mut_ptr().cast(),
            exe.len(),
        )
    };
    if n > 0 {
        let path = &exe[..n as usize];
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        if name.starts_with(b"python") {
            return true;
        }
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        found: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `info` is valid for the call; its name is NUL-terminated or null.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: as above.
        let name = unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes();
        if name.windows(9).any(|w| w == b"libpython") {
            // SAFETY: `found` is the bool handed to dl_iterate_phdr below.
            unsafe { *(found as *mut bool) = true };
            return 1;
        }
        0
    }
    let mut found = false;
    // SAFETY: the callback only reads the loader's records and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut bool as *mut libc::c_void) };
    found
}

/// Whether a `PYTHONMALLOC` value leaves small objects to pymalloc: unset, empty, `pymalloc`,
/// `debug`, `pymalloc_debug`, or a value CPython does not know (it then refuses to start, so
/// nothing is lost saying so). Only `malloc` and `malloc_debug` send every object to `malloc`.
fn bypassed(value: Option<&[u8]>) -> bool {
    !matches!(value, Some(b"malloc" | b"malloc_debug"))
}

/// Whether reports carry [`LINE`].
pub(crate) fn bypassed_here() -> bool {
    BYPASSED.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::bypassed;

    #[test]
    fn only_malloc_values_send_every_object_to_malloc() {
        for v in ["malloc", "malloc_debug"] {
            assert!(!bypassed(Some(v.as_bytes())), "{v}");
        }
        assert!(bypassed(None));
        for v in ["", "pymalloc", "debug", "pymalloc_debug", "default"] {
            assert!(bypassed(Some(v.as_bytes())), "{v}");
        }
    }
}
