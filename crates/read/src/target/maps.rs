//! `/proc/PID/maps`: a running process's mappings.
//!
//! A line is `start-end perms offset dev inode name`, the name padded with spaces and
//! optional; the kernel escapes a newline in a file name, so one line is one mapping. A file
//! deleted or replaced since it was mapped is named `PATH (deleted)`.

use super::types::Mapping;

/// What the kernel appends to the name of a mapped file that is gone from its path.
pub(super) const DELETED: &str = " (deleted)";

/// The mappings of a maps file's text, by start address; lines that do not parse are skipped
/// (the format has not changed since Linux 2.6, but a reader must not fail on a new field).
pub(super) fn parse(text: &str) -> Vec<Mapping> {
    let mut maps: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
    maps.sort_by_key(|m| m.start);
    maps
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || {
        let s = rest.trim_start_matches(' ');
        let end = s.find(' ').unwrap_or(s.len());
        rest = &s[end..];
        Some(&s[..end]).filter(|f| !f.is_empty())
    };
    let (range, perms, offset, _dev, _inode) = (field()?, field()?, field()?, field()?, field()?);
    let (start, end) = range.split_once('-')?;
    let (start, end) = (hex(start)?, hex(end)?);
    let perms = perms.as_bytes();
    if start >= end || perms.len() < 3 {
        return None;
    }
    Some(Mapping {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset: hex(offset)?,
        name: rest.trim_start_matches(' ').to_string(),
    })
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

/// The mappings of running process `pid`, from `/proc/PID/maps`, by start address; `None`
/// when they cannot be read.
pub fn process_mappings(pid: i32) -> Option<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
7f164201e000-7f1642044000 r--p 00000000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6
55e2747cd000-55e2747ce000 r--p 00000000 fe:00 10012700                   /tmp/my prog
55e2747ce000-55e2747cf000 r-xp 00001000 fe:00 10012700                   /tmp/my prog
55e29a956000-55e29a977000 rw-p 00000000 00:00 0                          [heap]
7f1641d85000-7f1641ffe000 rw-p 00000000 00:00 0 
7f164225c000-7f164231b000 r-xp 00051000 fe:00 5342320                    /opt/libmem_trace.so (deleted)
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_every_kind_of_line_and_sorts_by_address() {
        let m = parse(SAMPLE);
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "/tmp/my prog",
                "/tmp/my prog",
                "[heap]",
                "",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/opt/libmem_trace.so (deleted)",
                "[vsyscall]",
            ]
        );
        assert_eq!(
            m[1],
            Mapping {
                start: 0x55e2_747c_e000,
                end: 0x55e2_747c_f000,
                read: true,
                write: false,
                exec: true,
                offset: 0x1000,
                name: "/tmp/my prog".into(),
            }
        );
        assert!(m[2].read && m[2].write && !m[2].exec);
        assert_eq!(m[5].offset, 0x51000);
        assert!(m[5].name.ends_with(DELETED));
        assert!(!m[6].read && m[6].exec);
    }

    #[test]
    fn rejects_malformed_lines() {
        for line in [
            "",
            "1000-0800 r--p 00000000 fe:00 1 /x",
            "1000 r--p 00000000 fe:00 1 /x",
            "1000-2000 r--p zz fe:00 1 /x",
            "1000-2000 r- 0 fe:00 1 /x",
            "1000-2000 r--p 0 fe:00",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
        assert!(parse_line("1000-2000 r--p 0 fe:00 1").is_some());
    }
}
