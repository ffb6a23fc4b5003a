//! Core files built in memory: the header checks, segments as memory (with what they lack
//! read from the mapped files), the executable named by the notes.

use super::*;
use crate::target::core_notes::tests::{le_words, note, nt_file, nt_prstatus};

/// A program header: type, flags, offset, vaddr, filesz, memsz.
type Phdr = (u32, u32, u64, u64, u64, u64);

/// An x86_64 ELF file of type `e_type` with `phdrs` and `body` after the headers; phdr
/// offsets are relative to the body.
fn elf(e_type: u16, phdrs: &[Phdr], body: &[u8]) -> Vec<u8> {
    let body_at = 64 + 56 * phdrs.len() as u64;
    let mut out = Vec::new();
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&e_type.to_le_bytes());
    out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // entry
    out.extend_from_slice(&64u64.to_le_bytes()); // phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // shoff
    out.extend_from_slice(&0u32.to_le_bytes());
    for h in [64u16, 56, phdrs.len() as u16, 64, 0, 0] {
        out.extend_from_slice(&h.to_le_bytes());
    }
    for &(kind, flags, offset, vaddr, filesz, memsz) in phdrs {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend(le_words(&[body_at + offset, vaddr, 0, filesz, memsz, 4]));
    }
    out.extend_from_slice(body);
    out
}

