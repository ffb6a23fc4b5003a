//! libc's code in the target: its exported functions by name, and its call frame information,
//! to tell which of those functions a stopped thread is inside.
//!
//! A word on the stack that returns into `malloc` is not proof the thread is in `malloc`: a
//! frame that called `malloc` and returned leaves that word behind, and a later, deeper call
//! (`malloc_stats` → `fprintf` → `vfprintf`, with its large buffers left uninitialised) lays
//! its frames over it. So the thread's libc frames are walked first by their CFI, which
//! visits only live frames; the stack is searched word by word only beyond them, where the
//! walk leaves libc (a library constructor run inside `dlopen`, say, whose frames have no CFI
//! here).

use super::image::{function_at, Image};
use super::memory::Memory;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

/// How many libc frames a walk visits at most.
const MAX_FRAMES: usize = 64;

/// libc's exported functions `[start, end)` in the target, and an unwinder over its CFI.
pub struct LibcCode {
    /// The exported functions, by name (aliases each listed).
    pub functions: Vec<(String, u64, u64)>,
    unwinder: UnwinderX86_64<Vec<u8>>,
    /// Where libc's code is in the target.
    code: (u64, u64),
}

/// A walk of a thread's innermost libc frames.
#[derive(Debug, Default, PartialEq)]
pub struct Walk {
    /// Each frame's address for lookup (a return address less one), innermost first.
    pub frames: Vec<u64>,
    /// The stack pointer of the first frame outside libc, where the walk got there.
    pub beyond: Option<u64>,
}

impl LibcCode {
    /// libc's code from its file as loaded in the target; without CFI (a file without
    /// `.eh_frame`), walks find only the frame the thread is in.
    pub fn new(image: &Image) -> LibcCode {
        let functions = image.functions();
        let code = image.code_range().unwrap_or((0, 0));
        let mut unwinder = UnwinderX86_64::new();
        let hdr = image.section(".eh_frame_hdr");
        let eh = image.section(".eh_frame");
        let text = image.section(".text");
        if code.0 < code.1 {
            let range =
                |s: &Option<(u64, Vec<u8>)>| s.as_ref().map(|(at, d)| *at..*at + d.len() as u64);
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: range(&text),
                eh_frame_hdr_svma: range(&hdr),
                eh_frame_svma: range(&eh),
                text: text.map(|(_, d)| d),
                eh_frame_hdr: hdr.map(|(_, d)| d),
                eh_frame: eh.map(|(_, d)| d),
                ..Default::default()
            };
            unwinder.add_module(Module::new(
                "libc".to_string(),
                code.0..code.1,
                image.bias(),
                info,
            ));
        }
        LibcCode {
            functions,
            unwinder,
            code,
        }
    }

    /// The thread's frames inside libc, from its registers `r`, by their CFI.
    pub fn walk(&self, mem: &Memory, r: &libc::user_regs_struct) -> Walk {
        let mut walk = Walk::default();
        let in_libc = |a: u64| (self.code.0..self.code.1).contains(&a);
        let mut regs = UnwindRegsX86_64::new(r.rip, r.rsp, r.rbp);
        let mut address = FrameAddress::InstructionPointer(r.rip);
        let mut cache = CacheX86_64::new();
        let mut read = |a: u64| mem.read_u64(a).map_err(|_| ());
        while walk.frames.len() < MAX_FRAMES {
            let a = address.address_for_lookup();
            if !in_libc(a) {
                walk.beyond = Some(regs.sp());
                break;
            }
            walk.frames.push(a);
            match self
                .unwinder
                .unwind_frame(address, &mut regs, &mut cache, &mut read)
            {
                Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                    Some(next) => address = next,
                    None => break,
                },
                _ => break,
            }
        }
        walk
    }

    /// The name of the exported function `addr` is in.
    pub fn function_at(&self, addr: u64) -> Option<&str> {
        function_at(&self.functions, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::super::image::{find, modules};
    use super::*;

    /// This process's own libc, walked from inside `write`: the walk leaves libc for the test
    /// itself, past `write`'s frame, without any stale word on the way mattering.
    #[test]
    fn a_walk_from_inside_libc_leaves_it_where_its_caller_is() {
        let me = std::process::id() as i32;
        let m = modules(me).unwrap();
        let image = Image::read(me, find(&m, "libc.so.6").expect("libc mapped")).unwrap();
        let code = LibcCode::new(&image);
        let mem = Memory::open(me).unwrap();
        // A made-up frame: rip at `getpid`'s first byte (no frame of its own yet), the
        // return address the only word on the stack.
        let getpid = image.symbol("getpid").unwrap();
        let caller = a_walk_from_inside_libc_leaves_it_where_its_caller_is as *const () as u64 + 1;
        let stack = [caller, 0, 0, 0];
        // SAFETY: an all-zero register set is a valid value.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rip = getpid;
        r.rsp = stack.as_ptr() as u64;
        let walk = code.walk(&mem, &r);
        assert_eq!(walk.frames, [getpid]);
        assert_eq!(code.function_at(walk.frames[0]), Some("getpid"));
        assert_eq!(walk.beyond, Some(r.rsp + 8));
    }
}
