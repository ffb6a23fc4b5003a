//! How far readable memory runs from an address: the check behind
//! [`Memory::extent_holds`](super::Memory::extent_holds).
//!
//! A live process's mappings come from `/proc/PID/maps`, kept for a short while: a reader
//! checks every slot array and chunk it reads (129 shards and more), and a process with
//! thousands of mappings takes a millisecond to list. A table may have moved to a new mapping
//! since the list was taken, so a range the kept list does not hold is checked again against
//! a fresh one before it is called too large.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a list of mappings is trusted for a range it holds.
const KEEP: Duration = Duration::from_millis(200);

/// Readable mappings as `(start, end)`, sorted, adjacent ones merged.
pub(crate) type Runs = Vec<(u64, u64)>;

/// The bytes from `addr` to the end of the run of readable memory holding it (0: unmapped).
pub(crate) fn extent_in(runs: &[(u64, u64)], addr: u64) -> u64 {
    let i = runs.partition_point(|&(start, _)| start <= addr);
    match i.checked_sub(1).map(|i| runs[i]) {
        Some((_, end)) if addr < end => end - addr,
        _ => 0,
    }
}

/// `Ok` when `len` bytes from `addr` are in `runs`, else the extent there.
pub(crate) fn holds_in(runs: &[(u64, u64)], addr: u64, len: u64) -> Result<(), u64> {
    let extent = extent_in(runs, addr);
    if len <= extent {
        Ok(())
    } else {
        Err(extent)
    }
}

/// Sorts `ranges` and merges those that touch.
pub(crate) fn merge(mut ranges: Vec<(u64, u64)>) -> Runs {
    ranges.sort_unstable();
    let mut runs: Runs = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match runs.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// The readable mappings of `pid`, from `/proc/PID/maps`; `None` when it cannot be read.
fn readable_runs(pid: i32) -> Option<Runs> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let ranges = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (range, perms) = (fields.next()?, fields.next()?);
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            perms.starts_with('r').then_some((start, end))
        })
        .collect();
    Some(merge(ranges))
}

/// The last list read, with its process and time.
static KEPT: Mutex<Option<(i32, Instant, Runs)>> = Mutex::new(None);

/// [`Memory::extent_holds`](super::Memory::extent_holds) for process `pid`.
pub(crate) fn process_holds(pid: i32, addr: u64, len: u64) -> Result<(), u64> {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, at, runs)) = kept.as_ref() {
        if *p == pid && at.elapsed() < KEEP && holds_in(runs, addr, len).is_ok() {
            return Ok(());
        }
    }
    // Unknown (no /proc, or the process is gone): the reads themselves will tell.
    let Some(runs) = readable_runs(pid) else {
        return Ok(());
    };
    let answer = holds_in(&runs, addr, len);
    *kept = Some((pid, Instant::now(), runs));
    answer
}

/// The runs of `[lo, hi)` (page-aligned) that process `pid` has resident or swapped out, from
/// `/proc/PID/pagemap` (bit 63: present, bit 62: swapped); the whole range when it cannot be
/// read. A page never touched is neither, and reading it would only find zeros. (A page an
/// earlier read from outside touched maps the zero page and counts as present: it costs a
/// read of zeros, nothing worse.)
pub(crate) fn process_resident(pid: i32, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    use std::os::unix::fs::FileExt as _;
    const PAGE: u64 = 4096;
    /// Pages whose entries are read at once.
    const BATCH: u64 = 4096;
    let whole = || if lo < hi { vec![(lo, hi)] } else { Vec::new() };
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/pagemap")) else {
        return whole();
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut entries = vec![0u8; (BATCH * 8) as usize];
    let mut page = lo / PAGE;
    let last = hi.div_ceil(PAGE);
    while page < last {
        let n = (last - page).min(BATCH);
        let buf = &mut entries[..(n * 8) as usize];
        if file.read_exact_at(buf, page * 8).is_err() {
            return whole();
        }
        for (i, e) in buf.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            if e & (3 << 62) == 0 {
                continue;
            }
            let a = ((page + i as u64) * PAGE).max(lo);
            let b = ((page + i as u64 + 1) * PAGE).min(hi);
            match out.last_mut() {
                Some(run) if run.1 == a => run.1 = b,
                _ => out.push((a, b)),
            }
        }
        page += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_extents_end_where_memory_does() {
        let runs = merge(vec![(0x3000, 0x4000), (0x1000, 0x2000), (0x2000, 0x2800)]);
        assert_eq!(runs, vec![(0x1000, 0x2800), (0x3000, 0x4000)]);
        assert_eq!(extent_in(&runs, 0x1000), 0x1800);
        assert_eq!(extent_in(&runs, 0x27f8), 8);
        assert_eq!(extent_in(&runs, 0x2800), 0);
        assert_eq!(extent_in(&runs, 0), 0);
        assert_eq!(extent_in(&runs, u64::MAX), 0);
        assert_eq!(holds_in(&runs, 0x1800, 0x1000), Ok(()));
        assert_eq!(holds_in(&runs, 0x1800, 0x1001), Err(0x1000));
        assert_eq!(holds_in(&runs, 0x2900, 1), Err(0));
    }

    #[test]
    fn this_process_holds_its_own_stack_and_not_a_terabyte() {
        let v = [0u64; 16];
        let me = std::process::id() as i32;
        assert_eq!(process_holds(me, v.as_ptr() as u64, 128), Ok(()));
        let big = process_holds(me, v.as_ptr() as u64, 1 << 40);
        assert!(
            matches!(big, Err(n) if (128..1 << 40).contains(&n)),
            "{big:?}"
        );
        assert_eq!(process_holds(me, 0x10, 8), Err(0));
        assert_eq!(process_holds(me, 0xffff_8000_0000_0000, 8), Err(0));
    }
}
