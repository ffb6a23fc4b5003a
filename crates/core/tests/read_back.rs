//! The writer and the Rust reader agree on the layout: tables written by `mem-trace-core`
//! (its stores, as the hooks drive them) are decoded by `mem-trace-read` from this process's
//! memory, through the same path a reader of another process takes (`process_vm_readv`).

use mem_trace_core::store::{freed, stacks, table, threads};
use mem_trace_format::{Block, Freed};
use mem_trace_read::layout::{Error, Tables};
use mem_trace_read::memory::{Memory, Process, Unreadable};

mem_trace_core::define_header!();

/// The tests share the process's tables, and the freed-block history is a ring of a few
/// records: one test's frees would push out the record another looks for.
static TABLES: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn tables_written_in_process_read_back_through_process_vm_readv() {
    let _tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    let stack = [0x5555_0000_1234u64, 0x5555_0000_5678, 0x7fff_0000_9abc];
    let id = stacks::intern(&stack);
    let thread = threads::register_current(&threads::Local::new());
    let base = 0x7_0000_0000u64;
    for i in 0..1000u64 {
        assert!(table::insert(Block {
            addr: base + i * 64,
            size: 40,
            thread,
            seq: i + 1,
            stack: id,
        }));
    }
    let big = Block {
        addr: 0x8_0000_0000,
        size: 1 << 20,
        thread,
        seq: 5000,
        stack: id,
    };
    assert!(table::insert(big));
    freed::configure(64, true);
    let claim = freed::Claim::new();
    let gone = Block {
        addr: 0x9_0000_0000,
        size: 24,
        thread,
        seq: 7,
        stack: id,
    };
    freed::push(
        &claim,
        &Freed {
            block: gone,
            free_seq: 9,
            free_stack: id,
            free_thread: thread,
            by_realloc: true,
        },
    );

    let me = Process::this();
    let t = Tables::open(&me, &MEM_TRACE_HEADER as *const _ as u64).expect("open");
    let hit = t
        .find_containing(base + 64 * 77 + 39)
        .unwrap()
        .expect("a block");
    assert_eq!(
        (hit.addr, hit.size, hit.seq, hit.stack),
        (base + 64 * 77, 40, 78, id)
    );
    assert_eq!(
        t.find_containing(base + 64 * 77 + 40).unwrap(),
        None,
        "past its end"
    );
    assert_eq!(t.find_containing(big.addr + (1 << 19)).unwrap(), Some(big));
    assert_eq!(t.stack(id).unwrap().as_deref(), Some(&stack[..]));
    assert_eq!(t.stack(0).unwrap(), None);
    let th = t.thread(thread).unwrap().expect("this thread's record");
    // SAFETY: gettid has no preconditions.
    assert_eq!(th.tid, unsafe { libc::gettid() } as u32);
    assert!(!th.exited);
    let frees = t.frees_containing(gone.addr + 8).unwrap();
    assert_eq!(frees.len(), 1);
    assert_eq!(frees[0].block, gone);
    assert!(frees[0].by_realloc && frees[0].free_seq == 9);
    let totals = t.totals().unwrap();
    assert!(totals.blocks >= 1001 && totals.stacks >= 1 && totals.threads >= 1);
}

/// A header that is not one, or from another layout version, is refused with what was found.
#[test]
fn foreign_headers_are_refused() {
    struct Bytes(Vec<u8>);
    impl Memory for Bytes {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
            let a = addr as usize;
            let src = self.0.get(a..a + buf.len()).ok_or(Unreadable {
                addr,
                len: buf.len(),
            })?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }
    let mut bytes = vec![0u8; 144];
    assert!(matches!(
        Tables::open(&Bytes(bytes.clone()), 0),
        Err(Error::BadMagic { addr: 0, .. })
    ));
    bytes[..8].copy_from_slice(b"MEMTRACE");
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    let err = Tables::open(&Bytes(bytes.clone()), 0).err().unwrap();
    assert_eq!(err, Error::Version { found: 2 });
    assert!(err.to_string().contains("version 2") && err.to_string().contains("version 7"));
    // A version 5 header is 16 bytes shorter than ours: its version is still what is said.
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    assert_eq!(
        Tables::open(&Bytes(bytes.clone()), 0).err(),
        Some(Error::Version { found: 5 })
    );
    bytes[8..12].copy_from_slice(&mem_trace_format::VERSION.to_le_bytes());
    assert!(matches!(
        Tables::open(&Bytes(bytes[..100].to_vec()), 0),
        Err(Error::Unreadable(_))
    ));
}

/// The profiler's counters, driven through the same calls the hooks make, read back by the
/// reader: per-stack sums over the shared records and the threads' caches, the global and
/// per-thread live bytes and peaks.
#[cfg(feature = "profiler")]
#[test]
fn profile_counters_read_back() {
    let _tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    use mem_trace_core::guard::Guard;
    use mem_trace_core::record;

    // Fake block addresses: recorded, never dereferenced.
    let base = 0x20_0000_0000usize;
    let allocate = move |from: usize, n: usize, size: usize| {
        let g = Guard::enter().expect("not nested");
        for i in 0..n {
            record::allocated(&g, (base + (from + i) * 0x1000) as *mut _, size);
        }
    };
    /// The blocks are fake: the quarantine may hand them back, and nothing happens.
    struct Nothing;
    impl mem_trace_core::real::RealAlloc for Nothing {
        unsafe fn free(&self, _: *mut core::ffi::c_void) {}
    }
    let free = move |from: usize, n: usize| {
        let g = Guard::enter().expect("not nested");
        for i in 0..n {
            let d = record::free(&g, (base + (from + i) * 0x1000) as *mut _, &Nothing);
            assert_ne!(d, record::Disposition::Reject);
        }
    };
    allocate(0, 300, 1000);
    // Another thread frees a third of them and allocates its own.
    std::thread::spawn(move || {
        free(0, 100);
        allocate(1000, 10, 7);
    })
    .join()
    .unwrap();
    free(100, 50);

    let me = Process::this();
    let t = Tables::open(&me, &MEM_TRACE_HEADER as *const _ as u64).expect("open");
    let peaks = t.peaks().unwrap().expect("a profiler build");
    let counts = t.stack_counts().unwrap().expect("a profiler build");
    let live: u64 = counts.values().map(|c| c.live_bytes).sum();
    // Other tests in this binary record blocks too: at least ours, and the sums agree.
    assert_eq!(live, peaks.live_bytes);
    assert!(live >= 150 * 1000 + 70);
    assert!(peaks.peak_bytes >= 300 * 1000);
    let total: u64 = counts.values().map(|c| c.total_bytes).sum();
    assert!(total >= 300 * 1000 + 70);
    let threads = t.threads().unwrap();
    assert!(threads
        .iter()
        .any(|(_, th)| th.peak_bytes >= 300_000 && th.allocated_bytes >= 300_000));
    assert!(threads
        .iter()
        .any(|(_, th)| th.allocated_bytes == 70 && th.live_bytes == 70));
}
