//! The symbolizer on this test binary, on libc (symbol table and separate debug file), and on
//! broken files.

use super::debug_files::{build_id_path, dir_of};
use super::demangle::demangle;
use super::types::Elf;
use super::*;
use object::Object as _;
use std::time::Instant;

/// The module containing `addr`, found the way a test may (dladdr + /proc/self/maps),
/// with an empty path when it is the main executable.
fn module_of(addr: usize) -> (Vec<u8>, u64, u64, u64) {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is writable; dladdr only fills it.
    let ok = unsafe { libc::dladdr(addr as *const libc::c_void, info.as_mut_ptr()) };
    assert_ne!(ok, 0, "dladdr found no module for {addr:#x}");
    // SAFETY: dladdr succeeded, so `info` is filled.
    let info = unsafe { info.assume_init() };
    let base = info.dli_fbase as u64;
    // Find the file backing `base` and the range of its mappings.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut file = None;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let range = parts.next().unwrap();
        let start = u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap();
        if start == base {
            file = parts.nth(4).map(str::to_owned);
        }
    }
    let file = file.expect("mapping at dli_fbase");
    let (mut start, mut end) = (u64::MAX, 0);
    for line in maps.lines() {
        if line.split_whitespace().nth(5) == Some(file.as_str()) {
            let range = line.split_whitespace().next().unwrap();
            let (s, e) = range.split_once('-').unwrap();
            start = start.min(u64::from_str_radix(s, 16).unwrap());
            end = end.max(u64::from_str_radix(e, 16).unwrap());
        }
    }
    let data = std::fs::read(&file).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    // PIE and shared objects are linked at 0, so the base is the bias.
    let bias = if elf.kind() == object::ObjectKind::Dynamic {
        base
    } else {
        0
    };
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let path = if exe.as_os_str().as_encoded_bytes() == file.as_bytes() {
        Vec::new()
    } else {
        file.into_bytes()
    };
    (path, bias, start, end)
}

fn symbolize_addr(sym: &mut Symbolizer, addr: usize) -> Result<Vec<SymFrame>, SymError> {
    let (path, bias, start, end) = module_of(addr);
    let module = ModuleRef {
        path: &path,
        bias,
        start,
        end,
    };
    let mut out = Vec::new();
    sym.symbolize(&module, addr as u64, &mut out).map(|()| out)
}

const MARKER_LINE: u32 = line!() + 3;
#[inline(never)]
fn marker_function(x: usize) -> usize {
    std::hint::black_box(x).wrapping_mul(31).wrapping_add(7)
}

#[test]
fn own_function_has_name_file_and_line() {
    let mut sym = Symbolizer::new();
    let addr = marker_function as *const () as usize + 1;
    let frames = symbolize_addr(&mut sym, addr).unwrap();
    // black_box may be inlined at the probe; the last frame is the real function.
    let (f, inlined) = frames.split_last().unwrap();
    assert!(
        !f.inlined && inlined.iter().all(|f| f.inlined),
        "{frames:?}"
    );
    let name = f.function.as_deref().unwrap();
    assert!(name.ends_with("tests::marker_function"), "{name}");
    assert!(f.file.as_deref().unwrap().ends_with("tests.rs"), "{f:?}");
    assert!((MARKER_LINE..MARKER_LINE + 3).contains(&f.line), "{f:?}");
    assert!(f.to_string().contains("marker_function at "));
    // A second lookup comes from the cache and agrees.
    assert_eq!(symbolize_addr(&mut sym, addr).unwrap(), frames);
    assert_eq!(sym.files.len(), 1);
}

/// Returns the address of an instruction inside its own (inlined) body.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn inlined_helper(x: usize) -> (usize, usize) {
    let pc: usize;
    // SAFETY: only reads the program counter into a register.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("lea {}, [rip]", out(reg) pc, options(nomem, nostack))
    };
    // SAFETY: only reads the program counter into a register.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("adr {}, .", out(reg) pc, options(nomem, nostack))
    };
    (pc, std::hint::black_box(x) + 1)
}

