//! The roots of hand-built targets: this test process's own modules and mappings for the
//! data, synthetic memory for the threads.

use super::*;
use crate::memory::Process;
use crate::test_image::Image;

fn mapping(start: u64, end: u64, perms: &str, name: &str) -> Mapping {
    let p = perms.as_bytes();
    Mapping {
        start,
        end,
        read: p[0] == b'r',
        write: p[1] == b'w',
        exec: p[2] == b'x',
        offset: 0,
        name: name.into(),
    }
}

/// This process's mappings and its executable as a module, from `/proc/self/maps`.
fn this_process() -> (Vec<Module>, Vec<Mapping>) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let mut mappings = Vec::new();
    let mut module: Option<Module> = None;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (lo, hi) = f[0].split_once('-').unwrap();
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).unwrap(),
            u64::from_str_radix(hi, 16).unwrap(),
        );
        let name = f.get(5).copied().unwrap_or("");
        let mut m = mapping(lo, hi, f[1], name);
        m.offset = u64::from_str_radix(f[2], 16).unwrap();
        if std::path::Path::new(name) == exe {
            // A PIE's first segment is linked at 0: its bias is where it is mapped.
            let md = module.get_or_insert(Module {
                path: exe.clone(),
                file: Some(exe.clone()),
                start: lo,
                end: hi,
                bias: lo - m.offset,
            });
            md.end = hi;
        }
        mappings.push(m);
    }
    (vec![module.expect("the executable is mapped")], mappings)
}

static mut DATA: [u64; 4] = [1, 2, 3, 4];
static mut BSS: [u64; 64] = [0; 64];

#[test]
fn data_roots_are_the_writable_sections_and_never_the_tracers() {
    let (modules, mappings) = this_process();
    let me = Process::this();
    let (data, bss) = (
        core::ptr::addr_of!(DATA) as u64,
        core::ptr::addr_of!(BSS) as u64,
    );
    // Another address holds the header: the executable's data are roots, and the vDSO's.
    let r = roots(&me, 0x10, &modules, &mappings, &[], &[], None);
    let covered = |a: u64| r.ranges.iter().any(|r| r.lo <= a && a < r.hi);
    assert!(covered(data) && covered(bss), "{r:?}");
    let code = mapping as fn(u64, u64, &str, &str) -> Mapping as usize as u64;
    assert!(!covered(code), "code is not a root");
    let vdso = usize::from(mappings.iter().any(|m| m.name == "[vdso]"));
    assert_eq!(r.objects, 1 + vdso);
    assert_eq!((r.stacks, r.register_sets), (0, 0));
    // The header in the executable's data: it is the tracer, and none of its data is a root.
    let r = roots(&me, data, &modules, &mappings, &[], &[], None);
    assert!(!r.ranges.iter().any(|r| r.lo <= bss && bss < r.hi));
    assert_eq!(r.objects, vdso);
}

#[test]
fn a_module_whose_file_is_gone_counts_with_its_writable_mappings() {
    let gone = Module {
        path: "/nonexistent/libgone.so".into(),
        file: None,
        start: 0x1000,
        end: 0x5000,
        bias: 0x1000,
    };
    let mappings = [
        mapping(0x1000, 0x2000, "r-x", "/nonexistent/libgone.so"),
        mapping(0x3000, 0x4000, "rw-", "/nonexistent/libgone.so"),
    ];
    let r = roots(
        &Image::new(),
        0x10,
        std::slice::from_ref(&gone),
        &mappings,
        &[],
        &[],
        None,
    );
    assert_eq!(r.ranges, [Root::range(0x3000, 0x4000)]);
    assert_eq!(r.objects, 1);
    // A path that names no regular file (a FIFO would block a plain open): the same.
    let fifo = std::env::temp_dir().join(format!("mem-trace-roots-{}", std::process::id()));
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let named = |m: &Mapping| Mapping {
        name: fifo.display().to_string(),
        ..m.clone()
    };
    let odd = Module {
        path: fifo.clone(),
        ..gone
    };
    let r = roots(
        &Image::new(),
        0x10,
        &[odd],
        &mappings.map(|m| named(&m)),
        &[],
        &[],
        None,
    );
    let _ = std::fs::remove_file(&fifo);
    assert_eq!(r.ranges, [Root::range(0x3000, 0x4000)]);
}

#[test]
fn a_stopped_threads_stack_from_its_red_zone_up_and_its_registers() {
    let mut img = Image::new();
    let stack = img.map(0x4000);
    let other = img.map(0x1000);
    let mappings = [
        mapping(stack, stack + 0x4000, "rw-", "[stack]"),
        mapping(other, other + 0x1000, "rw-", ""),
    ];
    let threads = [
        ThreadState {
            tid: 1,
            sp: Some(stack + 0x3000),
            registers: vec![1, 2, 3],
        },
        // A red zone below the mapping's start is cut to the mapping.
        ThreadState {
            tid: 2,
            sp: Some(other + 0x40),
            registers: vec![4],
        },
    ];
    let r = roots(&img, 0x10, &[], &mappings, &threads, &[], None);
    assert_eq!(
        r.ranges,
        [
            Root::range(stack + 0x3000 - 128, stack + 0x4000),
            Root::range(other, other + 0x1000)
        ]
    );
    assert_eq!(r.words, [1, 2, 3, 4]);
    assert_eq!((r.stacks, r.register_sets), (2, 2));
}

