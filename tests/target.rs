//! `mem_trace_read::target` against real programs: a traced fixture read while it runs (by
//! pid, never stopped) and from a core of it written by gdb's `gcore`, with the same header,
//! totals, block and symbolized allocation stack from both; and every way opening a target
//! fails, each checked for its one-line message.
//!
//! The fixture (`tests/fixtures/target_wait.c`) allocates known blocks, prints its pid and a
//! block's address, and waits on its stdin, so nothing changes while it is read.

mod common;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{c_fixture, gcore, library, run_with_timeout, script, Fixture};
use mem_trace_read::layout::{self, Tables, Totals};
use mem_trace_read::target::{Source, Symbols, Target, TargetError};

fn fixture() -> Fixture {
    c_fixture("target_wait.c", &["-pthread"])
}

/// The line of each `// @name` marker in the fixture.
fn markers(f: &Fixture) -> HashMap<String, usize> {
    let text = fs::read_to_string(&f.src).unwrap();
    script::parse(&f.src, &text).unwrap().markers
}

/// The fixture running under `preload`, stopped (killed) on drop.
struct Running {
    child: Child,
    pid: i32,
    known: u64,
    worker: u32,
    stderr: PathBuf,
}

impl Running {
    fn start(f: &Fixture, preload: &Path, label: &str) -> Running {
        Running::start_with(f, preload, label, |_| {})
    }

    /// [`Running::start`], with `adjust` applied to the command first.
    fn start_with(
        f: &Fixture,
        preload: &Path,
        label: &str,
        adjust: impl FnOnce(&mut Command),
    ) -> Running {
        let stderr = f.dir.join(format!("{label}.stderr"));
        let mut cmd = Command::new(&f.bin);
        cmd.current_dir(&f.dir);
        adjust(&mut cmd);
        let mut child = cmd
            .env("LD_PRELOAD", preload)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).unwrap())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", f.bin.display()));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60));
        let mut running = Running {
            child,
            pid: 0,
            known: 0,
            worker: 0,
            stderr,
        };
        let line = line.unwrap_or_default();
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        match (field("pid="), field("known=0x"), field("worker=")) {
            (Some(pid), Some(known), Some(worker)) => {
                running.pid = pid.parse().unwrap();
                running.known = u64::from_str_radix(&known, 16).unwrap();
                running.worker = worker.parse().unwrap();
            }
            _ => panic!(
                "{label}: no `ready` line from {} (got {line:?}); stderr:\n{}",
                f.bin.display(),
                fs::read_to_string(&running.stderr).unwrap_or_default()
            ),
        }
        running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a reader answers about the fixture.
#[derive(Debug, PartialEq, Eq)]
struct Answers {
    header: u64,
    totals: Totals,
    /// The known block: (addr, size, thread, seq, stack).
    block: (u64, u64, u32, u64, u32),
    /// The known block's first two frames: (function, file, line) of the calling function.
    frames: Vec<(Option<String>, Option<String>, u32)>,
    tids: Vec<u32>,
}

