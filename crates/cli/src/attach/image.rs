//! What is mapped in the target (/proc/PID/maps) and where a module's exported functions are
//! there: libc's `malloc`, `free`, `dlopen`, `dlerror`, the library's entry points.

use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Endianness, Object, ObjectSection, ObjectSymbol};
use std::io;
use std::path::{Path, PathBuf};

/// A file mapped in the target.
#[derive(Clone, Debug)]
pub struct Module {
    /// Its path, as the target sees it.
    pub path: PathBuf,
    /// Where its mappings are, `[start, end)`.
    pub ranges: Vec<(u64, u64)>,
    /// The start of its mapping at file offset 0.
    first: u64,
}

impl Module {
    /// Whether `addr` lies in one of its mappings.
    pub fn contains(&self, addr: u64) -> bool {
        self.ranges.iter().any(|&(lo, hi)| (lo..hi).contains(&addr))
    }

    /// The file's name.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The file-backed mappings of `pid`, one [`Module`] per file mapped at offset 0.
pub fn modules(pid: i32) -> io::Result<Vec<Module>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
}

/// [`modules`] of a maps text. Only files the loader mapped count: one with an executable
/// mapping. A file mapped read-only is data, such as the ELF files the tracer's unwinder maps
/// to read their CFI, which would otherwise be taken for the module (seen: libc's `dlopen`
/// looked for in the unwinder's copy of libc.so.6, and the call faulting there).
pub fn parse_maps(text: &str) -> Vec<Module> {
    let mut out: Vec<(Module, bool)> = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path: String = f.collect::<Vec<_>>().join(" ");
        if !path.starts_with('/') {
            continue;
        }
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi), Ok(offset)) = (
            u64::from_str_radix(lo, 16),
            u64::from_str_radix(hi, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        let path = PathBuf::from(path);
        let exec = perms.contains('x');
        match out.iter_mut().rev().find(|(m, _)| m.path == path) {
            Some((m, x)) if offset != 0 => {
                m.ranges.push((lo, hi));
                *x |= exec;
            }
            _ if offset == 0 => out.push((
                Module {
                    path,
                    ranges: vec![(lo, hi)],
                    first: lo,
                },
                exec,
            )),
            _ => {}
        }
    }
    out.into_iter()
        .filter(|&(_, x)| x)
        .map(|(m, _)| m)
        .collect()
}

/// The module whose file name starts with `prefix` (`libc.so.6`, `ld-linux`).
pub fn find<'a>(modules: &'a [Module], prefix: &str) -> Option<&'a Module> {
    modules.iter().find(|m| m.file_name().starts_with(prefix))
}

/// A module's ELF file, read through the target's root (its mount namespace's view).
pub struct Image {
    data: Vec<u8>,
    /// Added to a symbol's value: where the module is loaded.
    bias: u64,
    path: PathBuf,
}

impl Image {
    /// Reads `m`'s file as `pid` sees it.
    pub fn read(pid: i32, m: &Module) -> io::Result<Image> {
        let rooted = Path::new(&format!("/proc/{pid}/root"))
            .join(m.path.strip_prefix("/").unwrap_or(&m.path));
        let data = std::fs::read(&rooted).or_else(|_| std::fs::read(&m.path))?;
        let elf = parse(&data, &m.path)?;
        let lowest = elf
            .elf_program_headers()
            .iter()
            .filter(|p| p.p_type(Endianness::Little) == object::elf::PT_LOAD)
            .map(|p| p.p_vaddr(Endianness::Little))
            .min()
            .unwrap_or(0);
        Ok(Image {
            bias: m.first.wrapping_sub(lowest & !0xfff),
            data,
            path: m.path.clone(),
        })
    }

    /// Where the exported symbol `name` is in the target (a defined dynamic symbol).
    pub fn symbol(&self, name: &str) -> io::Result<u64> {
        self.defined(name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} exports no {name}", self.path.display()),
            )
        })
    }

    /// [`Image::symbol`], `None` when the module does not define it.
    pub fn defined(&self, name: &str) -> Option<u64> {
        let elf = parse(&self.data, &self.path).ok()?;
        elf.dynamic_symbols()
            .find(|s| s.is_definition() && s.name() == Ok(name) && s.address() != 0)
            .map(|s| self.bias.wrapping_add(s.address()))
    }

    /// The file's bytes that are mapped at `addr`, `n` of them, when one loaded segment
    /// holds them all: what the code there was before anything wrote to it.
    pub fn file_bytes(&self, addr: u64, n: usize) -> Option<&[u8]> {
        let elf = parse(&self.data, &self.path).ok()?;
        let vaddr = addr.wrapping_sub(self.bias);
        elf.elf_program_headers().iter().find_map(|p| {
            let e = Endianness::Little;
            let (at, size) = (p.p_vaddr(e), p.p_filesz(e));
            if p.p_type(e) != object::elf::PT_LOAD || vaddr < at || vaddr + n as u64 > at + size {
                return None;
            }
            let offset = (p.p_offset(e) + vaddr - at) as usize;
            self.data.get(offset..offset + n)
        })
    }

    /// Where the module's exported `name` is in the target, and its size (the dynamic
    /// symbol table keeps both, in a stripped file too).
    pub fn sized(&self, name: &str) -> Option<(u64, u64)> {
        let elf = parse(&self.data, &self.path).ok()?;
        elf.dynamic_symbols()
            .find(|s| s.is_definition() && s.name() == Ok(name) && s.address() != 0)
            .map(|s| (self.bias.wrapping_add(s.address()), s.size()))
    }
}

