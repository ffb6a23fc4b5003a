//! A spinner on stderr for work that takes over a second, only when stderr is a terminal: a
//! quick answer, or one going to a file or a pipe, shows nothing but the answer.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long work runs before the spinner appears.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// A spinner that appears after [`QUIET_FOR`] unless the work is finished by then.
pub struct Progress {
    bar: ProgressBar,
    done: Option<Sender<()>>,
}

impl Progress {
    /// Starts timing `what` (e.g. "scanning for leaks").
    pub fn start(what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(what.to_string());
        if !std::io::stderr().is_terminal() {
            return Progress { bar, done: None };
        }
        let (done, finished) = mpsc::channel();
        let shown = bar.clone();
        std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(QUIET_FOR) {
                shown.set_draw_target(ProgressDrawTarget::stderr());
                shown.enable_steady_tick(Duration::from_millis(120));
            }
        });
        Progress {
            bar,
            done: Some(done),
        }
    }

    /// The work is done: the spinner, if shown, is cleared before the answer is printed.
    pub fn finish(&self) {
        if let Some(done) = &self.done {
            let _ = done.send(());
        }
        self.bar.finish_and_clear();
    }
}
