//! Which of the process's mappings holds an address, read from `/proc/self/maps` with plain
//! system calls into fixed buffers (no allocation, no stdio lock): for the rare pointer that
//! no block the tracer knows holds, to tell wild pointers from heap memory before anything
//! reads through them. It costs a pass over the whole file, so it is not for hot paths.

use core::fmt;
use mem_trace_read::text::QuotedBytes;

/// Longest mapping name kept; longer paths are cut (the report shows the start).
const NAME_MAX: usize = 120;

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    perms: [u8; 4],
    name: [u8; NAME_MAX],
    name_len: usize,
}

impl Mapping {
    /// Whether the mapping may be read.
    pub fn readable(&self) -> bool {
        self.perms[0] == b'r'
    }

    /// Whether the mapping may be written.
    pub fn writable(&self) -> bool {
        self.perms[1] == b'w'
    }

    /// The file or pseudo-file name (`[heap]`, `[stack]`, a path), empty for anonymous memory.
    pub fn name(&self) -> &[u8] {
        &self.name[..self.name_len]
    }

    /// Whether a malloc heap can live here: the program break (`[heap]`) or anonymous memory,
    /// where glibc puts its other arenas and its `mmap`ed blocks (a named anonymous mapping,
    /// `[anon:...]`, is anonymous too).
    pub fn may_hold_heap(&self) -> bool {
        let name = self.name();
        self.readable()
            && self.writable()
            && (name.is_empty() || name == b"[heap]" || name.starts_with(b"[anon"))
    }

    /// Whether `[from, to)` lies inside.
    pub fn holds(&self, from: u64, to: u64) -> bool {
        self.start <= from && from <= to && to <= self.end
    }
}

impl fmt::Display for Mapping {
    /// `[0x…, 0x…) rw-p "/path"`, the name quoted and escaped as every text of the program's is
    /// (`read::text::QuotedBytes`): a file name is the program's data.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let perms = core::str::from_utf8(&self.perms).unwrap_or("????");
        write!(f, "[{:#x}, {:#x}) {perms} ", self.start, self.end)?;
        match self.name_len {
            0 => f.write_str("(anonymous)"),
            _ => write!(f, "{}", QuotedBytes(self.name())),
        }
    }
}

/// Where an address lies among the mappings.
#[derive(Clone, Copy, Debug)]
pub enum Place {
    /// In this mapping.
    In(Mapping),
    /// In no mapping.
    Unmapped,
    /// `/proc/self/maps` could not be read (no `/proc`, out of file descriptors).
    Unknown,
}

/// Finds the mapping that holds `addr`.
pub fn find(addr: u64) -> Place {
    // SAFETY: a NUL-terminated path; the descriptor is closed below on every path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Place::Unknown;
    }
    let mut lines = Lines::new(fd);
    let mut place = Place::Unmapped;
    let mut complete = false;
    while let Some(line) = lines.next() {
        match line {
            Some(m) if m.start <= addr && addr < m.end => {
                place = Place::In(m);
                break;
            }
            // Lines come sorted by address: nothing further can hold it.
            Some(m) if m.start > addr => {
                complete = true;
                break;
            }
            _ => {}
        }
    }
    complete |= lines.at_end;
    let failed = lines.failed;
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
    match place {
        Place::Unmapped if failed || !complete => Place::Unknown,
        p => p,
    }
}

/// Calls `f` on every mapping of the process, in address order; whether the whole file was
/// read.
pub fn for_each(mut f: impl FnMut(&Mapping)) -> bool {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut lines = Lines::new(fd);
    while let Some(line) = lines.next() {
        if let Some(m) = line {
            f(&m);
        }
    }
    let failed = lines.failed;
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
    !failed
}

/// Reads a maps file line by line through a fixed buffer.
struct Lines {
    fd: i32,
    buf: [u8; 1024],
    len: usize,
    at_end: bool,
    failed: bool,
}

impl Lines {
    fn new(fd: i32) -> Self {
        Lines {
            fd,
            buf: [0; 1024],
            len: 0,
            at_end: false,
            failed: false,
        }
    }

