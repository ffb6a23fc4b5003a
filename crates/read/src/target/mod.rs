//! What a reader outside the traced process reads: a running process (never stopped) or a
//! core file, with the modules it had loaded, its mappings, its threads, and where its
//! `MEM_TRACE_HEADER` is.
//!
//! The types here are the contract between the target's sources (this module) and what
//! answers from them (the answers, the leak scan's roots, the `mem-trace` command).
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

pub use errors::{ptrace_scope, scope_advice, TargetError};
pub use symbols::Symbols;

/// The mappings of running process `pid`, from `/proc/PID/maps`, by start address; `None`
/// when they cannot be read.
pub fn process_mappings(pid: i32) -> Option<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(maps::parse(&text))
}

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

/// One loaded ELF module (executable or shared object) of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The file it was loaded from, as the target names it.
    pub path: PathBuf,
    /// First address of its mappings.
    pub start: u64,
    /// One past its last mapped address.
    pub end: u64,
    /// Load bias: address in the target = address stated in the file + `bias`.
    pub bias: u64,
    /// The file its symbols are read from: `path` itself, the executable given with `--exe`,
    /// or `/proc/PID/map_files/..` for a file deleted or replaced since it was loaded. `None`
    /// when the file on disk is known to differ from what was loaded and the loaded one
    /// cannot be opened.
    pub file: Option<PathBuf>,
}

/// One mapping of the target's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
    /// Offset in the mapped file (0 for anonymous memory).
    pub offset: u64,
    /// The mapped file, or the kernel's pseudo name (`[stack]`, `[heap]`, ...); empty for
    /// anonymous memory.
    pub name: String,
}

/// One thread of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// Kernel thread id.
    pub tid: u32,
    /// Its stack pointer, when known (a core's `NT_PRSTATUS`; not for a running process,
    /// which is never stopped to ask).
    pub sp: Option<u64>,
    /// Its general registers as words (`NT_PRSTATUS`), empty when unknown.
    pub registers: Vec<u64>,
}

/// The executable that dumped the core file `core`, as its notes name it: the one
/// [`Target::open`] reads a core's symbols from when given no `--exe`, for a caller that
/// needs the executable but not the tables (`mem-trace gdb CORE`). An error, saying to pass
/// `--exe`, when the notes do not tell.
pub fn core_executable(core: &std::path::Path) -> Result<PathBuf, TargetError> {
    core_file::executable_of(core)
}

/// An opened target.
pub struct Target {
    memory: Box<dyn Memory>,
    header: u64,
    modules: Vec<Module>,
    mappings: Vec<Mapping>,
    threads: Vec<ThreadState>,
    name: String,
    live: bool,
    process: ProcessFacts,
}

/// What is known of the process itself, to name it in outputs (DHAT's `cmd` and `pid`) and to
/// tell its executable from its libraries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcessFacts {
    /// Its pid (a core's: its first thread's, the main thread).
    pub(crate) pid: Option<i32>,
    /// The path of its executable, as the target names it (a module's `path`).
    pub(crate) executable: Option<PathBuf>,
    /// Its command line, words joined by spaces (a core's is cut to 79 bytes by the kernel).
    pub(crate) command: Option<String>,
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

    /// Its memory.
    pub fn memory(&self) -> &dyn Memory {
        &*self.memory
    }

    /// The address of `MEM_TRACE_HEADER`.
    pub fn header(&self) -> u64 {
        self.header
    }

    /// The loaded modules, by start address.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// The module whose mappings contain `addr`.
    pub fn module_of(&self, addr: u64) -> Option<&Module> {
        self.modules
            .iter()
            .find(|m| m.start <= addr && addr < m.end)
    }

    /// The mappings, by start address.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The threads: every thread of a core with its registers; a running process's threads
    /// without them.
    pub fn threads(&self) -> &[ThreadState] {
        &self.threads
    }

    /// How to name it in a message: `process 1234 (prog)`, `core file core.1234 (prog)`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pid, when known.
    pub fn pid(&self) -> Option<i32> {
        self.process.pid
    }

    /// Its command line, when known.
    pub fn command(&self) -> Option<&str> {
        self.process.command.as_deref()
    }

    /// Whether `module` is the executable rather than a shared object.
    pub fn is_executable(&self, module: &Module) -> bool {
        self.process.executable.as_ref() == Some(&module.path)
    }

    /// The threads of a running process as a reader that stopped it found them (stack
    /// pointers and registers): its leak scan then reads each stack from its stack pointer
    /// and takes the registers as roots, as for a core.
    pub fn set_stopped_threads(&mut self, threads: Vec<ThreadState>) {
        self.threads = threads;
    }

    /// A running process (answers may change between two reads) rather than a core.
    pub fn is_live(&self) -> bool {
        self.live
    }
}

/// The file at `path` opened for reading if it is a regular file. A path from a core's notes
/// names whatever was mapped then and may be anything by now: opening a FIFO without a writer
/// would wait forever (hence `O_NONBLOCK`, which regular files ignore), and a device's reads
/// could too.
pub(crate) fn regular_file(path: &std::path::Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}
