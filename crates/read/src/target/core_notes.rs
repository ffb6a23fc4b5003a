//! The notes of an x86_64 Linux core file (`CORE` notes in its `PT_NOTE` segments): the mapped
//! files (`NT_FILE`), one `NT_PRSTATUS` per thread, the process's name and arguments
//! (`NT_PRPSINFO`) and its auxiliary vector (`NT_AUXV`). Layouts are the kernel's
//! (`include/linux/elfcore.h`, `fs/binfmt_elf.c`), which gdb's `gcore` writes too.
//!
//! Everything is bounded by the note's own size: a count that does not fit is an error.

use super::types::ThreadState;
use object::elf::{FileHeader64, NT_AUXV, NT_FILE, NT_PRPSINFO, NT_PRSTATUS};
use object::read::elf::NoteIterator;
use object::LittleEndian as LE;

/// `struct elf_prstatus`: offset of `pr_pid` (the thread's id) and of `pr_reg`.
const PRSTATUS_PID: usize = 32;
const PRSTATUS_REG: usize = 112;
/// `struct user_regs_struct`: 27 words, `rsp` the 20th.
const REGISTERS: usize = 27;
const RSP: usize = 19;
/// `struct elf_prpsinfo`: `pr_fname[16]` and `pr_psargs[80]`.
const PRPSINFO_FNAME: core::ops::Range<usize> = 40..56;
const PRPSINFO_PSARGS: core::ops::Range<usize> = 56..136;

/// Auxiliary vector entries used: the executable's program headers, its file name.
pub(super) const AT_PHDR: u64 = 3;
pub(super) const AT_EXECFN: u64 = 31;

/// One `NT_FILE` entry: a mapping of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileEntry {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Offset in the file, in bytes.
    pub(super) offset: u64,
    pub(super) path: String,
}

/// What the notes say.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Notes {
    /// `None` when the core has no `NT_FILE` note.
    pub(super) files: Option<Vec<FileEntry>>,
    pub(super) threads: Vec<ThreadState>,
    /// `pr_fname`: the executable's name, cut to 15 bytes.
    pub(super) fname: Option<String>,
    /// `pr_psargs`: the command line, cut to 79 bytes.
    pub(super) psargs: Option<String>,
    pub(super) auxv: Vec<(u64, u64)>,
}

impl Notes {
    /// Auxiliary vector entry `key`.
    pub(super) fn aux(&self, key: u64) -> Option<u64> {
        self.auxv.iter().find(|&&(k, _)| k == key).map(|&(_, v)| v)
    }