    /// The next line, parsed (`Some(None)`: a line that did not parse); `None` at the end.
    fn next(&mut self) -> Option<Option<Mapping>> {
        loop {
            if let Some(nl) = self.buf[..self.len].iter().position(|&c| c == b'\n') {
                let m = parse(&self.buf[..nl]);
                self.buf.copy_within(nl + 1..self.len, 0);
                self.len -= nl + 1;
                return Some(m);
            }
            if self.at_end {
                if self.len == 0 {
                    return None;
                }
                let m = parse(&self.buf[..self.len]);
                self.len = 0;
                return Some(m);
            }
            if self.len == self.buf.len() {
                // A line longer than the buffer (a long path): keep its start, which holds
                // everything but the end of the name, and drop the rest up to its newline.
                let m = parse(&self.buf[..self.len]);
                self.skip_to_newline();
                return Some(m);
            }
            self.fill();
        }
    }

    fn fill(&mut self) {
        loop {
            // SAFETY: reads into the unused tail of our own buffer.
            let n = unsafe {
                libc::read(
                    self.fd,
                    self.buf[self.len..].as_mut_ptr().cast(),
                    self.buf.len() - self.len,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            match n {
                n if n > 0 => self.len += n as usize,
                0 => self.at_end = true,
                _ => {
                    self.at_end = true;
                    self.failed = true;
                }
            }
            return;
        }
    }

    fn skip_to_newline(&mut self) {
        self.len = 0;
        while !self.at_end {
            self.fill();
            if let Some(nl) = self.buf[..self.len].iter().position(|&c| c == b'\n') {
                self.buf.copy_within(nl + 1..self.len, 0);
                self.len -= nl + 1;
                return;
            }
            self.len = 0;
        }
    }
}

/// Parses `start-end perms offset dev inode [name]`.
fn parse(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.splitn(6, |&c| c == b' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let (_offset, _dev, _inode) = (fields.next()?, fields.next()?, fields.next()?);
    let name = fields.next().unwrap_or(&[]);
    let name = match name.iter().position(|&c| c != b' ') {
        Some(i) => &name[i..],
        None => &[],
    };
    let dash = range.iter().position(|&c| c == b'-')?;
    let mut m = Mapping {
        start: hex(&range[..dash])?,
        end: hex(&range[dash + 1..])?,
        perms: perms.try_into().ok()?,
        name: [0; NAME_MAX],
        name_len: name.len().min(NAME_MAX),
    };
    m.name[..m.name_len].copy_from_slice(&name[..m.name_len]);
    Some(m)
}

fn hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0u64, |v, &c| {
        let d = (c as char).to_digit(16)?;
        Some(v << 4 | u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let m = parse(b"7f00a000-7f00b000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((m.start, m.end), (0x7f00a000, 0x7f00b000));
        assert!(m.readable() && m.writable() && m.may_hold_heap());
        assert_eq!(m.name(), b"");
        let m = parse(b"55d0-55e0 rw-p 00000000 00:00 0                          [heap]").unwrap();
        assert!(m.may_hold_heap());
        let m = parse(b"5600-5700 r--p 00001000 08:01 1234    /usr/lib/x y.so").unwrap();
        assert_eq!(m.name(), b"/usr/lib/x y.so");
        assert!(!m.writable() && !m.may_hold_heap());
        assert_eq!(format!("{m}"), "[0x5600, 0x5700) r--p \"/usr/lib/x y.so\"");
        let m = parse(b"5600-5700 rw-p 00000000 08:01 1234    /tmp/a\x1b[31m").unwrap();
        assert_eq!(format!("{m}"), "[0x5600, 0x5700) rw-p \"/tmp/a\\x1b[31m\"");
        assert!(parse(b"zz-10 rw-p 0 0 0").is_none());
        assert!(parse(b"").is_none());
    }

    #[test]
    fn finds_own_memory_and_not_low_addresses() {
        let on_heap = Box::new(7u64);
        let at = &*on_heap as *const u64 as u64;
        match find(at) {
            Place::In(m) => assert!(m.readable() && m.writable() && m.start <= at && at < m.end),
            _ => panic!("a live Box is in no mapping"),
        }
        assert!(matches!(find(0x10), Place::Unmapped));
        let code = finds_own_memory_and_not_low_addresses as *const () as u64;
        match find(code) {
            Place::In(m) => assert!(!m.may_hold_heap()),
            _ => panic!("this function's code is in no mapping"),
        }
    }
}
