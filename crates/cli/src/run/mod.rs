//! `mem-trace run [--mode MODE] [--profile] [-o DIR] [--] PROGRAM [ARGS...]`: the program under the tracer,
//! as if run directly, and its reports in a directory.
//!
//! - `library`: which `libmem_trace.so` to preload, checked to keep per-stack counters;
//! - `bundled`: the library this binary carries (`bundle` feature), written out to a cache;
//! - `child`: finding, starting and waiting for the program, and passing its end on;
//! - `stop`: `run` told to stop (SIGTERM, SIGINT): the final reports, then the signal passed on;
//! - `outputs`: the files left in the directory, and where they are;
//! - `symbolize`: the exit and final reports the library left raw, symbolized once the program
//!   has ended;
//! - `at_exit`: with `--pprof` or `--push`, each process read as it exits, while the library
//!   holds it: its pprof profile, and the program's last push;
//! - `gate`: `--error-exitcode`, the run's status when a process failed it;
//! - `worth`: which exit reports are kept (not those of processes that allocated nothing worth
//!   one);
//! - `names`: a process named by its command line.
//!
//! The program gets, on top of the environment as it is:
//!
//! | variable | value | why |
//! | --- | --- | --- |
//! | `LD_PRELOAD` | the library, then the entries already there | the tracer; the user's own preloads kept |
//! | `MEM_TRACE_PROFILE` | `1` | reports on: the library keeps its counters either way, and writes reports only when asked |
//! | `MEM_TRACE_OUT` | the directory, absolute | each report a file there, not on the program's stderr |
//! | `MEM_TRACE_LEAKS` | `1` | the exit report is written only with its leak check |
//! | `MEM_TRACE_REQUESTS` | `1` | each process listens for `run`'s request for a final report (`stop`) |
//! | `MEM_TRACE_RUN_PID` | `run`'s pid | the process `run` starts (whose parent it is) makes the library's thread at start-up; the others only on need, so that none is in the way of a process that must be single-threaded (crates/core/src/profile/reporter.rs) |
//! | `MEM_TRACE_DEFER_SYMBOLS` | `1` | the exit and final reports are written with return addresses only, and symbolized by `run` (`symbolize`): symbolizing in the exiting process cost each one ~50 ms |
//! | `MEM_TRACE_PROFILE_INTERVAL` | `0` without `--profile` | only the exit report; with `--profile` the user's interval (default 30 s) |
//! | `MEM_TRACE_HOLD_AT_EXIT` | `1` with `--pprof` or `--push` | each process waits at exit until `run` has read its tables (`at_exit`) |
//! | `MEM_TRACE_MODE` | `--mode`, else the user's, else `profile` | a profile needs allocation stacks only, at about half the cost of `debug`'s free stacks, history and quarantine |
//! | `MEM_TRACE_SAMPLE`, `MEM_TRACE_FRAMES` | `--sample`, `--frames`, when given | the options `attach` takes, spelled alike |
//!
//! Its stdin, stdout and stderr are ours, untouched. The reports' files are written by the
//! library itself (`crates/core/src/profile/`); `outputs` completes them afterwards.

mod at_exit;
mod bundled;
pub(crate) mod child;
mod gate;
pub(crate) mod library;
mod names;
mod outputs;
mod python;
mod stop;
mod symbolize;
mod worth;

