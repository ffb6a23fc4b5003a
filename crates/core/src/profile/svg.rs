//! A report's flame graph: `X.svg` drawn from the report's `X.folded` by the `mem-trace`
//! binary that sits beside the library (`mem-trace flamegraph --from-folded X.folded -o X.svg`),
//! run as a child process the program cannot see.
//!
//! The drawing is not done here: the renderer (`inferno`) is a command-line dependency, run in
//! a child the program cannot see (`unseen`). If the binary is not there, the `.folded` file
//! stays and one note on stderr says how to draw it later.

use crate::out::Out;
use crate::profile::output::PathBuf;
use crate::profile::unseen::{self, Binary, Reads};
use core::ffi::CStr;
use core::fmt::Write;

/// Draws `svg` from `folded`, whose counts are `by` (`live`, `allocated`, `blocks`), under
/// `title`. Returns whether the SVG was drawn.
pub(crate) fn draw(folded: &PathBuf, svg: &PathBuf, by: &CStr, title: &PathBuf) -> bool {
    let binary = match unseen::binary() {
        Binary::There(path) => path,
        Binary::Missing(path) => {
            unseen::say_missing(&path, super::pprof::wanted());
            return false;
        }
        Binary::Unknown => return false,
    };
    let argv: [*const libc::c_char; 11] = [
        binary.as_c(),
        c"flamegraph".as_ptr(),
        c"--from-folded".as_ptr(),
        folded.as_c(),
        c"-o".as_ptr(),
        svg.as_c(),
        c"--by".as_ptr(),
        by.as_ptr(),
        c"--title".as_ptr(),
        title.as_c(),
        core::ptr::null(),
    ];
    let Some(why) = unseen::run(&argv, Reads::Files).why else {
        return true;
    };
    let _ = writeln!(
        Out::stderr(),
        "mem-trace: no flame graph {}: {why}",
        svg.as_str()
    );
    false
}