impl Image {
    /// Added to an address in the file to give the target's.
    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// The section `name`: its address in the file and its bytes.
    pub fn section(&self, name: &str) -> Option<(u64, Vec<u8>)> {
        let elf = parse(&self.data, &self.path).ok()?;
        let s = elf.section_by_name(name)?;
        Some((s.address(), s.data().ok()?.to_vec()))
    }

    /// Where the file's executable segments are in the target, `[start, end)`.
    pub fn code_range(&self) -> Option<(u64, u64)> {
        let elf = parse(&self.data, &self.path).ok()?;
        let e = Endianness::Little;
        elf.elf_program_headers()
            .iter()
            .filter(|p| {
                p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e).contains(object::elf::PF_X)
            })
            .map(|p| (p.p_vaddr(e), p.p_vaddr(e) + p.p_memsz(e)))
            .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
            .map(|(lo, hi)| (self.bias.wrapping_add(lo), self.bias.wrapping_add(hi)))
    }

    /// The exported functions `[start, end)` in the target, by name (aliases each listed).
    pub fn functions(&self) -> Vec<(String, u64, u64)> {
        let Ok(elf) = parse(&self.data, &self.path) else {
            return Vec::new();
        };
        elf.dynamic_symbols()
            .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| {
                let start = self.bias.wrapping_add(s.address());
                Some((s.name().ok()?.to_string(), start, start + s.size()))
            })
            .collect()
    }
}

/// The name of the function of `functions` that `addr` is in, the alias with the fewest
/// leading underscores (`write`, not `__write` or `__libc_write`).
pub fn function_at(functions: &[(String, u64, u64)], addr: u64) -> Option<&str> {
    functions
        .iter()
        .filter(|&&(_, lo, hi)| (lo..hi).contains(&addr))
        .min_by_key(|(name, _, _)| (name.len() - name.trim_start_matches('_').len(), name.len()))
        .map(|(name, _, _)| name.as_str())
}

fn parse<'d>(data: &'d [u8], path: &Path) -> io::Result<ElfFile64<'d, Endianness>> {
    ElfFile64::parse(data).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a 64-bit ELF file ({e})", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_make_modules() {
        let text = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 12 /usr/bin/cat
55d0c0001000-55d0c0005000 r-xp 00001000 08:01 12 /usr/bin/cat
7f0000000000-7f0000028000 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000028000-7f000019d000 r-xp 00028000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00001a0000-7f00001a1000 rw-p 00000000 00:00 0 
7f0000200000-7f0000400000 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
        let m = parse_maps(text);
        // The read-only mapping of libc.so.6 at 0x7f0000200000 is a file read as data.
        assert_eq!(m.len(), 2);
        let libc = find(&m, "libc.so.6").unwrap();
        assert_eq!(libc.first, 0x7f00_0000_0000);
        assert!(libc.contains(0x7f00_0002_8010));
        assert!(!libc.contains(0x7f00_001a_0010));
        assert!(!libc.contains(0x7f00_0020_0010));
        assert!(find(&m, "ld-linux").is_none());
    }

    #[test]
    fn own_libc_symbols_are_where_dlsym_says() {
        let m = modules(std::process::id() as i32).unwrap();
        let libc = find(&m, "libc.so.6").expect("libc mapped");
        let image = Image::read(std::process::id() as i32, libc).unwrap();
        // SAFETY: dlsym with NUL-terminated names.
        let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as u64;
        assert_eq!(image.symbol("malloc").unwrap(), malloc);
        assert!(image.symbol("no_such_function_here").is_err());
        let functions = image.functions();
        assert_eq!(function_at(&functions, malloc + 1), Some("malloc"));
        assert_ne!(function_at(&functions, malloc - 1), Some("malloc"));
        let (at, size) = image.sized("malloc").unwrap();
        assert_eq!(at, malloc);
        assert!(size > 0);
        // The file's bytes at malloc are this process's own (nothing wrote to them).
        // SAFETY: the first 16 bytes of libc's malloc, mapped and executable.
        let own = unsafe { std::slice::from_raw_parts(malloc as *const u8, 16) };
        assert_eq!(image.file_bytes(malloc, 16), Some(own));
        assert_eq!(image.file_bytes(0, 16), None);
    }
}
