//! The types of an opened target: the contract between its sources (`process`, `core_file`)
//! and what answers from them (the answers, the leak scan's roots, the `mem-trace` command).
//! A leaf: `target` re-exports them and its submodules fill them in; it imports none of them.

use crate::memory::Memory;
use std::path::PathBuf;

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

/// An opened target.
pub struct Target {
    pub(super) memory: Box<dyn Memory>,
    pub(super) header: u64,
    pub(super) modules: Vec<Module>,
    pub(super) mappings: Vec<Mapping>,
    pub(super) threads: Vec<ThreadState>,
    pub(super) name: String,
    pub(super) live: bool,
    pub(super) process: ProcessFacts,
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