use crate::cli::{By, Mode, PushArgs, RunArgs, TargetArgs};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `mem-trace run`: the program's exit status (a death by a signal is passed on by dying of it).
pub fn run(args: &RunArgs) -> Result<u8> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Error::new(
            "run: no program given: mem-trace run [--mode MODE] [--profile] [-o DIR] [--] PROGRAM [ARGS...]",
        ));
    };
    let lib = library::find()?;
    let path = child::resolve("run", program)?;
    let dir = out_dir(args.output.as_deref(), &path)?;
    let run_mode = mode(args.mode, std::env::var_os("MEM_TRACE_MODE"));
    let profile_mode = run_mode == Mode::Profile.as_env();
    let mut env: Vec<(&str, OsString)> = vec![
        ("LD_PRELOAD", preload(&lib, std::env::var_os("LD_PRELOAD"))),
        ("MEM_TRACE_PROFILE", "1".into()),
        ("MEM_TRACE_OUT", dir.clone().into_os_string()),
        ("MEM_TRACE_LEAKS", "1".into()),
        ("MEM_TRACE_REQUESTS", "1".into()),
        ("MEM_TRACE_RUN_PID", std::process::id().to_string().into()),
        ("MEM_TRACE_DEFER_SYMBOLS", "1".into()),
        ("MEM_TRACE_MODE", run_mode),
    ];
    if !args.profile {
        env.push(("MEM_TRACE_PROFILE_INTERVAL", "0".into()));
    }
    // Unset, the environment's own value (or the library's default) holds.
    if let Some(n) = args.sample {
        env.push(("MEM_TRACE_SAMPLE", n.to_string().into()));
    }
    if let Some(n) = args.frames {
        env.push(("MEM_TRACE_FRAMES", n.to_string().into()));
    }
    if let Some((value, said)) = python::pythonmalloc(std::env::var_os("PYTHONMALLOC"), &path) {
        env.push(("PYTHONMALLOC", value));
        if let Some(line) = said {
            eprintln!("{line}");
        }
    }
    let control = Arc::new(crate::push::Control::default());
    let program_pid = Arc::new(AtomicU32::new(0));
    let held = match args.pprof || args.push.is_some() {
        true => {
            env.push(("MEM_TRACE_HOLD_AT_EXIT", "1".into()));
            let jobs = at_exit::Jobs {
                pprof: args.pprof,
                last_push: args
                    .push
                    .as_ref()
                    .map(|_| (program_pid.clone(), control.clone())),
            };
            let server = at_exit::Server::start(&dir, jobs).map_err(|e| {
                Error::new(format!(
                    "run: cannot listen for exiting processes in {}: {e}",
                    dir.display()
                ))
            })?;
            Some(server)
        }
        false => None,
    };
    let mut pusher = None;
    let status = child::run(program, &path, program_args, &env, &dir, |pid| {
        program_pid.store(pid, Ordering::Relaxed);
        pusher = args.push.as_ref().map(|url| {
            let push = push_args(args, url, pid, &path);
            let control = control.clone();
            let every = Duration::from_secs_f64(args.push_every);
            std::thread::spawn(move || (crate::push::pushes(&push, &control, every), push.url))
        });
    })?;
    let program_pid = program_pid.load(Ordering::Relaxed);
    let profiles = held.map(|server| {
        std::thread::sleep(at_exit::GRACE);
        server.finish()
    });
    control.stop();
    if let Some(pusher) = pusher {
        match pusher.join() {
            Ok((Ok((made, accepted)), url)) => eprintln!(
                "mem-trace: run: {accepted} of {made} profiles accepted by {url}{}",
                match control.last_made() {
                    true => ", the last one as the program exited",
                    false => " (none as the program exited: it did not call exit, or was not read)",
                }
            ),
            Ok((Err(e), _)) => eprintln!("mem-trace: run: push: {e}"),
            Err(_) => eprintln!("mem-trace: run: the push thread failed"),
        }
    }
    let ended = outputs::Ended {
        program: program_pid,
        signal: std::os::unix::process::ExitStatusExt::signal(&status),
        unfinished: stop::unfinished(&dir),
        ended_first: stop::ended_first(),
        profile_mode,
    };
    let reports = outputs::finish(&dir, ranked_by(), &ended, args.all_reports);
    if let Some(written) = profiles.filter(|_| args.pprof) {
        let kept: Vec<u32> = reports.iter().map(|r| r.pid).collect();
        at_exit::keep_and_say(&written, &kept, args.all_reports);
    }
    if let Some(code) = args.error_exitcode {
        let texts = reports
            .iter()
            .map(|r| (r, std::fs::read_to_string(&r.txt).unwrap_or_default()));
        let failed = gate::failures(texts, args.fail_on);
        if !failed.is_empty() {
            for line in gate::lines(code, &failed) {
                eprintln!("{line}");
            }
            // A program that died of a signal still does: that is the graver news.
            if ended.signal.is_none() {
                return Ok(code);
            }
        }
    }
    Ok(child::pass_on(status))
}