fn answers(target: &Target, known: u64) -> Answers {
    // As the command opens them: with the mappings, where small blocks are found by their tags.
    let tables = target
        .tables()
        .unwrap_or_else(|e| panic!("{}: {e}", target.name()));
    let totals = tables.totals().unwrap();
    let block = tables
        .find_containing(known + 100)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no block holds {:#x}", target.name(), known + 100));
    let stack = tables
        .stack(block.stack)
        .unwrap()
        .expect("a published stack");
    let mut symbols = Symbols::new(target);
    let frames = stack[..2]
        .iter()
        .map(|&ra| {
            let frames = symbols
                .frames(ra)
                .unwrap_or_else(|e| panic!("{}: {ra:#x}: {e}", target.name()));
            let outer = frames.last().expect("a frame").clone();
            (outer.function, outer.file, outer.line)
        })
        .collect();
    let library = symbols
        .module_of(target.header())
        .expect("the header is in a module");
    assert!(
        library.path.to_string_lossy().contains("mem_trace"),
        "{:?}",
        library
    );
    Answers {
        header: target.header(),
        totals,
        block: (block.addr, block.size, block.thread, block.seq, block.stack),
        frames,
        tids: target.threads().iter().map(|t| t.tid).collect(),
    }
}

fn open(source: Source) -> Result<Target, TargetError> {
    Target::open(&source)
}

fn open_core(core: &Path, exe: Option<&Path>) -> Result<Target, TargetError> {
    open(Source::Core {
        core: core.to_path_buf(),
        exe: exe.map(Path::to_path_buf),
    })
}

/// The program headers of an ELF64 file: (type, offset, vaddr, filesz).
fn program_headers(elf: &[u8]) -> Vec<(u32, u64, u64, u64)> {
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    let phoff = u64_at(32) as usize;
    let phnum = u16::from_le_bytes([elf[56], elf[57]]) as usize;
    (0..phnum)
        .map(|i| {
            let p = phoff + 56 * i;
            let kind = u32::from_le_bytes(elf[p..p + 4].try_into().unwrap());
            (kind, u64_at(p + 8), u64_at(p + 16), u64_at(p + 32))
        })
        .collect()
}

/// Where the core holds the byte at `addr`.
fn core_offset(core: &[u8], addr: u64) -> usize {
    program_headers(core)
        .into_iter()
        .find(|&(kind, _, vaddr, filesz)| kind == 1 && vaddr <= addr && addr < vaddr + filesz)
        .map(|(_, offset, vaddr, _)| (offset + addr - vaddr) as usize)
        .unwrap_or_else(|| panic!("the core does not hold {addr:#x}"))
}

/// Gives every `CORE` note of a type in `kinds` an unknown type, as if the core lacked it.
fn hide_notes(core: &mut [u8], kinds: &[u32]) {
    let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    for (kind, offset, _, filesz) in program_headers(core) {
        if kind != 4 {
            continue;
        }
        let (mut at, end) = (offset as usize, (offset + filesz) as usize);
        while at + 12 <= end {
            let (namesz, descsz) = (word(core, at) as usize, word(core, at + 4) as usize);
            let name_at = at + 12;
            if &core[name_at..name_at + namesz] == b"CORE\0" && kinds.contains(&word(core, at + 8))
            {
                core[at + 8..at + 12].copy_from_slice(&0x3ffu32.to_le_bytes());
            }
            at = name_at + namesz.next_multiple_of(4) + descsz.next_multiple_of(4);
        }
    }
}

/// The GNU build id `readelf -n` reads from `file`.
fn build_id(file: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}:\n{text}", file.display()))
        .to_string()
}