    /// Adds the notes of one `PT_NOTE` segment (`align`: its `p_align`).
    pub(super) fn add_segment(&mut self, bytes: &[u8], align: u64) -> Result<(), String> {
        let mut notes = NoteIterator::<FileHeader64<LE>>::new(LE, align, bytes)
            .map_err(|e| format!("a note segment: {e}"))?;
        while let Some(note) = notes.next().map_err(|e| format!("a malformed note: {e}"))? {
            if note.name() != object::elf::ELF_NOTE_CORE {
                continue;
            }
            let desc = note.desc();
            match note.n_type(LE) {
                NT_FILE if self.files.is_none() => self.files = Some(file_entries(desc)?),
                NT_PRSTATUS => self.threads.push(prstatus(desc)?),
                NT_PRPSINFO if desc.len() >= PRPSINFO_PSARGS.end => {
                    self.fname = Some(c_string(&desc[PRPSINFO_FNAME]));
                    self.psargs = Some(c_string(&desc[PRPSINFO_PSARGS]));
                }
                NT_AUXV => {
                    self.auxv = words(desc)
                        .collect::<Vec<_>>()
                        .chunks_exact(2)
                        .map(|kv| (kv[0], kv[1]))
                        .take_while(|&(k, _)| k != 0)
                        .collect();
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
}

/// A NUL-padded C string.
fn c_string(bytes: &[u8]) -> String {
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..len]).into_owned()
}

/// `NT_FILE`: `count`, `page_size`, `count` × (start, end, offset in pages), then `count`
/// NUL-terminated paths.
fn file_entries(desc: &[u8]) -> Result<Vec<FileEntry>, String> {
    let bad = |what: &str| format!("its NT_FILE note {what}");
    let mut w = words(desc);
    let (count, page_size) = (
        w.next().ok_or_else(|| bad("is empty"))?,
        w.next().ok_or_else(|| bad("is cut short"))?,
    );
    let table = count
        .checked_mul(24)
        .and_then(|t| t.checked_add(16))
        .filter(|&t| t <= desc.len() as u64)
        .ok_or_else(|| bad(&format!("lists {count} files in {} bytes", desc.len())))?
        as usize;
    if !page_size.is_power_of_two() || page_size > 1 << 30 {
        return Err(bad(&format!("gives a page size of {page_size}")));
    }
    let mut names = desc[table..].split(|&b| b == 0);
    let ranges: Vec<u64> = w.take(count as usize * 3).collect();
    ranges
        .chunks_exact(3)
        .map(|r| {
            let name = names
                .next()
                .ok_or_else(|| bad("has fewer names than files"))?;
            let offset = r[2]
                .checked_mul(page_size)
                .ok_or_else(|| bad("gives an offset past 2^64"))?;
            if r[0] >= r[1] {
                return Err(bad(&format!("maps {:#x}-{:#x}", r[0], r[1])));
            }
            Ok(FileEntry {
                start: r[0],
                end: r[1],
                offset,
                path: String::from_utf8_lossy(name).into_owned(),
            })
        })
        .collect()
}

/// `NT_PRSTATUS`: the thread's id and general registers.
fn prstatus(desc: &[u8]) -> Result<ThreadState, String> {
    let regs = desc
        .get(PRSTATUS_REG..PRSTATUS_REG + REGISTERS * 8)
        .ok_or_else(|| format!("an NT_PRSTATUS note of {} bytes", desc.len()))?;
    let registers: Vec<u64> = words(regs).collect();
    let tid = u32::from_le_bytes(desc[PRSTATUS_PID..PRSTATUS_PID + 4].try_into().expect("4"));
    Ok(ThreadState {
        tid,
        sp: Some(registers[RSP]),
        registers,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Words as their little-endian bytes.
    pub(in crate::target) fn le_words(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// One note: header, name padded to 4, descriptor padded to 4.
    pub(in crate::target) fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(name);
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend_from_slice(desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    /// An `NT_FILE` note mapping (start, end, offset in pages, path).
    pub(in crate::target) fn nt_file(entries: &[(u64, u64, u64, &str)]) -> Vec<u8> {
        note(b"CORE", 0x4649_4c45, &nt_file_desc(entries))
    }

    fn nt_file_desc(entries: &[(u64, u64, u64, &str)]) -> Vec<u8> {
        let mut d = le_words(&[entries.len() as u64, 4096]);
        for &(s, e, pages, _) in entries {
            d.extend(le_words(&[s, e, pages]));
        }
        for &(_, _, _, p) in entries {
            d.extend_from_slice(p.as_bytes());
            d.push(0);
        }
        d
    }

    /// An `NT_PRSTATUS` note of thread `tid` stopped with `rsp`.
    pub(in crate::target) fn nt_prstatus(tid: u32, rsp: u64) -> Vec<u8> {
        note(b"CORE", 1, &prstatus_desc(tid, rsp))
    }

    fn prstatus_desc(tid: u32, rsp: u64) -> Vec<u8> {
        let mut d = vec![0u8; 336];
        d[PRSTATUS_PID..PRSTATUS_PID + 4].copy_from_slice(&tid.to_le_bytes());
        for i in 0..REGISTERS {
            let at = PRSTATUS_REG + i * 8;
            let v = if i == RSP { rsp } else { 0x100 + i as u64 };
            d[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        d
    }

    #[test]
    fn decodes_files_threads_names_and_auxv() {
        let mut prpsinfo = vec![0u8; 136];
        prpsinfo[PRPSINFO_FNAME][..4].copy_from_slice(b"prog");
        prpsinfo[PRPSINFO_PSARGS][..11].copy_from_slice(b"./prog -v 3");
        let auxv = le_words(&[AT_PHDR, 0x5000_0040, AT_EXECFN, 0x7ff0, 0, 0, 99, 99]);
        let segment = [
            nt_prstatus(11, 0x7ffd_0000),
            note(b"CORE", 3, &prpsinfo),
            note(b"LINUX", 0x202, &[1, 2, 3, 4]),
            note(b"CORE", 6, &auxv),
            nt_file(&[
                (0x5000_0000, 0x5000_1000, 0, "/bin/prog"),
                (0x5000_1000, 0x5000_3000, 1, "/bin/prog"),
                (0x7f00_0000, 0x7f00_1000, 0, "/lib/lib x.so (deleted)"),
            ]),
            nt_prstatus(12, 0x7ffe_0000),
        ]
        .concat();
        let mut n = Notes::default();
        n.add_segment(&segment, 4).unwrap();
        assert_eq!(n.fname.as_deref(), Some("prog"));
        assert_eq!(n.psargs.as_deref(), Some("./prog -v 3"));
        assert_eq!(n.aux(AT_PHDR), Some(0x5000_0040));
        assert_eq!(n.aux(AT_EXECFN), Some(0x7ff0));
        assert_eq!(n.aux(99), None, "entries after AT_NULL are not read");
        let files = n.files.unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files[1],
            FileEntry {
                start: 0x5000_1000,
                end: 0x5000_3000,
                offset: 4096,
                path: "/bin/prog".into()
            }
        );
        assert_eq!(files[2].path, "/lib/lib x.so (deleted)");
        let tids: Vec<(u32, Option<u64>)> = n.threads.iter().map(|t| (t.tid, t.sp)).collect();
        assert_eq!(tids, [(11, Some(0x7ffd_0000)), (12, Some(0x7ffe_0000))]);
        assert_eq!(n.threads[0].registers.len(), 27);
        assert_eq!(n.threads[0].registers[0], 0x100);
    }

    #[test]
    fn refuses_counts_past_the_note() {
        let mut huge = nt_file_desc(&[(0x1000, 0x2000, 0, "/x")]);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut n = Notes::default();
        let e = n
            .add_segment(&note(b"CORE", 0x4649_4c45, &huge), 4)
            .unwrap_err();
        assert!(
            e.contains("NT_FILE note lists 18446744073709551615 files"),
            "{e}"
        );

        let mut nameless = nt_file_desc(&[(0x1000, 0x2000, 0, "/x")]);
        nameless.truncate(nameless.len() - 3);
        nameless[..8].copy_from_slice(&1u64.to_le_bytes());
        let files = file_entries(&nameless).unwrap();
        assert_eq!(files[0].path, "");

        let e = Notes::default()
            .add_segment(&note(b"CORE", 1, &[0; 40]), 4)
            .unwrap_err();
        assert_eq!(e, "an NT_PRSTATUS note of 40 bytes");

        let mut cut = note(b"CORE", 6, &[0; 64]);
        cut.truncate(30);
        assert!(Notes::default().add_segment(&cut, 4).is_err());
    }
}
