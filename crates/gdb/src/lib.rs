//! The reader gdb's `mtrace-*` commands answer through: `mem_trace_read`, the same decoder,
//! leak scan, symbolizer and wording as the `mem-trace` command's, built as a Python extension
//! module that the gdb package (`python/mem_trace_gdb`) loads into gdb's own process.
//!
//! Inside gdb's process because gdb is the inferior's tracer: reading its memory from there
//! is allowed where a separate process started by gdb would be refused (Yama's
//! `ptrace_scope=1`). The gdb package keeps only gdb's part: the expression evaluated to an
//! address, which target gdb has (a process or a core and its executable), gdb's thread
//! numbers and registers, and errors as `gdb.GdbError` lines.
//!
//! Every function takes the target as `("process", pid)` or `("core", core, executable)`,
//! opens it, answers, and returns `(lines, hint)`: the answer's lines and the advice on
//! debug information when most frames had no names (empty otherwise). A failure raises
//! [`Error`] with one line.

use mem_trace_read::answer::profile::By;
use mem_trace_read::answer::{
    self, Answered, Asked, HistoryOptions, LeakTarget, LeaksOptions, PeaksOptions, TopOptions,
    WhyOptions,
};
use mem_trace_read::layout;
use mem_trace_read::target::{Source, Target, TargetError, ThreadState};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

create_exception!(
    mem_trace_reader,
    Error,
    PyException,
    "A reader's failure, one line saying what to do."
);

/// What a function returns: the answer's lines, and the debug-information hint.
type Reply = (Vec<String>, String);

/// The target as the gdb package names it.
#[derive(FromPyObject)]
enum Named {
    /// `("process", pid)`: a live process gdb holds stopped.
    Process(String, i32),
    /// `("core", core, executable)`.
    Core(String, PathBuf, Option<PathBuf>),
}

impl Named {
    fn source(self) -> PyResult<Source> {
        match self {
            Named::Process(kind, pid) if kind == "process" => Ok(Source::Pid(pid)),
            Named::Core(kind, core, exe) if kind == "core" => Ok(Source::Core { core, exe }),
            _ => Err(Error::new_err(
                "the target is (\"process\", PID) or (\"core\", CORE, EXECUTABLE)",
            )),
        }
    }
}

fn open(target: Named) -> PyResult<Target> {
    Target::open(&target.source()?).map_err(|e| Error::new_err(in_gdb(&e)))
}

/// A failure to open, as gdb's user needs it. Two differ from the `mem-trace` command's: the
/// tables of another build are fixed by the commands of that build (each library carries its
/// own, and finds the reader beside it), and a bad magic is the whole answer: gdb read the
/// symbol's address itself.
fn in_gdb(e: &TargetError) -> String {
    match e {
        TargetError::Layout(layout::Error::Version { found }) => format!(
            "mem-trace layout version {found} in the process, this gdb script reads version {}: use the gdb/mem_trace.py from the same build",
            mem_trace_format::VERSION
        ),
        TargetError::Layout(bad @ layout::Error::BadMagic { .. }) => bad.to_string(),
        e => e.to_string(),
    }
}

fn reply(answered: Result<Answered, String>) -> PyResult<Reply> {
    answered.map(|a| (a.lines, a.hint)).map_err(Error::new_err)
}

fn asked(raw: bool, gdb_threads: HashMap<u32, u32>) -> Asked {
    // gdb holds the process stopped throughout.
    Asked {
        raw,
        gdb_threads,
        stopped: true,
    }
}

/// `mtrace-why`: the block that holds `address`, who allocated and freed it.
#[pyfunction]
#[pyo3(signature = (target, address, frames=0, gap=4096, raw=false, gdb_threads=HashMap::new()))]
fn why(
    target: Named,
    address: u64,
    frames: usize,
    gap: u64,
    raw: bool,
    gdb_threads: HashMap<u32, u32>,
) -> PyResult<Reply> {
    let t = open(target)?;
    let options = WhyOptions {
        max_frames: answer::all_if_zero(frames),
        gap,
    };
    reply(answer::ask(&t, &asked(raw, gdb_threads), |tables, l| {
        answer::why(tables, l, address, &options)
    }))
}

