//! Where a reader's bytes come from: this process, or another one, read without stopping it.
//!
//! Both read with `process_vm_readv`, which copies from an address space without running any
//! code in it and fails with an error instead of a fault on an unmapped address, so a wild
//! pointer read from a table costs an error, never a crash. Reading another process needs
//! ptrace access to it (the same user, and `/proc/sys/kernel/yama/ptrace_scope` at most 1 for a
//! process that is not our child; or root), but does not stop it.

use core::fmt;
use mem_trace_format::Plain;

pub(crate) mod extent;

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

/// One range of a vectored read: `len` bytes at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Where the range starts.
    pub addr: u64,
    /// How many bytes it has.
    pub len: usize,
}

/// A source of the traced process's memory.
pub trait Memory {
    /// Fills `buf` from `addr`, wholly or not at all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable>;

    /// Whether `len` bytes from `addr` lie in memory the target has, without a gap:
    /// `Err(extent)` with the bytes it does have there (0: none) when they do not. A reader
    /// checks a count or capacity read from the target this way before it sizes a loop or an
    /// allocation by it, so that a table the program scribbled over costs one line, not a
    /// read of every page it claims. Sources that cannot tell say yes, and their reads fail
    /// where the memory ends.
    fn extent_holds(&self, addr: u64, len: u64) -> Result<(), u64> {
        let _ = (addr, len);
        Ok(())
    }

    /// Reads `spans` one after the other into `buf` (at least as long as their sum) and returns
    /// how many bytes from its start are good: the read stops at the first span it cannot read
    /// (which may be cut short). Sources that can read many ranges in one system call override
    /// it; the leak scan reads thousands of small blocks this way.
    fn read_spans(&self, spans: &[Span], buf: &mut [u8]) -> usize {
        let mut done = 0;
        for s in spans {
            if self.read(s.addr, &mut buf[done..done + s.len]).is_err() {
                break;
            }
            done += s.len;
        }
        done
    }

    /// The runs of `[lo, hi)` whose pages the target has really touched, for a scan of memory
    /// it may have reserved far beyond what it uses: a running process's from
    /// `/proc/PID/pagemap`. Sources that cannot tell give the whole range.
    fn resident(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        if lo < hi {
            vec![(lo, hi)]
        } else {
            Vec::new()
        }
    }
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
    fn extent_holds(&self, addr: u64, len: u64) -> Result<(), u64> {
        extent::process_holds(self.pid, addr, len)
    }

    fn resident(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        extent::process_resident(self.pid, lo, hi)
    }

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

    fn read_spans(&self, spans: &[Span], buf: &mut [u8]) -> usize {
        let mut done = 0;
        for group in spans.chunks(IOV_MAX) {
            let mut remote = [libc::iovec {
                iov_base: core::ptr::null_mut(),
                iov_len: 0,
            }; IOV_MAX];
            let mut want = 0;
            for (r, s) in remote.iter_mut().zip(group) {
                *r = libc::iovec {
                    iov_base: s.addr as *mut libc::c_void,
                    iov_len: s.len,
                };
                want += s.len;
            }
            if want == 0 {
                continue;
            }
            let local = libc::iovec {
                iov_base: buf[done..done + want].as_mut_ptr().cast(),
                iov_len: want,
            };
            // SAFETY: `local` is our own writable buffer, as long as the remote ranges together
            // (the slice above checked it); the remote side is only read, by the kernel, which
            // fails on unmapped memory instead of faulting.
            let n = unsafe {
                libc::process_vm_readv(
                    self.pid,
                    &local,
                    1,
                    remote.as_ptr(),
                    group.len() as libc::c_ulong,
                    0,
                )
            };
            let got = n.max(0) as usize;
            done += got;
            if got < want {
                break;
            }
        }
        done
    }
}

/// At most this many ranges per `process_vm_readv` (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

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

    #[test]
    fn spans_are_read_in_order_up_to_the_first_unreadable_one() {
        let a = [1u64, 2];
        let b = [3u64];
        let span = |v: &[u64]| Span {
            addr: v.as_ptr() as u64,
            len: 8 * v.len(),
        };
        let bad = Span { addr: 0x10, len: 8 };
        let me = Process::this();
        let mut buf = [0u8; 32];
        assert_eq!(me.read_spans(&[span(&a), span(&b)], &mut buf), 24);
        assert_eq!(
            buf[..24],
            [a[0], a[1], b[0]].map(u64::to_ne_bytes).concat()[..]
        );
        assert_eq!(me.read_spans(&[span(&b), bad, span(&a)], &mut buf), 8);
        assert_eq!(me.read_spans(&[bad, span(&a)], &mut buf), 0);
        // The default, one read per span, says the same.
        struct Plain(Process);
        impl Memory for Plain {
            fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
                self.0.read(addr, buf)
            }
        }
        assert_eq!(
            Plain(me).read_spans(&[span(&b), bad, span(&a)], &mut buf),
            8
        );
        let many: Vec<Span> = (0..IOV_MAX + 3).map(|_| span(&b)).collect();
        let mut big = vec![0u8; 8 * many.len()];
        assert_eq!(me.read_spans(&many, &mut big), big.len());
    }
}
