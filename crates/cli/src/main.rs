//! `mem-trace`: see the library crate's documentation (`src/lib.rs`) and `mem-trace --help`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = mem_trace_cli::cli::Cli::parse();
    match mem_trace_cli::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mem-trace: {e}");
            ExitCode::from(e.code())
        }
    }
}