#[test]
fn a_running_process_and_its_core_give_the_same_answers() {
    let f = fixture();
    let lines = markers(&f);
    let run = Running::start(&f, library(), "target_wait.live");

    let live = open(Source::Pid(run.pid)).unwrap_or_else(|e| panic!("{e}"));
    assert!(live.is_live());
    assert_eq!(live.name(), format!("process {} (target_wait)", run.pid));
    let from_live = answers(&live, run.known);
    let src = Some(f.src.display().to_string());
    assert_eq!(
        from_live.frames,
        [
            (
                Some("make_known".into()),
                src.clone(),
                lines["known"] as u32
            ),
            (Some("main".into()), src.clone(), lines["main-known"] as u32),
        ]
    );
    let (known, size, ..) = from_live.block;
    assert_eq!((known, size), (run.known, 4321));
    // 1 + 10 + 3 blocks of the fixture at least (stdio and the loader allocate too).
    let t = from_live.totals;
    assert!(t.blocks >= 14 && t.bytes >= 4321 + 7770 + 3 * 2345, "{t:?}");
    assert!(t.threads >= 2, "{t:?}");
    assert_eq!(from_live.tids, [run.pid as u32, run.worker]);
    assert!(live.threads().iter().all(|t| t.sp.is_none()));
    let exe = live
        .modules()
        .iter()
        .find(|m| m.path == f.bin)
        .expect("the executable is a module");
    assert_eq!(exe.file.as_deref(), Some(f.bin.as_path()));
    assert!(live
        .mappings()
        .iter()
        .any(|m| m.name == "[heap]" && m.read && m.write));

    let version = Tables::open(live.memory(), live.header())
        .unwrap()
        .header()
        .version;
    let core = f.dir.join("target_wait.core");
    gcore(run.pid as u32, &core, &f.dir.join("target_wait.gcore"));
    // The process goes on, and is read the same after gcore let go of it.
    assert_eq!(
        answers(&open(Source::Pid(run.pid)).unwrap(), run.known),
        from_live
    );
    drop(run);

    let dumped = open_core(&core, None).unwrap_or_else(|e| panic!("{e}"));
    assert!(!dumped.is_live());
    assert_eq!(
        dumped.name(),
        format!("core file {} (target_wait)", core.display())
    );
    assert_eq!(answers(&dumped, known), from_live);
    assert!(dumped
        .threads()
        .iter()
        .all(|t| t.sp.is_some() && t.registers.len() == 27));
    // Code gcore left out is read from the files, with the permissions of their segments.
    let text = dumped
        .mappings()
        .iter()
        .find(|m| m.exec && m.name == f.bin.to_string_lossy())
        .expect("the executable's code is mapped");
    let mut code = [0u8; 16];
    dumped.memory().read(text.start, &mut code).unwrap();
    let on_disk = fs::read(&f.bin).unwrap();
    let at = text.offset as usize;
    assert_eq!(code, on_disk[at..at + 16]);

    let bytes = fs::read(&core).unwrap();
    // Edited copies of the core (each as big as the tracer's arena), removed when done.
    let variants = std::cell::RefCell::new(Vec::new());
    let variant = |name: &str, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut copy = bytes.clone();
        edit(&mut copy);
        let path = f.dir.join(format!("target_wait.{name}.core"));
        fs::write(&path, copy).unwrap();
        variants.borrow_mut().push(path.clone());
        path
    };

    // Notes that do not name the executable: --exe is needed, and then the answers are the
    // same.
    let anonymous = variant("anonymous", &|c| hide_notes(c, &[3, 6]));
    let e = open_core(&anonymous, None)
        .err()
        .expect("no executable named");
    assert_eq!(
        e.to_string(),
        format!(
            "{} does not say which executable dumped it: pass the executable with --exe PATH",
            anonymous.display()
        )
    );
    let named = open_core(&anonymous, Some(&f.bin)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answers(&named, known), from_live);

    let truncated = variant("truncated", &|c| c.truncate(c.len() / 2));
    match open_core(&truncated, None) {
        Err(e @ TargetError::TruncatedCore { .. }) => {
            let needed = program_headers(&bytes)
                .iter()
                .map(|&(_, offset, _, filesz)| offset + filesz)
                .max()
                .unwrap();
            let missing = needed - (bytes.len() / 2) as u64;
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "{} is a truncated core file (",
                    truncated.display()
                )) && msg.contains(&format!(": {missing} bytes are missing)")),
                "{msg}"
            );
        }
        other => panic!("{:?}", other.map(|t| t.name().to_string())),
    }

    let header = core_offset(&bytes, from_live.header);
    let old = variant("old-version", &|c| {
        c[header + 8..header + 12].copy_from_slice(&2u32.to_le_bytes())
    });
    match open_core(&old, None) {
        Err(e @ TargetError::Layout(layout::Error::Version { found: 2 })) => assert_eq!(
            e.to_string(),
            format!(
                "the target's libmem_trace.so writes layout version 2, this mem-trace reads version {}: use the mem-trace that came with that libmem_trace.so",
                version
            )
        ),
        other => panic!("{:?}", other.map(|t| t.name().to_string())),
    }
    let foreign = variant("bad-magic", &|c| {
        c[header..header + 8].copy_from_slice(b"NOTMTRAC")
    });
    assert!(matches!(
        open_core(&foreign, None),
        Err(TargetError::Layout(layout::Error::BadMagic { addr, .. })) if addr == from_live.header
    ));
    for path in variants.into_inner() {
        let _ = fs::remove_file(path);
    }
}

/// Whether the kernel writes a file named `core` into the dumping process's directory
/// (`core_pattern` `core`, `core_uses_pid` 0), and if not, why.
fn kernel_writes_plain_core() -> Result<(), String> {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_string();
    match (
        read("/proc/sys/kernel/core_pattern"),
        read("/proc/sys/kernel/core_uses_pid"),
    ) {
        (pattern, pid) if pattern == "core" && pid == "0" => Ok(()),
        (pattern, pid) => Err(format!(
            "core_pattern is {pattern:?} (core_uses_pid {pid}), not a plain `core` file"
        )),
    }
}

