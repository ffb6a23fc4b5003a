//! The target's memory, read and written through /proc/PID/mem (which a tracer may use
//! while the threads run, and which writes through read-only code pages, for breakpoints).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A traced process's memory.
pub struct Memory(File);

impl Memory {
    /// Opens `pid`'s memory for reading and writing (the caller traces it).
    pub fn open(pid: i32) -> io::Result<Memory> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map(Memory)
    }

    /// Reads `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(buf, addr)
    }

    /// The 8 bytes at `addr`.
    pub fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `data` at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, addr)
    }
}

/// Reads 4 bytes of `pid`'s memory at `addr` without tracing it (a process of the same user,
/// or as root): for the checks made before anything is done to the process.
pub fn peek_u32(pid: i32, addr: u64) -> io::Result<u32> {
    let mut b = [0u8; 4];
    let local = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 4,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 4,
    };
    // SAFETY: one local buffer of 4 bytes; the remote side is only read.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n != 4 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::from_le_bytes(b))
}
