//! Whether the thread chosen to load the tracer is itself inside the loader, holding one of
//! its locks: a library's constructor (glibc 2.36 runs it from `dlopen` with `dl_load_lock`
//! held) blocked in `read` or calling `malloc`, or a `dl_iterate_phdr` callback (with
//! `dl_load_write_lock` held). Those locks are recursive mutexes, so the probes of `locks`
//! pass on that thread, and a `dlopen` called there would nest inside the loader's work at an
//! arbitrary point.
//!
//! The answer is the lock's owner, read from `_rtld_global` (ld.so's exported
//! `GLIBC_PRIVATE` object, its size in the dynamic symbol table of a stripped ld.so too): a
//! `pthread_mutex_t` keeps its owner's thread id at offset 8 and its recursion count at 4.
//! Where the lock lies in `_rtld_global` differs between glibc builds, so it is found, not
//! assumed: the probe that takes the lock (`dladdr`, `dl_iterate_phdr`) is single-stepped on
//! the chosen thread until it reaches the code it runs with the lock taken
//! (`_dl_find_dso_for_object`, the callback); there the one recursive mutex of
//! `_rtld_global` that the thread owns one level deeper than before the call is the lock.
//! Its owner before the call is the answer. A probe that reaches `futex` first waits for
//! the lock: another thread holds it, so the chosen thread does not.

use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use std::time::{Duration, Instant};

/// `pthread_mutex_t` on x86-64 glibc: `__count`, `__owner`, `__kind`, and its size.
const COUNT: usize = 4;
const OWNER: usize = 8;
const KIND: usize = 16;
const MUTEX: usize = 40;
/// `PTHREAD_MUTEX_KIND_MASK_NP` and `PTHREAD_MUTEX_RECURSIVE_NP`: the loader's locks are
/// `__rtld_lock_define_recursive`.
const KIND_MASK: u32 = 3;
const RECURSIVE: u32 = 1;
/// How many instructions a probe is stepped before it must have reached its code (glibc
/// 2.36: 64 for `dladdr`, 863 the first time, when libc's PLT slot for
/// `_dl_find_dso_for_object` is bound lazily on the way; 95 for `dl_iterate_phdr`).
const STEP_LIMIT: usize = 20_000;
/// `futex`, where a thread waits for a mutex it does not own.
const SYS_FUTEX: u64 = 202;

/// What the chosen thread held before a probe's call, as far as it could be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// It owned the probe's lock: it is inside the loader.
    ByIt,
    /// Another thread, or none.
    NotByIt,
    /// Not known: the probe does not look, or a signal came while it was stepped.
    Unknown,
}

/// Where a probe holds its lock, and where the loader's locks are.
#[derive(Clone, Copy, Debug)]
pub struct Reach {
    /// Code `[start, end)` that the probe runs with its lock taken.
    pub code: (u64, u64),
    /// `_rtld_global`: address and size.
    pub data: (u64, usize),
}

impl Reach {
    fn read(&self, mem: &Memory, tid: i32) -> Result<Vec<u8>, String> {
        let mut bytes = vec![0; self.data.1];
        mem.read(self.data.0, &mut bytes)
            .map_err(|e| format!("cannot read the loader's state (_rtld_global): {e}"))?;
        if bytes.len() < MUTEX {
            return Err(format!(
                "the loader's state is {} bytes, too small to hold its locks (thread {tid})",
                bytes.len()
            ));
        }
        Ok(bytes)
    }
}

/// Steps the probe's call, prepared on the stopped thread `tid` and not resumed, until it
/// reaches `reach.code`, and tells whether the thread owned the lock it takes there before.
/// The thread is left stopped, to be resumed by the caller (delivering a signal it stopped
/// for).
pub fn held_before(
    threads: &mut Threads,
    mem: &Memory,
    tid: i32,
    reach: &Reach,
    name: &str,
) -> Result<Held, String> {
    let before = reach.read(mem, tid)?;
    let deadline = Instant::now() + Duration::from_secs(2);
    for steps in 0..STEP_LIMIT {
        let r = ptrace::regs(tid).map_err(|e| format!("thread {tid}: {e}"))?;
        if (reach.code.0..reach.code.1).contains(&r.rip) {
            let during = reach.read(mem, tid)?;
            let at = taken(&before, &during, tid).ok_or_else(|| {
                format!(
                    "thread {tid} reached the code {name} runs with the loader's lock held, \
                     but no lock of the loader's is taken by it there: this glibc's loader \
                     is not understood, nothing was loaded"
                )
            })?;
            super::debug::debug(format_args!(
                "{name}: the lock is _rtld_global+{at:#x}, owner {} before ({steps} steps)",
                field(&before, at + OWNER)
            ));
            return Ok(if owned(&before, at, tid) {
                Held::ByIt
            } else {
                Held::NotByIt
            });
        }
        let mut insn = [0u8; 2];
        mem.read(r.rip, &mut insn)
            .map_err(|e| format!("cannot read thread {tid}'s code: {e}"))?;
        if insn == [0x0f, 0x05] {
            // Waiting for the lock: another thread owns it, so this one does not.
            super::debug::debug(format_args!("{name}: system call {} on the way", r.rax));
            return Ok(if r.rax == SYS_FUTEX {
                Held::NotByIt
            } else {
                Held::Unknown
            });
        }
        match threads
            .step(tid, deadline)
            .map_err(|e| format!("while stepping {name} on thread {tid}: {e}"))?
        {
            Stop::Stepped => {}
            Stop::Exited => return Err(format!("thread {tid} exited during {name}")),
            // A signal for the program, delivered when the caller resumes the thread.
            Stop::Signal(_) | Stop::Interrupted | Stop::Breakpoint(_) => return Ok(Held::Unknown),
        }
    }
    Err(format!(
        "{name} on thread {tid} did not reach the code it runs with the loader's lock held \
         within {STEP_LIMIT} instructions: this glibc's loader is not understood, nothing \
         was loaded"
    ))
}