#[test]
fn a_stack_pointer_in_no_mapping_probes_readable_pages() {
    let mut img = Image::new();
    let stack = img.map(0x3000);
    let threads = [ThreadState {
        tid: 1,
        sp: Some(stack + 0x1010),
        registers: vec![9],
    }];
    let r = roots(&img, 0x10, &[], &[], &threads, &[], None);
    assert_eq!(
        r.ranges,
        [Root::range(stack + 0x1010 - 128, stack + 0x3000)]
    );
}

#[test]
fn a_running_process_scans_its_stack_mappings_whole() {
    let mut img = Image::new();
    let main = img.map(0x2000);
    let thread = img.map(0x8000);
    let heap = img.map(0x8000);
    let plain = img.map(0x8000);
    let exited = img.map(0x8000);
    let unguarded = img.map(0x8000);
    // A thread control block near the top of the thread's stack, one in the heap, one of a
    // thread that exited (its stack kept for reuse, its id cleared), and one in memory with no
    // guard page below it (a look-alike in some other anonymous mapping).
    for (base, tid) in [(thread, 2u32), (heap, 2), (exited, 0), (unguarded, 2)] {
        let tcb = base + 0x7000;
        img.write_u64(tcb, tcb);
        img.write_u64(tcb + 16, tcb);
        img.write(tcb + 0x2d0, &tid.to_le_bytes());
    }
    // An 8-byte-aligned but not 64-byte-aligned look-alike is not one.
    img.write_u64(plain + 0x7008, plain + 0x7008);
    img.write_u64(plain + 0x7018, plain + 0x7008);
    // glibc's guard page right below each stack, so only the other checks reject the others.
    let guard = |base: u64| mapping(base - 0x1000, base, "---", "");
    let mappings = [
        mapping(main, main + 0x2000, "rw-", "[stack]"),
        guard(thread),
        mapping(thread, thread + 0x8000, "rw-", ""),
        guard(heap),
        mapping(heap, heap + 0x8000, "rw-", ""),
        guard(plain),
        mapping(plain, plain + 0x8000, "rw-", ""),
        guard(exited),
        mapping(exited, exited + 0x8000, "rw-", ""),
        mapping(unguarded, unguarded + 0x8000, "rw-", ""),
    ];
    let threads = [
        ThreadState {
            tid: 1,
            sp: None,
            registers: vec![],
        },
        ThreadState {
            tid: 2,
            sp: None,
            registers: vec![],
        },
    ];
    let blocks = [Live::new(heap + 0x100, 64, 1)];
    let r = roots(&img, 0x10, &[], &mappings, &threads, &blocks, None);
    assert_eq!(
        r.ranges,
        [
            Root::range(main, main + 0x2000),
            Root::range(thread, thread + 0x8000)
        ]
    );
    assert_eq!((r.stacks, r.register_sets), (2, 0));
    assert!(r.words.is_empty());
    // A stack pointer known without registers (a running thread): its whole mapping.
    let known = [ThreadState {
        tid: 2,
        sp: Some(thread + 0x7800),
        registers: vec![],
    }];
    let r = roots(&img, 0x10, &[], &mappings, &known, &blocks, None);
    assert_eq!(r.ranges, [Root::range(thread, thread + 0x8000)]);
}

#[test]
fn every_thread_control_blocks_dtv_is_a_loose_word() {
    let mut img = Image::new();
    let live = img.map(0x8000);
    let exited = img.map(0x8000);
    let cored = img.map(0x8000);
    let unguarded = img.map(0x8000);
    // Control blocks whose `dtv` word (+8) is a DTV's start + 16: a live thread's, an exited
    // one's (its stack kept by glibc), one under a guard as gcore writes it (read-only), and a
    // look-alike with no guard below.
    for (k, base) in [live, exited, cored, unguarded].into_iter().enumerate() {
        let tcb = base + 0x7000;
        img.write_u64(tcb, tcb);
        img.write_u64(tcb + 8, 0x5555_0000_0000 + 0x1000 * k as u64 + 16);
        img.write_u64(tcb + 16, tcb);
    }
    let guard = |base: u64, perms: &str| mapping(base - 0x1000, base, perms, "");
    let mappings = [
        guard(live, "---"),
        mapping(live, live + 0x8000, "rw-", ""),
        guard(exited, "---"),
        mapping(exited, exited + 0x8000, "rw-", ""),
        guard(cored, "r--"),
        mapping(cored, cored + 0x8000, "rw-", ""),
        mapping(unguarded, unguarded + 0x8000, "rw-", ""),
    ];
    let r = roots(&img, 0x10, &[], &mappings, &[], &[], None);
    assert_eq!(
        r.words,
        [0x5555_0000_0000, 0x5555_0000_1000, 0x5555_0000_2000]
    );
}
