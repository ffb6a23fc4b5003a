//! # mem-trace-cli: the `mem-trace` command
//!
//! - [`cli`]: the command line (clap);
//! - [`run`]: `mem-trace run PROGRAM`: the program under the tracer, its status passed on, its
//!   reports and flame graphs in a directory;
//! - [`gdb`]: `mem-trace gdb -- PROGRAM`: gdb on the program under the tracer, or on a core,
//!   with the `mtrace-*` commands loaded;
//! - [`stacks`]: a target's stacks with their counts, symbolized (what flame graphs and DHAT's
//!   JSON are made of);
//! - [`flamegraph`]: folded stacks and SVG flame graphs drawn with `inferno`;
//! - [`dhat`]: DHAT's JSON, for valgrind's viewer;
//! - [`pprof`]: heap profiles in pprof's format, for `go tool pprof` and profiling servers;
//! - [`push`]: those profiles sent to a continuous-profiling server (Pyroscope) at intervals;
//! - [`progress`]: a spinner on stderr for reads over a second;
//! - [`attach`]: `mem-trace attach PID` and `detach PID`: the tracer loaded into a running
//!   process and taken out again, through ptrace;
//! - [`readers`]: the subcommands that answer as the gdb commands do (`top`, `peaks`, `leaks`,
//!   `why`, `history`, `info`);
//! - [`error`]: one-line errors.
//!
//! The binary (`src/main.rs`) parses the command line and calls [`dispatch`].

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod attach;
pub mod cli;
pub mod dhat;
pub mod error;
pub mod flamegraph;
pub mod gdb;
pub mod liveness;
pub mod pprof;
pub mod progress;
pub mod push;
pub mod readers;
pub mod run;
pub mod stacks;

use cli::{Cli, Command};
use error::Result;

/// Runs the subcommand; the process's exit status on success.
pub fn dispatch(cli: Cli) -> Result<u8> {
    // A process read may exit under the reader: then that is the answer's one line.
    let pid = liveness::target_pid(&cli.command);
    let was_alive = pid.is_some_and(liveness::alive);
    let result = command(cli);
    match pid {
        Some(pid) => result.map_err(|e| liveness::explain(e, pid, was_alive)),
        None => result,
    }
}

fn command(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Run(a) => run::run(&a),
        Command::Gdb(a) => gdb::gdb(&a),
        Command::Flamegraph(a) => flamegraph::command(&a).map(|()| 0),
        Command::Dhat(a) => dhat::command(&a).map(|()| 0),
        Command::Pprof(a) => pprof::command(&a).map(|()| 0),
        Command::Push(a) => push::command(&a),
        Command::Top(a) => readers::top(&a).map(|()| 0),
        Command::Peaks(a) => readers::peaks(&a).map(|()| 0),
        Command::Leaks(a) => readers::leaks(&a).map(|()| 0),
        Command::Why(a) => readers::why(&a).map(|()| 0),
        Command::History(a) => readers::history(&a).map(|()| 0),
        Command::Info(a) => readers::info(&a).map(|()| 0),
        Command::Attach(a) => attach::attach(&a).map(|()| 0),
        Command::Detach(a) => attach::detach(&a).map(|()| 0),
        Command::Completions(a) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(a.shell, &mut command, "mem-trace", &mut std::io::stdout());
            Ok(0)
        }
    }
}
