//! `mem-trace gdb [GDB OPTIONS...] -- PROGRAM [ARGS...]`: gdb on the program, the program under
//! the library, the `mtrace-*` commands loaded; or gdb on a core (`CORE`, `CORE --exe PROGRAM`,
//! `PROGRAM CORE`) with the commands loaded. A core alone is opened with the executable its
//! notes name, found by the function the readers use (`mem-trace top CORE`), so that both
//! take the same core the same way.
//!
//! - `args`: the words split into gdb's options and what gdb opens;
//! - `script`: the commands, copied out of the library into a file gdb sources.
//!
//! gdb is started as
//!
//! ```text
//! gdb -iex 'source SCRIPT' -iex 'add-auto-load-safe-path LIB' \
//!     -iex 'set exec-wrapper env LD_PRELOAD=LIB[:USER'S]' GDB OPTIONS... --args PROGRAM ARGS...
//! ```
//!
//! `set exec-wrapper`, not `gdb --args env LD_PRELOAD=LIB PROGRAM`: with `env` as the program,
//! gdb looks breakpoints set before `run` up in `env` (they need `set breakpoint pending on`),
//! and a second `run` silently starts the program without the preload. The wrapper is run on
//! every `run`, and the preload reaches the program only: not gdb, not the shell gdb starts
//! the wrapper with. Both `-iex`, so they come before the user's own `-iex`, `-x` and `-ex` (and
//! after `~/.gdbinit`, which gdb reads first): the commands exist from the start, for a
//! `-ex 'mtrace-why p'` or a breakpoint's `commands`. The safe path lets gdb auto-load the
//! library's own copy of the commands once the program loads it (which then sees them loaded
//! and does nothing) instead of warning, at every `run`, that it declined to.
//!
//! This process becomes gdb (`exec`): gdb's exit status is ours, Ctrl-C is gdb's to handle,
//! and nothing of ours stays between gdb and the terminal.

mod args;
mod script;

use crate::cli::GdbArgs;
use crate::error::{Error, Result};
use crate::run::{child, library, preload};
use args::Open;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable that names the gdb commands' reader module to them.
const READER_VARIABLE: &str = "MEM_TRACE_READER";
/// The reader module's file name, beside the library (`cargo build --release` builds both).
const READER: &str = "libmem_trace_reader.so";

/// The reader module beside `lib`, or beside this binary.
fn reader_beside(lib: &Path) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    [
        Some(lib.with_file_name(READER)),
        exe.map(|e| e.with_file_name(READER)),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file())
}

/// ELF's `e_type` of a core file.
const ET_CORE: u16 = 4;

