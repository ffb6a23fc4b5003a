//! Where a reader's bytes come from: this process, or another one, read without stopping it.
//!
//! Both read with `process_vm_readv`, which copies from an address space without running any
//! code in it and fails with an error instead of a fault on an unmapped address, so a wild
//! pointer read from a table costs an error, never a crash. Reading another process needs
//! ptrace access to it (the same user, and `/proc/sys/kernel/yama/ptrace_scope` at most 1 for a
//! process that is not our child; or root), but does not stop it.

use core::fmt;
use mem_trace_format::Plain;

/// A read that could not be done: `len` bytes at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// Where the read started.
    pub addr: u64,
    /// How many bytes were asked for.
    pub len: usize,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot read {} bytes at {:#x}", self.len, self.addr)
    }
}

impl std::error::Error for Unreadable {}

/// A source of the traced process's memory.
pub trait Memory {
    /// Fills `buf` from `addr`, wholly or not at all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable>;
}

/// Reads a layout value (a header, a shard, a record) at `addr`.
pub fn read_plain<T: Plain>(mem: &(impl Memory + ?Sized), addr: u64) -> Result<T, Unreadable> {
    let mut v = core::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the buffer is the value's own bytes, `size_of::<T>()` long and initialised
    // (zeroed above).
    let bytes = unsafe {
        core::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), core::mem::size_of::<T>())
    };
    mem.read(addr, bytes)?;
    // SAFETY: `T: Plain`: any bytes are a valid `T`.
    Ok(unsafe { v.assume_init() })
}

/// Reads `n` consecutive `u64` words at `addr`.
pub fn read_words(
    mem: &(impl Memory + ?Sized),
    addr: u64,
    n: usize,
) -> Result<Vec<u64>, Unreadable> {
    let mut bytes = vec![0u8; n * 8];
    mem.read(addr, &mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
        .collect())
}

/// Another process (or this one), by pid.
#[derive(Clone, Copy, Debug)]
pub struct Process {
    pid: libc::pid_t,
}

impl Process {
    /// The process `pid`.
    pub fn new(pid: i32) -> Self {
        Process { pid }
    }

    /// The calling process itself.
    pub fn this() -> Self {
        // SAFETY: getpid has no preconditions.
        Process::new(unsafe { libc::getpid() })
    }
}

impl Process {
    /// One `process_vm_readv` of `buf` at `addr`: the bytes copied, or the errno.
    fn read_once(&self, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` is our own writable buffer of that length; the remote side is
        // only read, by the kernel, which checks it.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => Ok(n as usize),
            0 => Err(libc::EFAULT),
            _ => Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EFAULT)),
        }
    }

    /// Whether this process may be read at all: reads one byte at `addr` (an address that is
    /// mapped and readable) and returns the errno of a failure: `EPERM` when ptrace rules
    /// forbid it, `ESRCH` when the process is gone.
    pub(crate) fn probe(&self, addr: u64) -> Result<(), i32> {
        self.read_once(addr, &mut [0u8]).map(drop)
    }
}

impl Memory for Process {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
        let fail = Unreadable {
            addr,
            len: buf.len(),
        };
        let mut done = 0;
        while done < buf.len() {
            done += self
                .read_once(addr.wrapping_add(done as u64), &mut buf[done..])
                .map_err(|_| fail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_refuses_unmapped_memory() {
        let v = [0x1122_3344_5566_7788u64, 42];
        let me = Process::this();
        assert_eq!(read_words(&me, v.as_ptr() as u64, 2).unwrap(), v);
        assert_eq!(read_plain::<u64>(&me, v.as_ptr() as u64 + 8).unwrap(), 42);
        let err = read_words(&me, 0x10, 1).unwrap_err();
        assert_eq!(err, Unreadable { addr: 0x10, len: 8 });
        assert_eq!(err.to_string(), "cannot read 8 bytes at 0x10");
    }
}
