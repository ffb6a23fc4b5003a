//! The walk with framehop alone: for a thread whose cache is gone (it is exiting), and the
//! tests' reference unwinder.

use super::fp::KnownModule;
use super::frames::{record, Own, Walk};
use super::modules::ModuleSet;
use super::stack::Stack;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::Unwinder;

/// The walk with framehop alone: for a thread whose cache is gone, and the tests' reference.
pub(super) fn walk_framehop(
    set: &ModuleSet,
    stack: Stack,
    (pc, sp, bp): (u64, u64, u64),
    out: &mut [u64],
    own: Own,
    cache: &mut CacheX86_64,
) -> Walk {
    let mut read_stack = |a| stack.read(a).ok_or(());
    let mut frames = set.unwinder.iter_frames(
        pc,
        UnwindRegsX86_64::new(pc, sp, bp),
        cache,
        &mut read_stack,
    );
    let mut n = 0;
    let mut known = KnownModule::default();
    while let Ok(Some(frame)) = frames.next() {
        let a = frame.address();
        if !record(set, own, a, out, &mut n) || n >= out.len() {
            break;
        }
        if !known.holds(set, a) {
            // Past an unknown module framehop falls back to frame pointers: stop here rather
            // than record guesses.
            return Walk {
                frames: n,
                outside: true,
                ..Walk::default()
            };
        }
    }
    Walk {
        frames: n,
        ..Walk::default()
    }
}
