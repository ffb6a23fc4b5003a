//! A running process as a target: read with `process_vm_readv`, never stopped, never
//! attached to. Its mappings come from `/proc/PID/maps`, its threads from `/proc/PID/task/`.
//!
//! Module files are opened by the path the maps name. A file deleted or replaced since it
//! was loaded (an upgrade while the program runs) is read through
//! `/proc/PID/map_files/START-END` instead, which opens the file as it was mapped but needs
//! `CAP_SYS_ADMIN` (root); without it such a module has no file, and its frames are shown as
//! raw addresses ([`SymError::FileChanged`](crate::symbolize::SymError::FileChanged)).

use super::errors::TargetError;
use super::maps::{self, DELETED};
use super::modules::{self, Policy};
use super::types::{ProcessFacts, Target, ThreadState};
use crate::memory::Process;
use std::path::PathBuf;

/// Opens the running process `pid`.
pub(super) fn open(pid: i32) -> Result<Target, TargetError> {
    if pid <= 0 {
        return Err(TargetError::NoSuchProcess(pid));
    }
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let refused = |path: PathBuf, e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOENT | libc::ESRCH) => TargetError::NoSuchProcess(pid),
        Some(libc::EACCES | libc::EPERM) => TargetError::permission_denied(pid),
        _ => TargetError::io(path, e),
    };
    let maps_path = proc.join("maps");
    let text = std::fs::read_to_string(&maps_path).map_err(|e| refused(maps_path, e))?;
    let mappings = maps::parse(&text);
    let memory = Process::new(pid);
    // Reading /proc/PID/maps needs less than reading memory (Yama's ptrace_scope only
    // restricts the latter): ask the kernel once, so a refusal is named as such rather than
    // showing up later as unreadable tables.
    if let Some(m) = mappings.iter().find(|m| m.read) {
        match memory.probe(m.start) {
            Err(libc::EPERM | libc::EACCES) => return Err(TargetError::permission_denied(pid)),
            Err(libc::ESRCH) => return Err(TargetError::NoSuchProcess(pid)),
            _ => {}
        }
    }
    let comm = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
    let name = format!("process {pid} ({})", comm.trim_end());
    let found = modules::find(&memory, &memory, &mappings);
    let candidates = |l: &modules::Loaded| {
        let named = l.module.path.to_string_lossy();
        let mut files = Vec::new();
        if !named.ends_with(DELETED) {
            files.push(l.module.path.clone());
        }
        let (start, end) = l.first;
        files.push(proc.join(format!("map_files/{start:x}-{end:x}")));
        files
    };
    let mut resolved = modules::resolve(found, candidates, Policy::Lenient)?;
    Ok(Target {
        header: resolved.header(&name, &memory)?,
        modules: resolved.modules,
        threads: threads(&proc),
        mappings,
        name,
        live: true,
        process: ProcessFacts {
            pid: Some(pid),
            executable: std::fs::read_link(proc.join("exe")).ok(),
            command: std::fs::read(proc.join("cmdline")).ok().map(|words| {
                let words: Vec<String> = words
                    .split(|&b| b == 0)
                    .filter(|w| !w.is_empty())
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect();
                words.join(" ")
            }),
        },
        memory: Box::new(memory),
    })
}

/// The process's threads by id, from `/proc/PID/task/`; empty when it cannot be listed.
fn threads(proc: &std::path::Path) -> Vec<ThreadState> {
    let mut tids: Vec<u32> = std::fs::read_dir(proc.join("task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids.into_iter()
        .map(|tid| ThreadState {
            tid,
            sp: None,
            registers: Vec::new(),
        })
        .collect()
}
