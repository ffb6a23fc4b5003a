//! The frame-pointer walk (`MEM_TRACE_UNWIND=fp`), for programs built with frame pointers.

use super::frames::Walk;
use super::modules::ModuleSet;
use super::stack::Stack;

/// The module of the last frame looked up: consecutive frames are mostly in one module, so
/// it is tried before searching the module set.
#[derive(Default)]
pub(super) struct KnownModule(core::ops::Range<u64>);

impl KnownModule {
    /// Whether `pc` lies in a known module (remembering which).
    #[inline(always)]
    pub(super) fn holds(&mut self, set: &ModuleSet, pc: u64) -> bool {
        if self.0.contains(&pc) {
            return true;
        }
        match set.find(pc) {
            Some(m) => {
                self.0 = m.start..m.end;
                true
            }
            None => false,
        }
    }
}

/// Follows the rbp chain from the program's first frame, `(pc, sp, bp)`, whose `pc` is already
/// `out[n - 1]`: `[bp]` is the caller's rbp and `[bp + 8]` the return address into it. Stops
/// when a link does not move up the stack, leaves it, or is 0.
pub(super) fn fp_chain(
    set: &ModuleSet,
    stack: Stack,
    (pc, sp, mut bp): (u64, u64, u64),
    out: &mut [u64],
    mut n: usize,
) -> Walk {
    let mut known = KnownModule::default();
    let mut low = sp;
    let mut a = pc;
    loop {
        // Consecutive frames are mostly in one module: try the last one before searching.
        if !known.holds(set, a) {
            return Walk {
                frames: n,
                outside: true,
                ..Walk::default()
            };
        }
        if n == out.len() || bp < low {
            break;
        }
        let (Some(next), Some(ra)) = (stack.read(bp), stack.read(bp.wrapping_add(8))) else {
            break;
        };
        if ra == 0 || set.is_own(ra) {
            break;
        }
        out[n] = ra;
        n += 1;
        a = ra;
        low = bp + 16;
        bp = next;
    }
    Walk {
        frames: n,
        ..Walk::default()
    }
}