fn field(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
}

fn recursive_mutex_at(bytes: &[u8], at: usize) -> bool {
    at + MUTEX <= bytes.len() && field(bytes, at + KIND) & KIND_MASK == RECURSIVE
}

/// The offset of the one recursive mutex that `tid` owns in `during` with a count one more
/// than in `before`: the lock taken between the two. `None` if none or several are.
pub fn taken(before: &[u8], during: &[u8], tid: i32) -> Option<usize> {
    let mut found = None;
    for at in (0..during.len().min(before.len())).step_by(8) {
        if !recursive_mutex_at(during, at) || field(during, at + OWNER) != tid as u32 {
            continue;
        }
        if field(during, at + COUNT) != field(before, at + COUNT).wrapping_add(1) {
            continue;
        }
        if found.replace(at).is_some() {
            return None;
        }
    }
    found
}

/// Whether `tid` owned the recursive mutex at `at` in `bytes`.
pub fn owned(bytes: &[u8], at: usize, tid: i32) -> bool {
    recursive_mutex_at(bytes, at)
        && field(bytes, at + OWNER) == tid as u32
        && field(bytes, at + COUNT) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `n` bytes with a recursive mutex at each of `mutexes`: (offset, owner,
    /// count).
    fn state(n: usize, mutexes: &[(usize, i32, u32)]) -> Vec<u8> {
        let mut b = vec![0xa5u8; n];
        for &(at, owner, count) in mutexes {
            b[at..(at + MUTEX).min(n)].fill(0);
            b[at + COUNT..at + COUNT + 4].copy_from_slice(&count.to_le_bytes());
            b[at + OWNER..at + OWNER + 4].copy_from_slice(&owner.to_le_bytes());
            b[at + KIND..at + KIND + 4].copy_from_slice(&RECURSIVE.to_le_bytes());
        }
        b
    }

    #[test]
    fn the_lock_taken_between_two_reads_is_found_and_its_former_owner_told() {
        // The loader's lock at 0xa08, its list lock at 0xa30 held by another thread.
        let before = state(4336, &[(0xa08, 0, 0), (0xa30, 77, 1)]);
        let during = state(4336, &[(0xa08, 42, 1), (0xa30, 77, 1)]);
        assert_eq!(taken(&before, &during, 42), Some(0xa08));
        assert!(!owned(&before, 0xa08, 42));
        // Taken again by the thread that held it: one level deeper.
        let before = state(4336, &[(0xa08, 42, 1)]);
        let during = state(4336, &[(0xa08, 42, 2)]);
        assert_eq!(taken(&before, &during, 42), Some(0xa08));
        assert!(owned(&before, 0xa08, 42));
    }

    #[test]
    fn no_lock_or_an_ambiguous_one_is_no_answer() {
        let before = state(4336, &[(0xa08, 0, 0), (0x100, 0, 0)]);
        // Held by another thread, or owned but not one level deeper.
        assert_eq!(taken(&before, &state(4336, &[(0xa08, 9, 1)]), 42), None);
        assert_eq!(taken(&before, &state(4336, &[(0xa08, 42, 3)]), 42), None);
        // Two taken: which one the probe took cannot be told.
        let during = state(4336, &[(0xa08, 42, 1), (0x100, 42, 1)]);
        assert_eq!(taken(&before, &during, 42), None);
        // A mutex of another kind (a plain one, kind 0) is none of the loader's.
        let mut during = state(4336, &[(0xa08, 42, 1)]);
        during[0xa08 + KIND] = 0;
        assert_eq!(taken(&before, &during, 42), None);
        // Too near the end to be a whole mutex.
        let before = state(48, &[(0x18, 0, 0)]);
        let during = state(48, &[(0x18, 42, 1)]);
        assert_eq!(taken(&before, &during, 42), None);
    }
}
