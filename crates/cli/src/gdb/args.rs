//! `mem-trace gdb`'s words split into gdb's own options, passed on verbatim, and what gdb is to
//! open.
//!
//! clap cannot do this split: which of gdb's options take a value (`-ex CMD`) is gdb's to know,
//! and a gdb option must not be taken for the program. So clap hands over the words as they
//! are and [`split`] walks them with gdb's list of options that take a value. An option gdb
//! adds later that takes a value would have its value taken for the program; `--` after the
//! options never has that problem, which is why the usage puts it there.

use crate::error::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// The usage line, for the errors that need it.
pub const USAGE: &str = "mem-trace gdb [GDB OPTIONS...] -- PROGRAM [ARGS...], or mem-trace gdb \
[GDB OPTIONS...] CORE --exe PROGRAM, or mem-trace gdb [GDB OPTIONS...] PROGRAM CORE";

/// Why attaching is refused (a process started without the preload has no tables to read).
pub const ATTACH: &str = "attaching is not supported yet: start the program under mem-trace gdb, \
or read it with mem-trace top PID";

/// gdb 13's options that take a value as the next word (`gdb --help`; each also in the `--NAME`
/// and `-NAME=VALUE` spellings).
const WITH_VALUE: &[&str] = &[
    "ex",
    "eval-command",
    "iex",
    "init-eval-command",
    "eiex",
    "early-init-eval-command",
    "x",
    "command",
    "ix",
    "init-command",
    "eix",
    "early-init-command",
    "s",
    "symbols",
    "e",
    "exec",
    "se",
    "c",
    "core",
    "d",
    "directory",
    "D",
    "data-directory",
    "cd",
    "i",
    "interpreter",
    "ui",
    "b",
    "baud",
    "l",
    "t",
    "tty",
];

/// gdb's ways to attach to a process.
const PID: &[&str] = &["p", "pid"];

/// What gdb is to open.
#[derive(Debug, PartialEq, Eq)]
pub enum Open {
    /// Start `program` with `args` under the preload.
    Program {
        /// The program as the user named it (found through `$PATH` later).
        program: OsString,
        /// Its arguments.
        args: Vec<OsString>,
    },
    /// Read `core`, dumped by `program`.
    Core {
        /// The executable that dumped it.
        program: OsString,
        /// The core file.
        core: OsString,
    },
    /// One name, not yet known to be a program or a core (only the file tells).
    Either(OsString),
}

/// The command line, split.
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    /// gdb's options, verbatim, in their order.
    pub options: Vec<OsString>,
    /// What gdb opens.
    pub open: Open,
}

/// Splits `words` (everything after `mem-trace gdb`).
pub fn split(words: &[OsString]) -> Result<Split> {
    let (before, after) = match words.iter().position(|w| w == "--") {
        Some(i) => (&words[..i], Some(&words[i + 1..])),
        None => (words, None),
    };
    let mut options = Vec::new();
    let mut names = Vec::new();
    let mut exe = None;
    let mut i = 0;
    while i < before.len() {
        let word = &before[i];
        i += 1;
        let Some((name, inline)) = option(word) else {
            names.push(word.clone());
            continue;
        };
        let name = name.to_string_lossy();
        if name == "exe" {
            let value = match inline {
                Some(v) => v.to_owned(),
                None => {
                    i += 1;
                    before
                        .get(i - 1)
                        .cloned()
                        .ok_or_else(|| Error::new("gdb: --exe needs the program's path"))?
                }
            };
            exe = Some(value);
            continue;
        }
        if PID.contains(&name.as_ref()) || (name.starts_with('p') && is_pid(&name[1..])) {
            return Err(Error::new(format!("gdb: {ATTACH}")));
        }
        if name == "args" {
            return Err(Error::new(format!(
                "gdb: give the program and its arguments after --, not --args: {USAGE}"
            )));
        }
        options.push(word.clone());
        if inline.is_none() && WITH_VALUE.contains(&name.as_ref()) {
            let value = before.get(i).ok_or_else(|| {
                Error::new(format!("gdb: the gdb option {} needs a value", show(word)))
            })?;
            options.push(value.clone());
            i += 1;
        }
    }
    let open = match (after, exe) {
        (Some(_), Some(_)) => {
            return Err(Error::new(format!(
                "gdb: --exe names the program of a core, not of a run: {USAGE}"
            )))
        }
        (Some(after), None) => {
            if let Some(name) = names.first() {
                return Err(Error::new(format!(
                    "gdb: {} before --: gdb options go before --, the program and its \
                     arguments after it",
                    show(name)
                )));
            }
            let Some((program, args)) = after.split_first() else {
                return Err(Error::new(format!("gdb: no program after --: {USAGE}")));
            };
            Open::Program {
                program: program.clone(),
                args: args.to_vec(),
            }
        }
        (None, Some(program)) => match names.as_slice() {
            [core] => Open::Core {
                program,
                core: core.clone(),
            },
            [] => return Err(Error::new(format!("gdb: --exe without a core: {USAGE}"))),
            [_, extra, ..] => return Err(too_many(extra)),
        },
        (None, None) => match names.as_slice() {
            [] => return Err(Error::new(format!("gdb: no program given: {USAGE}"))),
            [name] => Open::Either(name.clone()),
            // gdb's second name may be a PID as well as a core.
            [_, pid] if is_pid(&pid.to_string_lossy()) && !exists(pid) => {
                return Err(Error::new(format!("gdb: {ATTACH}")));
            }
            [program, core] => Open::Core {
                program: program.clone(),
                core: core.clone(),
            },
            [_, _, extra, ..] => return Err(too_many(extra)),
        },
    };
    Ok(Split { options, open })
}

