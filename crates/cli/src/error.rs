//! The command's errors: one line each, printed as `mem-trace: LINE` with a non-zero exit
//! status. (clap's own usage errors are clap's, with its exit status 2.)

use std::fmt;

/// An error the user sees: what is wrong and what to do, on one line.
#[derive(Debug)]
pub struct Error {
    message: String,
    code: u8,
}

impl Error {
    /// An error that exits with status 1.
    pub fn new(message: impl Into<String>) -> Self {
        Error::with_code(message, 1)
    }

    /// An error that exits with `code` (`mem-trace run` uses the shell's 126 and 127 for a
    /// program that cannot run or is not found).
    pub fn with_code(message: impl Into<String>, code: u8) -> Self {
        let message = message.into().replace('\n', " ");
        Error { message, code }
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        self.code
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// What a subcommand returns.
pub type Result<T> = std::result::Result<T, Error>;
