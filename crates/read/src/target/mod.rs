//! What a reader outside the traced process reads: a running process (never stopped) or a
//! core file, with the modules it had loaded, its mappings, its threads, and where its
//! `MEM_TRACE_HEADER` is.
//!
//! The types re-exported here (defined in `types`, a leaf every submodule imports) are the
//! contract between the target's sources (this module) and what answers from them (the
//! answers, the leak scan's roots, the `mem-trace` command).
//!
//! - `process`: a running process (`/proc/PID/maps` parsed by `maps`), read with
//!   `process_vm_readv` and never stopped;
//! - `core_file`: an ELF core file (its notes decoded by `core_notes`) as memory;
//! - `modules`: the ELF modules among the mappings, their bias, the files to read them from
//!   (checked against the build id in memory) and `MEM_TRACE_HEADER`;
//! - [`Symbols`]: return addresses to frames over the target's modules;
//! - [`TargetError`]: every way opening fails, each one line saying what to do.

mod core_file;
mod core_notes;
mod errors;
mod maps;
mod modules;
mod process;
mod symbols;
mod types;

pub(crate) use core_file::regular_file;
pub use errors::{ptrace_scope, scope_advice, TargetError};
pub use maps::process_mappings;
pub use symbols::Symbols;
pub use types::{Mapping, Module, Target, ThreadState};

use crate::layout::Tables;
use crate::memory::Memory;
use std::path::PathBuf;

/// Which target to open, as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A running process, read with `process_vm_readv` and never stopped.
    Pid(i32),
    /// A core file; `exe` is the executable when the core's own notes do not name it.
    Core {
        /// The core file.
        core: PathBuf,
        /// The executable that dumped it (`--exe`).
        exe: Option<PathBuf>,
    },
}

/// The executable that dumped the core file `core`, as its notes name it: the one
/// [`Target::open`] reads a core's symbols from when given no `--exe`, for a caller that
/// needs the executable but not the tables (`mem-trace gdb CORE`). An error, saying to pass
/// `--exe`, when the notes do not tell.
pub fn core_executable(core: &std::path::Path) -> Result<PathBuf, TargetError> {
    core_file::executable_of(core)
}

impl Target {
    /// Opens `source`, locates its header and checks the header's magic and version.
    pub fn open(source: &Source) -> Result<Target, TargetError> {
        let target = match source {
            Source::Pid(pid) => process::open(*pid)?,
            Source::Core { core, exe } => core_file::open(core, exe.as_deref())?,
        };
        Tables::open(target.memory(), target.header)?;
        Ok(target)
    }

    /// Its tables: the header checked, and its mappings given for the tagged blocks'
    /// scans ([`Tables::with_regions`]).
    pub fn tables(&self) -> Result<Tables<'_, dyn Memory + '_>, crate::layout::Error> {
        Ok(Tables::open(self.memory(), self.header)?
            .with_regions(crate::layout::tags::regions(&self.mappings)))
    }
}
