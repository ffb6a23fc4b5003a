//! How the profiler thread (`reporter`) is woken: the word it sleeps on (`requests`' shared
//! one while there is one) and the snapshot flag. A leaf under the reporter, so that the
//! snapshot signal's handler (`signal`) wakes the thread without importing it.

use crate::profile::requests;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::Release};

/// The word the thread sleeps on when `requests` has none to offer.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// Set by the snapshot signal's handler, taken by the thread.
pub(super) static SNAPSHOT: AtomicBool = AtomicBool::new(false);

/// Async-signal-safe: wakes the thread for a snapshot.
pub(crate) fn wake_for_snapshot() {
    SNAPSHOT.store(true, Release);
    wake();
}

/// The word the thread sleeps on: `requests`' shared one while there is one, else ours.
pub(super) fn word() -> &'static AtomicU32 {
    requests::wake_word().unwrap_or(&WAKE)
}

/// Async-signal-safe: wakes the thread to look at its flags.
pub(super) fn wake() {
    requests::wake_on(word());
}