/// An option's name without its dashes and its `=VALUE`, if `word` is an option.
fn option(word: &OsStr) -> Option<(&OsStr, Option<&OsStr>)> {
    let bytes = word.as_bytes();
    let name = bytes
        .strip_prefix(b"--")
        .or_else(|| bytes.strip_prefix(b"-"))?;
    if name.is_empty() {
        return None;
    }
    Some(match name.iter().position(|&b| b == b'=') {
        Some(eq) => (
            OsStr::from_bytes(&name[..eq]),
            Some(OsStr::from_bytes(&name[eq + 1..])),
        ),
        None => (OsStr::from_bytes(name), None),
    })
}

fn is_pid(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn exists(path: &OsStr) -> bool {
    std::path::Path::new(path).exists()
}

fn show(word: &OsStr) -> String {
    word.to_string_lossy().into_owned()
}

fn too_many(extra: &OsStr) -> Error {
    Error::new(format!(
        "gdb: unexpected {}: the program's arguments go after --: {USAGE}",
        show(extra)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<OsString> {
        w.iter().map(OsString::from).collect()
    }

    fn ok(w: &[&str]) -> Split {
        split(&words(w)).unwrap_or_else(|e| panic!("{w:?}: {e}"))
    }

    fn err(w: &[&str]) -> String {
        split(&words(w)).unwrap_err().to_string()
    }

    #[test]
    fn options_before_the_program_pass_verbatim() {
        let s = ok(&[
            "-batch",
            "-ex",
            "break main",
            "-x",
            "f.gdb",
            "-q",
            "--",
            "./p",
            "-ex",
            "a",
        ]);
        assert_eq!(
            s.options,
            words(&["-batch", "-ex", "break main", "-x", "f.gdb", "-q"])
        );
        assert_eq!(
            s.open,
            Open::Program {
                program: "./p".into(),
                args: words(&["-ex", "a"])
            }
        );
    }

    #[test]
    fn a_value_that_looks_like_a_program_stays_an_option() {
        let s = ok(&["--eval-command", "run", "-iex=set x 1", "prog"]);
        assert_eq!(s.options, words(&["--eval-command", "run", "-iex=set x 1"]));
        assert_eq!(s.open, Open::Either("prog".into()));
    }

    #[test]
    fn cores_in_both_forms() {
        let core = |program: &str, core: &str| Open::Core {
            program: program.into(),
            core: core.into(),
        };
        assert_eq!(
            ok(&["-batch", "c.core", "--exe", "./p"]).open,
            core("./p", "c.core")
        );
        assert_eq!(ok(&["--exe=./p", "c.core"]).open, core("./p", "c.core"));
        assert_eq!(ok(&["./p", "c.core", "-q"]).open, core("./p", "c.core"));
    }

    #[test]
    fn attaching_is_refused() {
        for w in [
            &["-p", "123"][..],
            &["--pid", "123"],
            &["-pid=123"],
            &["-p123"],
            &["./p", "123"],
        ] {
            assert!(err(w).contains("attaching is not supported yet"), "{w:?}");
        }
    }

    #[test]
    fn bad_input_is_one_error() {
        assert!(err(&[]).contains("no program given"));
        assert!(err(&["-batch"]).contains("no program given"));
        assert!(err(&["-batch", "--"]).contains("no program after --"));
        assert!(err(&["-ex"]).contains("-ex needs a value"));
        assert!(err(&["--exe", "./p"]).contains("--exe without a core"));
        assert!(err(&["--exe", "./p", "--", "./p"]).contains("--exe names the program"));
        assert!(err(&["x", "--", "./p"]).contains("x before --"));
        assert!(err(&["./p", "a", "b"]).contains("unexpected b"));
        assert!(err(&["--args", "./p"]).contains("not --args"));
    }
}