/// `mem-trace gdb`: does not return when gdb starts (gdb's status is then the command's).
pub fn gdb(a: &GdbArgs) -> Result<u8> {
    let split = args::split(&a.words())?;
    let open = match split.open {
        Open::Either(name) if is_core(Path::new(&name)) => Open::Core {
            program: core_program(Path::new(&name))?.into_os_string(),
            core: name,
        },
        Open::Either(name) => Open::Program {
            program: name,
            args: Vec::new(),
        },
        open => open,
    };
    let lib = library::find_any()?;
    let data = library::read(&lib)?;
    let user = std::env::var_os("LD_PRELOAD");
    let mut cmd = Command::new("gdb");
    // The reader gdb's commands answer through, built beside the library; one the user
    // named wins.
    if std::env::var_os(READER_VARIABLE).is_none() {
        if let Some(reader) = reader_beside(&lib) {
            cmd.env(READER_VARIABLE, reader);
        }
    }
    let mut trust = OsString::from("add-auto-load-safe-path ");
    trust.push(&lib);
    // gdb and the shell it starts the wrapper with must not run under the tracer, whatever
    // this environment preloads.
    match without(&lib, user.clone()) {
        Some(rest) => cmd.env("LD_PRELOAD", rest),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    match open {
        Open::Program { program, args } => {
            let path = absolute(&child::resolve("gdb", &program)?)?;
            if is_core(&path) {
                return Err(Error::new(format!(
                    "gdb: {} is a core file, not a program: mem-trace gdb CORE --exe PROGRAM",
                    path.display()
                )));
            }
            let script = script::file(&lib, &data)?;
            let mut assignment = OsString::from("LD_PRELOAD=");
            assignment.push(preload(&lib, user));
            let mut wrapper = OsString::from("set exec-wrapper env ");
            wrapper.push(shell_word(&assignment));
            cmd.arg("-iex")
                .arg(source(&script))
                .arg("-iex")
                .arg(&trust)
                .arg("-iex")
                .arg(wrapper)
                .args(&split.options)
                .arg("--args")
                .arg(&path)
                .args(args);
        }
        Open::Core { program, core } => {
            let path = absolute(&child::resolve("gdb", &program)?)?;
            let core = Path::new(&core);
            if !core.exists() {
                return Err(Error::new(format!(
                    "gdb: {}: no such core file",
                    core.display()
                )));
            }
            if !is_core(core) {
                return Err(Error::new(format!(
                    "gdb: {} is not a core file: to start a program with arguments, put them \
                     after --: mem-trace gdb -- PROGRAM ARGS...",
                    core.display()
                )));
            }
            let script = script::file(&lib, &data)?;
            // `--core`, not a second name: gdb would take a name of digits for a PID.
            cmd.arg("-iex")
                .arg(source(&script))
                .arg("-iex")
                .arg(&trust)
                .args(&split.options)
                .arg("--core")
                .arg(core)
                .arg("--")
                .arg(&path);
        }
        Open::Either(_) => unreachable!("resolved above"),
    }
    let e = cmd.exec();
    Err(match e.kind() {
        std::io::ErrorKind::NotFound => Error::with_code(
            "gdb: no gdb in PATH: install gdb (e.g. apt-get install gdb), then run this again",
            127,
        ),
        _ => Error::with_code(format!("gdb: cannot start gdb: {e}"), 126),
    })
}

/// The executable that dumped `core`, from the core's own notes, as the readers find it; an
/// error naming `--exe` when the notes do not tell or the file is gone.
fn core_program(core: &Path) -> Result<PathBuf> {
    use mem_trace_read::target::{core_executable, TargetError};
    let exe = core_executable(core).map_err(|e| match e {
        // Says to pass --exe already.
        TargetError::ExeUnknown { .. } => Error::new(format!("gdb: {e}")),
        e => Error::new(format!(
            "gdb: cannot tell which program dumped {}: {e}; name it with --exe PROGRAM",
            core.display()
        )),
    })?;
    if !exe.is_file() {
        return Err(Error::new(format!(
            "gdb: {} names its executable {}, which is no longer there: name the program that \
             dumped it with --exe PROGRAM",
            core.display(),
            exe.display()
        )));
    }
    Ok(exe)
}

/// `path` from the root, symbolic links kept: gdb starts the program by its path, from
/// whatever directory a `cd` took it to.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| Error::new(format!("gdb: {}: {e}", path.display())))
}

/// Whether `path` is an ELF core file (its `e_type`, in the byte order its header says).
fn is_core(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 18];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    if read.is_err() || &head[..4] != b"\x7fELF" {
        return false;
    }
    let e_type = [head[16], head[17]];
    let e_type = match head[5] {
        2 => u16::from_be_bytes(e_type),
        _ => u16::from_le_bytes(e_type),
    };
    e_type == ET_CORE
}

/// gdb's `source` of `script` (gdb takes the rest of the line as the file's name, spaces and
/// all).
fn source(script: &Path) -> OsString {
    let mut s = OsString::from("source ");
    s.push(script);
    s
}

/// The user's `LD_PRELOAD` without the library.
fn without(lib: &Path, existing: Option<OsString>) -> Option<OsString> {
    let existing = existing?;
    let rest: Vec<&str> = existing
        .to_str()?
        .split([':', ' '])
        .filter(|e| !e.is_empty() && Path::new(e) != lib)
        .collect();
    (!rest.is_empty()).then(|| rest.join(":").into())
}

/// `word` as one word for gdb's exec-wrapper, which is split as a shell splits it (the shell
/// gdb starts the program with, or gdb's own splitting when `startup-with-shell` is off):
/// as it is when plain, else in single quotes.
fn shell_word(word: &OsStr) -> OsString {
    let plain = word
        .as_bytes()
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b"-_./=:+,@%".contains(&b));
    if plain {
        return word.to_owned();
    }
    let mut out = b"'".to_vec();
    for &b in word.as_bytes() {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    OsStr::from_bytes(&out).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_word_survives_a_shell() {
        assert_eq!(
            shell_word(OsStr::new("LD_PRELOAD=/a/b.so")),
            "LD_PRELOAD=/a/b.so"
        );
        assert_eq!(
            shell_word(OsStr::new("LD_PRELOAD=/my dir/it's.so")),
            "'LD_PRELOAD=/my dir/it'\\''s.so'"
        );
    }

    #[test]
    fn gdb_keeps_the_users_preloads_only() {
        let lib = Path::new("/x/libmem_trace.so");
        assert_eq!(without(lib, None), None);
        assert_eq!(without(lib, Some("/x/libmem_trace.so".into())), None);
        assert_eq!(
            without(lib, Some("/a.so /x/libmem_trace.so:/b.so".into())),
            Some("/a.so:/b.so".into())
        );
    }
}
