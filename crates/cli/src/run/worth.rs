//! Which exit reports of a run are worth keeping: a shell script under `mem-trace run` starts
//! a `cat` or a `wc` per line, each with a report of the C library's few kilobytes of locale
//! data, nothing lost; a hundred such files hide the one report that matters. They are not
//! kept, and the summary names their processes instead (`run --all-reports` keeps them).
//!
//! - A process that allocated nothing (a peak of 0 bytes): no report, whichever it is. Under
//!   sampling a peak of 0 only says no allocation was sampled, and the summary says that.
//! - Another process than the program `run` started, with nothing definitely or possibly lost,
//!   no double or invalid free, and a peak under [`SMALL_PEAK`]: no report.
//! - Everything else, and every final report (asked for when `run` was stopped), is kept.

/// The peak under which a process with nothing lost is not worth a report, unless it is the
/// program itself.
pub const SMALL_PEAK: u64 = 1 << 20;
/// [`SMALL_PEAK`] in words.
pub const SMALL_PEAK_SHOWN: &str = "1 MiB";

/// What becomes of one report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// The process allocated nothing.
    Nothing,
    /// No allocation of the process was sampled: it may have allocated, below the rate.
    NoneSampled,
    /// Nothing lost, and a peak under [`SMALL_PEAK`].
    Small,
}

/// The verdict on a report of kind `kind` (`at exit`, `final`, ...) whose text is `text`, of
/// the program itself (`program`) or one of its descendants.
pub fn verdict(text: &str, kind: &str, program: bool) -> Verdict {
    if kind != "at exit" {
        return Verdict::Keep;
    }
    let Some(peak) = peak(text) else {
        return Verdict::Keep;
    };
    if peak == 0 {
        return match text.contains("mem-trace: estimated from sampled allocations") {
            true => Verdict::NoneSampled,
            false => Verdict::Nothing,
        };
    }
    let nothing_lost = lost(text).is_some_and(|(definitely, possibly)| definitely + possibly == 0);
    if !program && peak < SMALL_PEAK && nothing_lost && errors(text) == 0 {
        Verdict::Small
    } else {
        Verdict::Keep
    }
}

/// The peak of a report's first line (`... peak 16726 bytes`).
fn peak(text: &str) -> Option<u64> {
    let first = text.lines().next()?;
    first
        .rsplit_once(", peak ")?
        .1
        .strip_suffix(" bytes")?
        .parse()
        .ok()
}

/// The bytes definitely and possibly lost, from the leak check's line.
fn lost(text: &str) -> Option<(u64, u64)> {
    leak_check(text).map(|c| (c.definitely.0, c.possibly.0))
}

/// A report's leak check, as its first line sums it up: (bytes, blocks) of each class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeakCheck {
    pub definitely: (u64, u64),
    pub possibly: (u64, u64),
}

/// The leak check's line of a report (`mem-trace: leak check: definitely lost: 300 bytes in
/// 2 blocks (direct: ...); possibly lost: 0 bytes in 0 blocks; ...`); `None` without one.
pub fn leak_check(text: &str) -> Option<LeakCheck> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("mem-trace: leak check: definitely lost: "))?;
    let possibly = line.split_once("possibly lost: ")?.1;
    Some(LeakCheck {
        definitely: bytes_in_blocks(line)?,
        possibly: bytes_in_blocks(possibly)?,
    })
}

/// `N bytes in M block(s)` at the start of `s`.
fn bytes_in_blocks(s: &str) -> Option<(u64, u64)> {
    let mut words = s.split(' ');
    let bytes = words.next()?.parse().ok()?;
    let blocks = words.nth(2)?.parse().ok()?;
    Some((bytes, blocks))
}

/// The double and invalid frees a report counts (`mem-trace: errors: N double or invalid
/// free(s), ...`; none without the line).
pub fn errors(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("mem-trace: errors: "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(peak: u64, lost: u64, possibly: u64) -> String {
        format!(
            "mem-trace: report 1 (at exit) at 0.005 s: 12430 bytes live in 145 blocks, peak {peak} bytes\n\
             mem-trace: leak check: definitely lost: {lost} bytes in 1 block (direct: {lost} bytes in 1 block, indirect: 0 bytes in 0 blocks); possibly lost: {possibly} bytes in 0 blocks; still reachable: 5 bytes in 1 block\n"
        )
    }

    #[test]
    fn small_clean_descendants_and_empty_processes_are_not_kept() {
        assert_eq!(
            verdict(&report(16726, 0, 0), "at exit", false),
            Verdict::Small
        );
        assert_eq!(
            verdict(&report(16726, 0, 0), "at exit", true),
            Verdict::Keep
        );
        assert_eq!(verdict(&report(0, 0, 0), "at exit", true), Verdict::Nothing);
        let sampled = report(0, 0, 0).replacen(
            "\n",
            "\nmem-trace: estimated from sampled allocations: this process samples one allocation per 512 KiB allocated (MEM_TRACE_SAMPLE)\n",
            1,
        );
        assert_eq!(verdict(&sampled, "at exit", true), Verdict::NoneSampled);
        assert_eq!(
            verdict(&report(16726, 8, 0), "at exit", false),
            Verdict::Keep
        );
        assert_eq!(
            verdict(&report(16726, 0, 8), "at exit", false),
            Verdict::Keep
        );
        assert_eq!(
            verdict(&report(SMALL_PEAK, 0, 0), "at exit", false),
            Verdict::Keep
        );
        // Final reports were asked for; what cannot be read is kept.
        assert_eq!(verdict(&report(0, 0, 0), "final", false), Verdict::Keep);
        assert_eq!(
            verdict("mem-trace: report 1 (at exit)\n", "at exit", false),
            Verdict::Keep
        );
        // A bad free keeps a report.
        let bad_free = report(16726, 0, 0).replacen(
            "\n",
            "\nmem-trace: errors: 1 double or invalid free, each reported on stderr when it happened\n",
            1,
        );
        assert_eq!(verdict(&bad_free, "at exit", false), Verdict::Keep);
        assert_eq!(errors(&bad_free), 1);
        assert_eq!(
            leak_check(&report(16726, 8, 3)),
            Some(LeakCheck {
                definitely: (8, 1),
                possibly: (3, 0)
            })
        );
        // No leak check (MEM_TRACE_LEAKS=0 is not run's, but a report may lack it): kept.
        let no_check =
            "mem-trace: report 1 (at exit) at 0.1 s: 1 bytes live in 1 block, peak 9 bytes\n";
        assert_eq!(verdict(no_check, "at exit", false), Verdict::Keep);
    }
}