/// The kernel's own core (segments whose `p_filesz` stops short of their `p_memsz`), read
/// the same as the running process.
///
/// Where the kernel pipes cores to a handler (apport, systemd-coredump) a test cannot get
/// the file without changing the machine: there it says so on stderr and checks nothing more.
#[test]
fn a_kernel_core_gives_the_same_answers() {
    let f = fixture();
    let dir = f.dir.join("kernel");
    fs::create_dir_all(&dir).unwrap();
    let core = dir.join("core");
    let _ = fs::remove_file(&core);
    let mut run = Running::start_with(&f, library(), "target_wait.kernel", |cmd| {
        cmd.current_dir(&dir);
        // SAFETY: runs in the child between fork and exec; setrlimit is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                let unlimited = libc::rlimit {
                    rlim_cur: libc::RLIM_INFINITY,
                    rlim_max: libc::RLIM_INFINITY,
                };
                if libc::setrlimit(libc::RLIMIT_CORE, &unlimited) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let from_live = answers(&open(Source::Pid(run.pid)).unwrap(), run.known);
    // SAFETY: signals our own child, by its pid.
    assert_eq!(unsafe { libc::kill(run.pid, libc::SIGABRT) }, 0);
    let status = run.child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGABRT)
    );
    if let Err(why) = kernel_writes_plain_core() {
        eprintln!("a_kernel_core_gives_the_same_answers: kernel core not testable here: {why}");
        return;
    }
    let dumped = open_core(&core, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answers(&dumped, run.known), from_live);
    let _ = fs::remove_file(&core);
}

#[test]
fn a_deleted_executable_is_read_as_it_was_loaded() {
    let f = fixture();
    let lines = markers(&f);
    // A copy of the program, run and then deleted, as an upgrade replaces a running binary.
    let copy = f.dir.join("target_wait_deleted");
    fs::copy(&f.bin, &copy).unwrap();
    let run = Running::start(
        &Fixture {
            bin: copy.clone(),
            ..f.clone()
        },
        library(),
        "target_wait.deleted",
    );
    fs::remove_file(&copy).unwrap();
    let live = open(Source::Pid(run.pid)).unwrap_or_else(|e| panic!("{e}"));
    let exe = live
        .modules()
        .iter()
        .find(|m| m.path.to_string_lossy() == format!("{} (deleted)", copy.display()))
        .expect("the deleted executable is a module");
    let file = exe.file.as_ref().expect("read through map_files (as root)");
    assert!(
        file.starts_with(format!("/proc/{}/map_files/", run.pid)),
        "{}",
        file.display()
    );
    let from_live = answers(&live, run.known);
    assert_eq!(
        from_live.frames[0],
        (
            Some("make_known".into()),
            Some(f.src.display().to_string()),
            lines["known"] as u32
        )
    );
}

#[test]
fn a_core_whose_library_file_was_replaced_is_another_build() {
    let f = fixture();
    let copy = f.dir.join("libmem_trace_copy.so");
    fs::copy(library(), &copy).unwrap();
    let run = Running::start(&f, &copy, "target_wait.copy");
    let core = f.dir.join("target_wait.copy.core");
    gcore(run.pid as u32, &core, &f.dir.join("target_wait.copy.gcore"));
    drop(run);
    assert!(open_core(&core, None).is_ok(), "the copy as it was loaded");

    // Another ELF file (the fixture itself) where the library was: renamed over it, as an
    // installer replaces a file.
    let other = f.dir.join("libmem_trace_copy.so.new");
    fs::copy(&f.bin, &other).unwrap();
    fs::rename(&other, &copy).unwrap();
    match open_core(&core, None) {
        Err(e @ TargetError::OtherBuild { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "{} is not the file the process had loaded (build id {} when loaded, {} on disk): use the exact build that ran (--exe for the executable), or read the core on the machine that dumped it",
                copy.display(),
                build_id(library()),
                build_id(&f.bin)
            )
        ),
        other => panic!("{:?}", other.map(|t| t.name().to_string())),
    }
}