const CALL_LINE: u32 = line!() + 4;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(never)]
fn outer_function(x: usize) -> (usize, usize) {
    let r = inlined_helper(x);
    (r.0, std::hint::black_box(r.1))
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn inlined_frames_come_first() {
    let (pc, _) = outer_function(1);
    let frames = symbolize_addr(&mut Symbolizer::new(), pc).unwrap();
    // The scheduler may place the instruction inside black_box's inlined code too, so
    // look at the last two frames: the helper inlined into its non-inlined caller.
    let [.., helper, outer] = frames.as_slice() else {
        panic!("expected an inlined frame: {frames:?}");
    };
    assert!(
        frames[..frames.len() - 1].iter().all(|f| f.inlined),
        "{frames:?}"
    );
    assert!(!outer.inlined, "{frames:?}");
    let helper_name = helper.function.as_deref().unwrap();
    let outer_name = outer.function.as_deref().unwrap();
    assert!(helper_name.ends_with("tests::inlined_helper"), "{frames:?}");
    assert!(outer_name.ends_with("tests::outer_function"), "{frames:?}");
    // The outer frame's line is the call site of the inlined helper.
    assert_eq!(outer.line, CALL_LINE, "{frames:?}");
    assert!(helper.file.as_deref().unwrap().ends_with("tests.rs"));
}

#[test]
fn libc_function_from_symbol_table() {
    let mut sym = Symbolizer::new();
    sym.separate_debug = false;
    let addr = libc::malloc as *const () as usize + 1;
    let frames = symbolize_addr(&mut sym, addr).unwrap();
    assert_eq!(frames.len(), 1, "{frames:?}");
    let name = frames[0].function.as_deref().unwrap();
    // Stripped libc: .dynsym only; with symtab, any alias of malloc.
    assert!(name.ends_with("malloc+0x2"), "{name}");
    assert_eq!(frames[0].file, None);
}

#[test]
fn libc_function_with_separate_debug_info() {
    let addr = libc::malloc as *const () as usize + 1;
    let frames = symbolize_addr(&mut Symbolizer::new(), addr).unwrap();
    let outer = frames.last().unwrap();
    assert!(
        outer.function.as_deref().unwrap().contains("malloc"),
        "{frames:?}"
    );
    let (path, ..) = module_of(addr);
    let data = std::fs::read(String::from_utf8(path).unwrap()).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let id = elf.build_id().unwrap().unwrap();
    // Only assert file:line where the distribution's debug file is installed
    // (libc6-dbg: compressed sections, found by build id).
    if std::path::Path::new(std::str::from_utf8(&build_id_path(id)).unwrap()).exists() {
        let file = outer.file.as_deref().unwrap();
        assert!(file.ends_with("malloc.c"), "{frames:?}");
        assert!(outer.line > 0);
        // Debian's debug files are compressed: with no budget, the symbol table
        // (here the debug file's full .symtab) answers instead.
        let mut sym = Symbolizer::new();
        sym.set_decompress_limit(0);
        let frames = symbolize_addr(&mut sym, addr).unwrap();
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].file, None);
        assert!(frames[0]
            .function
            .as_deref()
            .unwrap()
            .ends_with("malloc+0x2"));
    }
}

#[test]
fn errors_not_panics() {
    let mut sym = Symbolizer::new();
    let mut out = Vec::new();
    let m = ModuleRef {
        path: b"/nonexistent/libnothing.so",
        bias: 0,
        start: 0x1000,
        end: 0x2000,
    };
    assert_eq!(
        sym.symbolize(&m, 0x1500, &mut out),
        Err(SymError::Open(libc::ENOENT))
    );
    // Cached failure, same answer.
    assert_eq!(
        sym.symbolize(&m, 0x1500, &mut out),
        Err(SymError::Open(libc::ENOENT))
    );
    assert_eq!(
        sym.symbolize(&m, 0x2000, &mut out),
        Err(SymError::NotInModule)
    );
    let vdso = ModuleRef {
        path: b"linux-vdso.so.1",
        ..m
    };
    assert_eq!(
        sym.symbolize(&vdso, 0x1500, &mut out),
        Err(SymError::NoFile)
    );
    let dir = ModuleRef { path: b"/tmp", ..m };
    assert_eq!(
        sym.symbolize(&dir, 0x1500, &mut out),
        Err(SymError::NotAFile)
    );
    // A FIFO is refused at once, not waited on for a writer.
    let fifo = std::env::temp_dir().join(format!("mem-trace-fifo-{}", std::process::id()));
    let fifo_c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);
    let fifo_module = ModuleRef {
        path: fifo.to_str().unwrap().as_bytes(),
        ..m
    };
    let answer = sym.symbolize(&fifo_module, 0x1500, &mut out);
    let _ = std::fs::remove_file(&fifo);
    assert_eq!(answer, Err(SymError::NotAFile));
    let nul = ModuleRef {
        path: b"/tmp/a\0b",
        ..m
    };
    assert_eq!(
        sym.symbolize(&nul, 0x1500, &mut out),
        Err(SymError::BadPath)
    );
    assert!(out.is_empty());
}