/// What `mem-trace push` would be given for the program `pid` that `run` started.
fn push_args(args: &RunArgs, url: &str, pid: u32, program: &Path) -> PushArgs {
    let name = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "mem-trace".into());
    PushArgs {
        target: TargetArgs {
            target: pid.to_string(),
            exe: None,
        },
        url: url.to_string(),
        server: args.push_server,
        every: args.push_every,
        service: Some(args.push_service.clone().unwrap_or(name)),
        labels: args.push_labels.clone(),
        count: 0,
        timeout: 10.0,
    }
}

/// `LD_PRELOAD` with `lib` first (before another malloc in the list takes the calls) and the
/// entries already there after it, `lib` not twice.
pub(crate) fn preload(lib: &Path, existing: Option<OsString>) -> OsString {
    let mut out = lib.as_os_str().to_owned();
    let existing = existing.unwrap_or_default();
    let existing = existing.to_string_lossy();
    // ld.so separates entries with spaces or colons.
    for entry in existing.split([':', ' ']).filter(|e| !e.is_empty()) {
        if Path::new(entry) != lib {
            out.push(":");
            out.push(entry);
        }
    }
    out
}

/// `MEM_TRACE_MODE` for the program: `--mode`, else the user's own setting (the library
/// reports a bad one), else profile: `run` is for where the memory goes.
fn mode(given: Option<Mode>, existing: Option<OsString>) -> OsString {
    match (given, existing) {
        (Some(m), _) => m.as_env().into(),
        (None, Some(v)) if !v.is_empty() => v,
        (None, _) => Mode::Profile.as_env().into(),
    }
}

/// The directory the reports go to, made if needed, as an absolute path: `dir`, or a new
/// `mem-trace.<prog>.<pid>` in the current directory (`pid`: this process's; the report files
/// inside carry the program's).
fn out_dir(dir: Option<&Path>, program: &Path) -> Result<PathBuf> {
    let cannot = |d: &Path, e: std::io::Error| {
        Error::new(format!(
            "cannot create the report directory {}: {e}",
            d.display()
        ))
    };
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| cannot(d, e))?;
            d.to_path_buf()
        }
        None => {
            let prog = program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into());
            let d = PathBuf::from(format!("mem-trace.{prog}.{}", std::process::id()));
            std::fs::create_dir(&d).map_err(|e| cannot(&d, e))?;
            d
        }
    };
    dir.canonicalize().map_err(|e| cannot(&dir, e))
}

/// What the reports rank by, as the library reads `MEM_TRACE_PROFILE_BY` (a bad value is the
/// library's to report; it then ranks by live bytes).
fn ranked_by() -> By {
    match std::env::var("MEM_TRACE_PROFILE_BY")
        .as_deref()
        .map(str::trim)
    {
        Ok("allocated") => By::Allocated,
        Ok("blocks") => By::Blocks,
        Ok("peak") => By::Peak,
        _ => By::Live,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_the_options_then_the_users_then_profile() {
        assert_eq!(mode(None, None), "profile");
        assert_eq!(mode(None, Some("".into())), "profile");
        assert_eq!(mode(None, Some("debug".into())), "debug");
        assert_eq!(mode(Some(Mode::Profile), Some("debug".into())), "profile");
        assert_eq!(mode(Some(Mode::Debug), None), "debug");
    }

    #[test]
    fn the_library_goes_first_and_the_users_preloads_stay() {
        let lib = Path::new("/x/libmem_trace.so");
        assert_eq!(preload(lib, None), "/x/libmem_trace.so");
        assert_eq!(
            preload(
                lib,
                Some("/a/libjemalloc.so /b/c.so:/x/libmem_trace.so".into())
            ),
            "/x/libmem_trace.so:/a/libjemalloc.so:/b/c.so"
        );
    }
}