#[test]
fn processes_that_cannot_be_read() {
    // A pid that was just freed.
    let mut done = Command::new("true").spawn().unwrap();
    let gone = done.id() as i32;
    done.wait().unwrap();
    match open(Source::Pid(gone)) {
        Err(e @ TargetError::NoSuchProcess(pid)) if pid == gone => assert_eq!(
            e.to_string(),
            format!("no process {gone}: it has exited or the PID is wrong (check with `ps -p {gone}`); to read a program that has ended, give its core file")
        ),
        other => panic!("{:?}", other.map(|t| t.name().to_string())),
    }

    // A process without the library.
    let mut sleep = Command::new("sleep")
        .arg("60")
        .env_remove("LD_PRELOAD")
        .spawn()
        .unwrap();
    let pid = sleep.id() as i32;
    let result = open(Source::Pid(pid));
    let _ = sleep.kill();
    let _ = sleep.wait();
    match result {
        Err(e @ TargetError::NotLoaded { .. }) => assert_eq!(
            e.to_string(),
            format!("process {pid} (sleep) has no MEM_TRACE_HEADER, so libmem_trace.so is not loaded in it: load it into the running process with `mem-trace attach {pid}`, or start the program with `LD_PRELOAD=/path/to/libmem_trace.so PROGRAM` or `mem-trace run PROGRAM`")
        ),
        other => panic!("{:?}", other.map(|t| t.name().to_string())),
    }
}

/// Set in the copy of this test binary that [`permission_denied`] runs as another user.
const READ_AS_OTHER_USER: &str = "MEM_TRACE_TEST_READ_PID";

#[test]
fn permission_denied() {
    if let Ok(pid) = std::env::var(READ_AS_OTHER_USER) {
        // The copy running as `nobody`: report what opening the process gave.
        let result = open(Source::Pid(pid.parse().unwrap()));
        match result {
            Err(e) => println!("RESULT {e:?} MESSAGE {e}"),
            Ok(t) => println!("RESULT opened {}", t.name()),
        }
        return;
    }
    // Running as root, every process can be read: read the fixture as `nobody` instead, from
    // a copy of this test running under that user.
    assert_eq!(
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() },
        0,
        "the test makes another user's reader with setpriv, which needs root"
    );
    let f = fixture();
    let run = Running::start(&f, library(), "target_wait.other-user");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "permission_denied",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(READ_AS_OTHER_USER, run.pid.to_string());
    let out = run_with_timeout(
        cmd,
        &f.dir.join("target_wait.other-user.reader"),
        false,
        None,
        common::RUN_TIMEOUT,
        "reader as nobody",
    );
    let line = out
        .stdout
        .lines()
        .find_map(|l| l.find("RESULT ").map(|at| l[at..].to_string()))
        .unwrap_or_else(|| panic!("no result from the reader\n{}", out.describe()));
    let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let expected = TargetError::PermissionDenied {
        pid: run.pid,
        ptrace_scope: scope,
    };
    assert_eq!(line, format!("RESULT {expected:?} MESSAGE {expected}"));
    assert!(expected
        .to_string()
        .starts_with(&format!("not allowed to read process {}: ", run.pid)));
}

#[test]
fn files_that_are_not_cores() {
    let f = fixture();
    let text = f.dir.join("not-a-core.txt");
    fs::write(&text, "just some text\n").unwrap();
    let refused = |path: &Path| match open_core(path, None) {
        Err(e @ TargetError::NotACore { .. }) => e.to_string(),
        other => panic!(
            "{}: {:?}",
            path.display(),
            other.map(|t| t.name().to_string())
        ),
    };
    let tail =
        ": give a core dump (from `gcore PID` or the kernel) or the PID of a running process";
    assert_eq!(
        refused(&text),
        format!(
            "{} is not an x86_64 ELF core file (it is not an ELF file){tail}",
            text.display()
        )
    );
    // Debian's /bin/true is position-independent, older ones are plain executables.
    let program = refused(Path::new("/bin/true"));
    assert!(
        program.starts_with("/bin/true is not an x86_64 ELF core file (an ELF ")
            && program.ends_with(&format!(", not a core){tail}")),
        "{program}"
    );
    assert_eq!(
        refused(&f.dir),
        format!(
            "{} is not an x86_64 ELF core file (it is empty or not a regular file){tail}",
            f.dir.display()
        )
    );
}
