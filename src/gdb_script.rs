//! Embeds the gdb commands into `libmem_trace.so`, so gdb loads them by itself wherever
//! `add-auto-load-safe-path` allows (docs/FINDINGS.md, "Embedding the gdb script in the
//! library"). A `.debug_gdb_scripts` entry is the byte 4 (inline Python script), the
//! script's name, a newline, the script text and a NUL. It survives `strip`. The embedded
//! script is the self-contained one `build.rs` generates from `python/mem_trace_gdb`: gdb runs
//! it from memory, with no package on disk.

const SCRIPT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mem_trace_embedded.py"));
const NAME: &[u8] = b"mem_trace.py";
const LEN: usize = 1 + NAME.len() + 1 + SCRIPT.len() + 1;

const fn entry() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    out[0] = 4;
    let mut i = 0;
    while i < NAME.len() {
        out[1 + i] = NAME[i];
        i += 1;
    }
    out[1 + NAME.len()] = b'\n';
    let mut j = 0;
    while j < SCRIPT.len() {
        out[2 + NAME.len() + j] = SCRIPT[j];
        j += 1;
    }
    out
}

#[used]
#[link_section = ".debug_gdb_scripts"]
static GDB_SCRIPT: [u8; LEN] = entry();

#[cfg(test)]
mod tests {
    #[test]
    fn entry_is_well_formed() {
        let e = super::entry();
        assert_eq!(e[0], 4);
        assert!(e[1..].starts_with(b"mem_trace.py\n"));
        assert_eq!(*e.last().unwrap(), 0);
        assert!(
            !super::SCRIPT.contains(&0),
            "a NUL would end the script early"
        );
    }
}