/// `mtrace-history`: every remembered event at `address`, newest first.
#[pyfunction]
#[pyo3(signature = (target, address, frames=8, no_stacks=false, raw=false, gdb_threads=HashMap::new()))]
fn history(
    target: Named,
    address: u64,
    frames: usize,
    no_stacks: bool,
    raw: bool,
    gdb_threads: HashMap<u32, u32>,
) -> PyResult<Reply> {
    let t = open(target)?;
    let options = HistoryOptions {
        frames: answer::all_if_zero(frames),
        no_stacks,
    };
    reply(answer::ask(&t, &asked(raw, gdb_threads), |tables, l| {
        answer::history(tables, l, address, &options)
    }))
}

/// `mtrace-info`: what the tables hold.
#[pyfunction]
fn info(target: Named) -> PyResult<Reply> {
    let t = open(target)?;
    let header = t.header();
    reply(answer::ask(
        &t,
        &asked(true, HashMap::new()),
        |tables, _| answer::info(tables, header),
    ))
}

/// `mtrace-top`: the stacks that hold the most.
#[pyfunction]
#[pyo3(signature = (target, count=10, by="live", thread=None, frames=8, raw=false, gdb_threads=HashMap::new()))]
fn top(
    target: Named,
    count: usize,
    by: &str,
    thread: Option<u32>,
    frames: usize,
    raw: bool,
    gdb_threads: HashMap<u32, u32>,
) -> PyResult<Reply> {
    let Some(&(by, _)) = By::ALL.iter().find(|(_, word)| *word == by) else {
        return Err(Error::new_err(format!(
            "--by {by}: rank by live, allocated, blocks or peak"
        )));
    };
    let t = open(target)?;
    let options = TopOptions {
        count,
        by,
        thread,
        frames: answer::all_if_zero(frames),
    };
    reply(answer::ask(&t, &asked(raw, gdb_threads), |tables, l| {
        answer::top(tables, l, &options)
    }))
}

/// `mtrace-peaks`: live bytes now and at the peak, per thread, and the stacks at the peak.
#[pyfunction]
#[pyo3(signature = (target, count=5, frames=8, raw=false, gdb_threads=HashMap::new()))]
fn peaks(
    target: Named,
    count: usize,
    frames: usize,
    raw: bool,
    gdb_threads: HashMap<u32, u32>,
) -> PyResult<Reply> {
    let t = open(target)?;
    let options = PeaksOptions {
        count,
        frames: answer::all_if_zero(frames),
    };
    reply(answer::ask(&t, &asked(raw, gdb_threads), |tables, l| {
        answer::peaks(tables, l, &options)
    }))
}

/// `mtrace-leaks`: the live blocks as memcheck classifies them. `threads` are gdb's
/// threads of a live process, `(tid, stack pointer, registers)`: their stacks from the stack
/// pointer and their registers are roots (a core's come from its notes).
#[pyfunction]
#[pyo3(signature = (target, count=10, frames=8, no_reachable=false, raw=false, gdb_threads=HashMap::new(), threads=Vec::new()))]
fn leaks(
    target: Named,
    count: usize,
    frames: usize,
    no_reachable: bool,
    raw: bool,
    gdb_threads: HashMap<u32, u32>,
    threads: Vec<(u32, u64, Vec<u64>)>,
) -> PyResult<Reply> {
    let mut t = open(target)?;
    if t.is_live() && !threads.is_empty() {
        t.set_stopped_threads(
            threads
                .into_iter()
                .map(|(tid, sp, registers)| ThreadState {
                    tid,
                    sp: Some(sp),
                    registers,
                })
                .collect(),
        );
    }
    let t = t;
    let options = LeaksOptions {
        count: answer::all_if_zero(count),
        frames: answer::all_if_zero(frames),
        no_reachable,
    };
    let roots = LeakTarget {
        header: t.header(),
        modules: t.modules(),
        mappings: t.mappings(),
        threads: t.threads(),
    };
    reply(answer::ask(&t, &asked(raw, gdb_threads), |tables, l| {
        answer::leaks(tables, l, &roots, &options)
    }))
}

/// The executable that dumped `core`, as its notes name it.
#[pyfunction]
fn core_executable(core: PathBuf) -> PyResult<PathBuf> {
    mem_trace_read::target::core_executable(&core).map_err(|e| Error::new_err(e.to_string()))
}

/// The module gdb imports.
#[pymodule]
fn mem_trace_reader(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    for f in [
        wrap_pyfunction!(why, m)?,
        wrap_pyfunction!(history, m)?,
        wrap_pyfunction!(info, m)?,
        wrap_pyfunction!(top, m)?,
        wrap_pyfunction!(peaks, m)?,
        wrap_pyfunction!(leaks, m)?,
        wrap_pyfunction!(core_executable, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