#[test]
fn truncated_and_corrupt_files_give_errors() {
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let dir = std::env::temp_dir().join(format!("symbolize-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = marker_function as *const () as usize + 1;
    let (_, bias, start, end) = module_of(target);
    let mut lengths = vec![
        1,
        4,
        16,
        63,
        64,
        65,
        200,
        4096,
        exe.len() / 2,
        exe.len() - 1,
    ];
    lengths.retain(|&n| n < exe.len());
    let mut corrupt = Vec::new();
    for &n in &lengths {
        corrupt.push(exe[..n].to_vec());
    }
    // Flip bytes in the ELF and section headers and across the file.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..24 {
        let mut copy = exe.clone();
        for _ in 0..64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed as usize) % copy.len();
            let at = if seed & 1 == 0 { at % 64 } else { at };
            copy[at] ^= (seed >> 32) as u8 | 1;
        }
        corrupt.push(copy);
    }
    for (i, bytes) in corrupt.iter().enumerate() {
        let path = dir.join(format!("bad{i}"));
        std::fs::write(&path, bytes).unwrap();
        let m = ModuleRef {
            path: path.as_os_str().as_encoded_bytes(),
            bias,
            start,
            end,
        };
        let mut sym = Symbolizer::new();
        sym.separate_debug = false;
        let mut out = Vec::new();
        // Any result is fine; reaching the next line (no panic, no crash) is the test.
        let r = sym.symbolize(&m, target as u64, &mut out);
        if i < lengths.len() && lengths[i] < 64 {
            assert!(matches!(r, Err(SymError::Elf(_))), "{i}: {r:?}");
        }
        assert_eq!(r.is_err(), out.is_empty());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demangling() {
    assert_eq!(
        demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
        "core::ptr::drop_in_place"
    );
    assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
    assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    assert_eq!(demangle("main"), "main");
}

#[test]
fn build_id_paths() {
    assert_eq!(
        build_id_path(&[0xab, 0xcd, 0x01]),
        b"/usr/lib/debug/.build-id/ab/cd01.debug"
    );
    assert_eq!(dir_of(b"/lib/libc.so.6"), b"/lib");
    assert_eq!(dir_of(b"libc.so.6"), b".");
}

/// Times 20 addresses cold (fresh Symbolizer: map + parse) and warm (cached).
/// `cargo test --release -- --nocapture timing` prints the numbers.
#[test]
fn timing_20_addresses() {
    let fns: [usize; 10] = [
        marker_function as *const () as usize,
        std::fs::read::<&str> as *const () as usize,
        std::env::var::<&str> as *const () as usize,
        String::from_utf8 as *const () as usize,
        str::to_lowercase as *const () as usize,
        std::thread::current as *const () as usize,
        std::time::Instant::now as *const () as usize,
        core::fmt::write as *const () as usize,
        std::io::stdout as *const () as usize,
        std::process::id as *const () as usize,
    ];
    let mut probes = Vec::new();
    for f in fns {
        probes.push(f + 1);
        // Within even the shortest of them (`process::id` is a 5-byte jump): past a symbol's
        // size nothing is named.
        probes.push(f + 3);
    }
    let modules: Vec<_> = probes.iter().map(|&a| module_of(a)).collect();
    let run = |sym: &mut Symbolizer| {
        let mut out = Vec::new();
        let mut ok = 0;
        for (addr, (path, bias, start, end)) in probes.iter().zip(&modules) {
            let m = ModuleRef {
                path,
                bias: *bias,
                start: *start,
                end: *end,
            };
            ok += usize::from(sym.symbolize(&m, *addr as u64, &mut out).is_ok());
        }
        (ok, out)
    };
    let mut sym = Symbolizer::new();
    let t = Instant::now();
    let (ok_cold, frames) = run(&mut sym);
    let cold = t.elapsed();
    let t = Instant::now();
    let (ok_warm, _) = run(&mut sym);
    let warm = t.elapsed();
    assert_eq!(ok_cold, probes.len());
    assert_eq!(ok_warm, probes.len());
    let exe_len = std::fs::metadata("/proc/self/exe").unwrap().len();
    println!(
        "20 addresses, {} frames, exe {} KiB: cold {:?}, warm {:?}",
        frames.len(),
        exe_len / 1024,
        cold,
        warm
    );
    for f in frames.iter().take(6) {
        println!("  {f}{}", if f.inlined { " [inlined]" } else { "" });
    }

    // libc through its separate debug file (compressed sections) when installed.
    let libc_fns = [
        libc::malloc as *const () as usize,
        libc::free as *const () as usize,
        libc::realloc as *const () as usize,
        libc::calloc as *const () as usize,
        libc::memcpy as *const () as usize,
    ];
    let (path, bias, start, end) = module_of(libc_fns[0]);
    let m = ModuleRef {
        path: &path,
        bias,
        start,
        end,
    };
    let mut sym = Symbolizer::new();
    let mut out = Vec::new();
    let t = Instant::now();
    for f in libc_fns {
        sym.symbolize(&m, f as u64 + 1, &mut out).unwrap();
    }
    let cold = t.elapsed();
    let t = Instant::now();
    for f in libc_fns {
        sym.symbolize(&m, f as u64 + 1, &mut out).unwrap();
    }
    println!(
        "libc, 5 addresses, {} frames: cold {cold:?}, warm {:?}; {}",
        out.len(),
        t.elapsed(),
        out[0]
    );
}

// Three functions without debug info: one whose symbol has no size but an FDE, one with an
// FDE but no symbol (a static function a stripped table lacks), and one whose symbol has a
// size, followed by bytes nothing covers.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.mem_trace_bounds,\"ax\",@progbits",
    ".globl mem_trace_test_sizeless",
    ".type mem_trace_test_sizeless,@function",
    "mem_trace_test_sizeless:",
    ".cfi_startproc",
    ".fill 15, 1, 0x90",
    "ret",
    ".cfi_endproc",
    "mem_trace_test_anonymous:",
    ".cfi_startproc",
    ".fill 15, 1, 0x90",
    "ret",
    ".cfi_endproc",
    ".globl mem_trace_test_sized",
    ".type mem_trace_test_sized,@function",
    "mem_trace_test_sized:",
    ".cfi_startproc",
    ".fill 3, 1, 0x90",
    "ret",
    ".cfi_endproc",
    ".size mem_trace_test_sized, 4",
    ".fill 16, 1, 0x90",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn mem_trace_test_sizeless();
    fn mem_trace_test_sized();
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_symbol_names_only_the_function_it_is() {
    let sizeless = mem_trace_test_sizeless as *const () as usize;
    let sized = mem_trace_test_sized as *const () as usize;
    let mut sym = Symbolizer::new();
    let mut name = |addr: usize| {
        symbolize_addr(&mut sym, addr).map(|f| f.last().unwrap().function.clone().unwrap())
    };
    // Within its size; the offset is the return address's (probe + 1).
    assert_eq!(name(sized + 2).unwrap(), "mem_trace_test_sized+0x3");
    // Past the end of the sized symbol: padding no function holds.
    assert_eq!(name(sized + 4), Err(SymError::NoSymbol));
    assert_eq!(name(sized + 12), Err(SymError::NoSymbol));
    // No size: the FDE holding the address starts at the symbol.
    assert_eq!(name(sizeless + 5).unwrap(), "mem_trace_test_sizeless+0x6");
    // No size, and the FDE holding the address is another function's.
    assert_eq!(name(sizeless + 16 + 5), Err(SymError::NoSymbol));
}

#[test]
fn fde_bounds_of_a_rust_function() {
    // The test binary's own unwind tables agree with its symbol table on where a function
    // starts.
    let addr = marker_function as *const () as usize;
    let (_, bias, _, _) = module_of(addr);
    let data = std::fs::read("/proc/self/exe").unwrap();
    let data: &'static [u8] = Box::leak(data.into_boxed_slice());
    let elf = Elf::parse(data).unwrap();
    let svma = addr as u64 - bias;
    let (start, len) = super::bounds::fde_bounds(&elf, svma + 1).unwrap();
    assert_eq!(start, svma);
    assert!(len > 1, "{len}");
    assert_eq!(super::bounds::fde_bounds(&elf, 0), None);
}
