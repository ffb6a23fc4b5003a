//! The kernel's signal frame. A signal handler returns into the restorer the C library
//! registered (`__restore_rt` in glibc and musl: `mov $15, %rax; syscall`, i.e.
//! `rt_sigreturn`), and its return address is the restorer's first instruction. Below that
//! return address the kernel left the interrupted context, a `ucontext_t`, whose saved
//! registers are where the interrupted frames go on. glibc describes this with CFI
//! expressions, which neither our rules nor framehop evaluate; gdb and libgcc recognise the
//! instruction bytes, as this does.

use super::stack::Stack;

/// `mov $15, %rax; syscall`: the restorer's code.
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Offsets in the `ucontext_t` of the interrupted rbp, rsp and rip (`uc_mcontext` at 40, its
/// `gregs` indexed by `REG_RBP` 10, `REG_RSP` 15 and `REG_RIP` 16, 8 bytes each).
const RBP: u64 = 40 + 10 * 8;
const RSP: u64 = 40 + 15 * 8;
const RIP: u64 = 40 + 16 * 8;

/// The interrupted registers `(pc, sp, bp)` when `pc`, a return address in the executable
/// range `code` of a loaded module, is the restorer's and `sp` (the handler frame's CFA)
/// holds the context; `None` otherwise.
pub(super) fn interrupted(
    stack: Stack,
    code: core::ops::Range<u64>,
    pc: u64,
    sp: u64,
) -> Option<(u64, u64, u64)> {
    if !(code.start <= pc && pc.checked_add(RESTORER.len() as u64)? <= code.end) {
        return None;
    }
    // SAFETY: the nine bytes lie in a module's executable range, mapped whole pages;
    // unaligned, as code is.
    let code = unsafe { (pc as *const [u8; 9]).read_unaligned() };
    if code != RESTORER {
        return None;
    }
    let rip = stack.read(sp + RIP)?;
    let rsp = stack.read(sp + RSP)?;
    let rbp = stack.read(sp + RBP)?;
    (rip != 0 && rsp > sp).then_some((rip, rsp, rbp))
}

/// The alternate signal stack `[lo, hi)` when the calling thread is running on it.
pub(crate) fn alt_stack() -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid `stack_t`, which `sigaltstack` only writes.
    let mut ss: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: no new stack is set (null); the current one is written to `ss`.
    if unsafe { libc::sigaltstack(core::ptr::null(), &mut ss) } != 0
        || ss.ss_flags & libc::SS_ONSTACK == 0
    {
        return None;
    }
    let lo = ss.ss_sp as u64;
    Some((lo, lo.checked_add(ss.ss_size as u64)?))
}