/// A scratch file that is removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path =
            std::env::temp_dir().join(format!("mem-trace-core-test-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A core with: a note segment (two threads, the executable's program headers mapped from
/// `exe`), a 32-byte segment at 0x20000 of which 16 bytes are in the file, and a segment at
/// 0x30000 holding the first 16 bytes of the file `lib` mapped at 0x30000 from offset 0, the
/// rest of that mapping left out as gcore does.
fn sample_core(lib: &str) -> Vec<u8> {
    let auxv = le_words(&[AT_PHDR, 0x10040, 0, 0]);
    let notes = [
        nt_prstatus(100, 0x7ff0),
        nt_prstatus(101, 0x7fe0),
        note(b"CORE", 6, &auxv),
        nt_file(&[
            (0x10000, 0x11000, 0, "/bin/exe"),
            (0x30000, 0x32000, 0, lib),
            (0x32000, 0x33000, 2, lib),
        ]),
    ]
    .concat();
    let loaded: Vec<u8> = (0u8..16).chain(100..116).collect();
    let n = notes.len() as u64;
    elf(
        4,
        &[
            (4, 4, 0, 0, n, 0),
            (1, 6, n, 0x20000, 16, 32),
            (1, 4, n + 16, 0x30000, 16, 0x2000),
        ],
        &[notes, loaded].concat(),
    )
}

fn read(memory: &dyn Memory, addr: u64, len: usize) -> Result<Vec<u8>, Unreadable> {
    let mut buf = vec![0u8; len];
    memory.read(addr, &mut buf).map(|()| buf)
}

#[test]
fn segments_are_memory_and_mapped_files_fill_the_gaps() {
    let file: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
    let lib = Scratch::new("lib", &file);
    let lib_name = lib.0.to_str().unwrap();
    let core = Scratch::new("core", &sample_core(lib_name));
    let map = FileMap::open(core.0.as_os_str().as_bytes()).unwrap();
    let (segments, notes) = parse(map.as_slice()).unwrap();
    assert_eq!(segments.len(), 2);
    let files = notes.files.clone().unwrap();
    let memory = CoreMemory::new(map, segments, &files);

    assert_eq!(read(&memory, 0x20004, 4).unwrap(), [4, 5, 6, 7]);
    // Past p_filesz of anonymous memory: not in the core, no file to read it from.
    let fail = read(&memory, 0x2000c, 8).unwrap_err();
    assert_eq!(
        fail,
        Unreadable {
            addr: 0x2000c,
            len: 8
        }
    );
    // The core's copy first, then the file at the mapping's offset, in one read.
    let both = read(&memory, 0x3000e, 4).unwrap();
    assert_eq!(both, [114, 115, file[16], file[17]]);
    // The third NT_FILE entry maps the file from offset 2 pages.
    assert_eq!(
        read(&memory, 0x32010, 2).unwrap(),
        file[8192 + 16..8192 + 18]
    );
    // Past the end of the file, and where nothing is mapped.
    assert!(read(&memory, 0x32ffe, 4).is_err());
    assert!(read(&memory, 0x40000, 1).is_err());
    assert!(read(&memory, u64::MAX - 1, 4).is_err());
    // Only what the core holds.
    let dumped = Dumped(&memory);
    assert_eq!(read(&dumped, 0x3000e, 2).unwrap(), [114, 115]);
    assert!(read(&dumped, 0x3000e, 4).is_err());

    assert_eq!(
        executable(&notes, &files, &dumped).as_deref(),
        Some("/bin/exe")
    );
    let tids: Vec<(u32, Option<u64>)> = notes.threads.iter().map(|t| (t.tid, t.sp)).collect();
    assert_eq!(tids, [(100, Some(0x7ff0)), (101, Some(0x7fe0))]);

    let maps = mappings(&memory.segments, &files);
    let spans: Vec<(u64, u64, &str, bool)> = maps
        .iter()
        .map(|m| (m.start, m.end, m.name.as_str(), m.write))
        .collect();
    assert_eq!(
        spans,
        [
            (0x10000, 0x11000, "/bin/exe", false),
            (0x20000, 0x20020, "", true),
            (0x30000, 0x32000, lib_name, false),
            (0x32000, 0x33000, lib_name, false),
        ]
    );
}

#[test]
fn the_executable_is_named_by_execfn_or_a_unique_fname() {
    let files = vec![
        FileEntry {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            path: "/opt/app/server-main-binary".into(),
        },
        FileEntry {
            start: 0x3000,
            end: 0x4000,
            offset: 0,
            path: "/lib/libc.so.6".into(),
        },
    ];
    let mut notes = Notes {
        fname: Some("server-main-bin".into()),
        ..Notes::default()
    };
    let none = crate::memory::Process::new(i32::MAX);
    assert_eq!(
        executable(&notes, &files, &none).as_deref(),
        Some("/opt/app/server-main-binary")
    );
    // A name shorter than 15 bytes is whole: a prefix of another file's name is not it.
    notes.fname = Some("libc".into());
    assert_eq!(executable(&notes, &files, &none), None);
    notes.fname = Some("libc.so.6".into());
    assert_eq!(
        executable(&notes, &files, &none).as_deref(),
        Some("/lib/libc.so.6")
    );
    notes.fname = None;
    assert_eq!(executable(&notes, &files, &none), None);

    // AT_EXECFN points at the path in the (this process's) memory.
    let execfn = b"/lib/libc.so.6\0";
    notes.auxv = vec![(AT_EXECFN, execfn.as_ptr() as u64)];
    let me = crate::memory::Process::this();
    assert_eq!(
        executable(&notes, &files, &me).as_deref(),
        Some("/lib/libc.so.6")
    );
}

fn invalid(bytes: &[u8]) -> Invalid {
    parse(bytes).expect_err("an error")
}

#[test]
fn refuses_what_is_not_an_x86_64_core() {
    let not = |why: &str| Invalid::NotACore(why.into());
    assert_eq!(invalid(b"hello world"), not("it is not an ELF file"));
    assert_eq!(
        invalid(&elf(2, &[], &[])),
        not("an ELF executable, not a core")
    );
    assert_eq!(
        invalid(&elf(3, &[], &[])),
        not("an ELF shared object or position-independent executable, not a core")
    );
    let mut arm = elf(4, &[], &[]);
    arm[18] = 183;
    assert_eq!(
        invalid(&arm),
        not("an ELF file for machine 183, not x86_64")
    );
    let mut class32 = elf(4, &[], &[]);
    class32[4] = 1;
    assert_eq!(invalid(&class32), not("a 32-bit or big-endian ELF file"));
    assert_eq!(
        invalid(&elf(
            4,
            &[(4, 4, 0, 0, 12, 0)],
            &note(b"CORE", 6, &[0; 12])[..12]
        )),
        not("a malformed note: Invalid ELF note namesz")
    );
}

#[test]
fn a_truncated_core_says_how_many_bytes_are_missing() {
    let whole = sample_core("/lib/x.so");
    let cut = &whole[..whole.len() - 20];
    assert_eq!(
        invalid(cut),
        Invalid::Truncated(format!(
            "its segments end at byte {} but the file has {} bytes: 20 bytes are missing",
            whole.len(),
            cut.len()
        ))
    );
    assert_eq!(
        invalid(&whole[..100]),
        Invalid::Truncated(
            "its program headers end at byte 232 but the file has 100 bytes: 132 bytes are missing"
                .into()
        )
    );
    assert_eq!(
        invalid(&whole[..40]),
        Invalid::Truncated(
            "its ELF header should end at byte 64 but the file has 40 bytes: 24 bytes are missing"
                .into()
        )
    );
}

#[test]
fn opening_reports_paths_and_missing_notes() {
    let nothing = Path::new("/nonexistent/core");
    let e = open(nothing, None).err().unwrap();
    assert_eq!(
        e.to_string(),
        "cannot read /nonexistent/core: No such file or directory (os error 2)"
    );
    let empty = Scratch::new("empty", b"");
    let e = open(&empty.0, None).err().unwrap();
    assert!(
        matches!(&e, TargetError::NotACore { why, .. } if why == "it is empty or not a regular file"),
        "{e}"
    );
    let no_files = Scratch::new("no-files", &elf(4, &[], &[]));
    let e = open(&no_files.0, None).err().unwrap();
    assert!(e.to_string().contains("has no NT_FILE note"), "{e}");

    // Notes that name no executable: --exe is needed, and must be a file the core maps.
    let anonymous = nt_file(&[(0x1000, 0x2000, 0, "/bin/a")]);
    let n = anonymous.len() as u64;
    let core = Scratch::new("no-exe", &elf(4, &[(4, 4, 0, 0, n, 0)], &anonymous));
    let e = open(&core.0, None).err().unwrap();
    assert!(matches!(e, TargetError::ExeUnknown { .. }), "{e}");
    let e = open(&core.0, Some(Path::new("/usr/bin/b"))).err().unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "/usr/bin/b is not the file the process had loaded ({} maps no file of that name): use the exact build that ran (--exe for the executable), or read the core on the machine that dumped it",
            core.0.display()
        )
    );
    // Named by --exe, the core opens as far as its modules: it has none, so no header.
    let e = open(&core.0, Some(Path::new("/elsewhere/a")))
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "core file {} (a) has no MEM_TRACE_HEADER, so libmem_trace.so is not loaded in it: start the program with `LD_PRELOAD=/path/to/libmem_trace.so PROGRAM` or `mem-trace run PROGRAM`",
            core.0.display()
        )
    );
}

/// A mapped file that is a FIFO by now (`NT_FILE` names a path, whatever it has become) is
/// not opened for reading, which would wait for a writer: what the core lacks there is
/// unreadable at once.
#[test]
fn a_fifo_in_place_of_a_mapped_file_is_not_read() {
    let fifo =
        std::env::temp_dir().join(format!("mem-trace-core-test-{}-fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let cpath = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let fifo = Scratch(fifo);
    let core = Scratch::new("fifo-core", &sample_core(fifo.0.to_str().unwrap()));
    let (tx, rx) = std::sync::mpsc::channel();
    let core_path = core.0.clone();
    std::thread::spawn(move || {
        let map = FileMap::open(core_path.as_os_str().as_bytes()).unwrap();
        let (segments, notes) = parse(map.as_slice()).unwrap();
        let memory = CoreMemory::new(map, segments, &notes.files.unwrap());
        let _ = tx.send((
            read(&memory, 0x3000e, 2),
            read(&memory, 0x3000e, 4),
            read(&memory, 0x31000, 4),
        ));
    });
    let (dumped, across, file) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a core whose mapped file is a FIFO returns");
    assert_eq!(dumped.unwrap(), [114, 115]);
    assert!(across.is_err() && file.is_err());
}
