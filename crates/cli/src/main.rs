//! `mem-trace`: see the library crate's documentation (`src/lib.rs`) and `mem-trace --help`.

use clap::error::ErrorKind;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match mem_trace_cli::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version are answers, printed by clap as it prints them.
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        // A usage error is one line, as every other error, with clap's status (2).
        Err(e) => {
            // clap's message runs until its blank line before "Usage:"; a list of missing
            // arguments follows its first line, indented.
            let text = e.to_string();
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("mem-trace: {message} (mem-trace --help tells more)");
            return ExitCode::from(2);
        }
    };
    match mem_trace_cli::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mem-trace: {e}");
            ExitCode::from(e.code())
        }
    }
}
