//! The walk with framehop alone: for a thread whose cache is gone (it is exiting), and the
//! reference the fast walk is checked against (`MEM_TRACE_CHECK_STACKS`, the tests).

use super::fp::KnownModule;
use super::frames::{record, Own, Walk};
use super::modules::ModuleSet;
use super::signal;
use super::stack::Stack;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};

/// The walk with framehop alone, one frame at a time so that it goes on through the
/// kernel's signal frame as the fast walk does (framehop does not evaluate the CFI
/// expressions glibc's restorer is described with, and would stop there): from the restorer,
/// at the interrupted registers. Those may lie on `home`, the thread's own stack, when the
/// walk starts on an alternate signal stack; the walk then reads `home` from there on. The
/// first pc is a return address when `at_return` says so (see `How::at_return`).
pub(super) fn walk_framehop(
    set: &ModuleSet,
    mut stack: Stack,
    ((pc, sp, bp), at_return): ((u64, u64, u64), bool),
    out: &mut [u64],
    own: Own,
    cache: &mut CacheX86_64,
    home: Option<Stack>,
) -> Walk {
    let mut regs = UnwindRegsX86_64::new(pc, sp, bp);
    let mut address = match at_return {
        true => match FrameAddress::from_return_address(pc) {
            Some(a) => a,
            None => return Walk::default(),
        },
        false => FrameAddress::InstructionPointer(pc),
    };
    let mut n = 0;
    let mut known = KnownModule::default();
    loop {
        let a = address.address();
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
        if let FrameAddress::ReturnAddress(_) = address {
            let interrupted = set
                .find(a)
                .and_then(|m| signal::interrupted(stack, m.start..m.end, a, regs.sp()));
            if let Some((rip, rsp, rbp)) = interrupted {
                if stack.read(rsp).is_none() {
                    match home {
                        Some(h) if h.lo <= rsp && rsp < h.hi => stack = Stack { lo: rsp, ..h },
                        _ => break,
                    }
                }
                regs = UnwindRegsX86_64::new(rip, rsp, rbp);
                address = FrameAddress::InstructionPointer(rip);
                continue;
            }
        }
        let mut read = |x| stack.read(x).ok_or(());
        match set
            .unwinder
            .unwind_frame(address, &mut regs, cache, &mut read)
        {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(next) => address = next,
                None => break,
            },
            _ => break,
        }
    }
    Walk {
        frames: n,
        ..Walk::default()
    }
}
