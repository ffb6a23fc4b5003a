//! `mem-trace pprof`: a heap profile in pprof's format (`profile.proto`, gzipped), in Go's
//! heap-profile convention, for `go tool pprof`, Grafana Pyroscope, Parca and speedscope.
//!
//! Four sample types, as Go's runtime writes them: `alloc_objects`/`alloc_space` (blocks and
//! bytes ever allocated) and `inuse_objects`/`inuse_space` (live now); `inuse_space` is the
//! default and comes last (speedscope reads `default_sample_type` as an index into the types
//! and clamps it to the last). The in-use values carry a `thread` label (the allocating
//! thread's name, with a numeric `tid`), split per thread from the live-block table; the
//! profiler's counters are per stack, not per thread, so the allocation totals go on one
//! sample per stack without a thread (with whatever in-use part the table did not account
//! for, so that every in-use total equals `mem-trace top`'s).
//!
//! Every location has a function name, the unnamed ones `module+0xOFFSET` (the ELF address,
//! which `addr2line -e module` takes): speedscope drops locations without a function, and
//! `go tool pprof` symbolizes bare addresses only from the binary on disk. Inlined frames are
//! lines of one location, innermost first. One mapping per module, its address range as
//! loaded, with the file name and GNU build id.

pub mod proto;

use crate::cli::PprofArgs;
use crate::error::{Error, Result};
use crate::flamegraph::write_to;
use crate::stacks::{self, Frame, Profile};
use mem_trace_format::non_negative;
use mem_trace_read::addr_map::AddrMap;
use mem_trace_read::target::Target;
use prost::Message as _;
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A loaded module as a mapping names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Its path.
    pub path: String,
    /// Its address range in the target.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Its GNU build id in hex, when the file has one.
    pub build_id: Option<String>,
}

/// Live blocks of one stack allocated by one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadShare {
    /// The stack id.
    pub stack: u32,
    /// The thread's name.
    pub name: String,
    /// Its kernel thread id.
    pub tid: u32,
    /// Live blocks.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The strings of a profile, each once; index 0 is "".
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the profile's locations and functions, each once.
struct Builder<'m> {
    strings: Strings,
    modules: &'m [ModuleInfo],
    locations: Vec<proto::Location>,
    by_address: AddrMap<u64>,
    functions: Vec<proto::Function>,
    by_function: HashMap<(String, String), u64>,
}

impl Builder<'_> {
    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (name.to_string(), file.to_string());
        if let Some(&id) = self.by_function.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.strings.get(name);
        let filename = self.strings.get(file);
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            filename,
        });
        self.by_function.insert(key, id);
        id
    }

    /// The mapping id of the module holding the call instruction before `ra` (0: none).
    fn mapping_of(&self, ra: u64) -> u64 {
        let at = ra.saturating_sub(1);
        self.modules
            .iter()
            .position(|m| m.start <= at && at < m.end)
            .map_or(0, |i| i as u64 + 1)
    }

    /// A location for a frame with no address of its own (no stack, a cut stack).
    fn pseudo(&mut self, name: &str) -> u64 {
        let key = u64::MAX - self.strings.get(name) as u64;
        if let Some(&id) = self.by_address.get(&key) {
            return id;
        }
        let function_id = self.function(name, "");
        self.push_location(key, 0, 0, vec![line(function_id, 0, 0)])
    }

    fn push_location(
        &mut self,
        key: u64,
        mapping: u64,
        address: u64,
        lines: Vec<proto::Line>,
    ) -> u64 {
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id: mapping,
            address,
            line: lines,
        });
        self.by_address.insert(key, id);
        id
    }

    fn location(&mut self, f: &Frame) -> u64 {
        if mem_trace_read::text::is_cut_marker(f.ra) {
            return self.pseudo(mem_trace_read::text::CUT_FOLDED);
        }
        if let Some(&id) = self.by_address.get(&f.ra) {
            return id;
        }
        let lines = if f.symbols.is_empty() {
            let name = raw_name(f);
            vec![line(self.function(&name, ""), 0, 0)]
        } else {
            f.symbols
                .iter()
                .map(|s| {
                    let name = s
                        .function
                        .as_deref()
                        .map_or_else(|| raw_name(f), str::to_string);
                    let file = s.file.as_deref().unwrap_or("");
                    line(self.function(&name, file), s.line, s.column)
                })
                .collect()
        };
        let mapping = self.mapping_of(f.ra);
        self.push_location(f.ra, mapping, f.ra, lines)
    }
}

fn line(function_id: u64, line: u32, column: u32) -> proto::Line {
    proto::Line {
        function_id,
        line: i64::from(line),
        column: i64::from(column),
    }
}

/// An unnamed frame: `module+0xOFFSET` (the ELF address), or the bare address.
fn raw_name(f: &Frame) -> String {
    match &f.module {
        Some((path, bias)) => {
            let path = String::from_utf8_lossy(path);
            let file = path.rsplit('/').next().unwrap_or(&path).to_string();
            format!("{file}+{:#x}", f.ra.wrapping_sub(*bias))
        }
        None => format!("{:#x}", f.ra),
    }
}

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The pprof profile of `profile`: its stacks' counts, the in-use part split by `threads`.
pub fn document(
    profile: &Profile,
    threads: &[ThreadShare],
    modules: &[ModuleInfo],
    time_nanos: i64,
    comment: &str,
) -> proto::Profile {
    let mut b = Builder {
        strings: Strings::new(),
        modules,
        locations: Vec::new(),
        by_address: AddrMap::default(),
        functions: Vec::new(),
        by_function: HashMap::new(),
    };
    let (count_unit, bytes_unit) = (b.strings.get("count"), b.strings.get("bytes"));
    let sample_type = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .iter()
    .enumerate()
    .map(|(i, name)| proto::ValueType {
        r#type: b.strings.get(name),
        unit: if i % 2 == 0 { count_unit } else { bytes_unit },
    })
    .collect::<Vec<_>>();
    let default_sample_type = sample_type[3].r#type;
    let (thread_key, tid_key) = (b.strings.get("thread"), b.strings.get("tid"));
    let mut shares: BTreeMap<u32, Vec<&ThreadShare>> = BTreeMap::new();
    for t in threads {
        shares.entry(t.stack).or_default().push(t);
    }
    let mut samples = Vec::new();
    for s in &profile.stacks {
        let mut location_id: Vec<u64> = s.frames.iter().map(|f| b.location(f)).collect();
        if location_id.is_empty() {
            location_id.push(b.pseudo(mem_trace_read::text::NO_STACK));
        }
        let c = &s.counts;
        let (mut live_blocks, mut live_bytes) =
            (non_negative(c.live_blocks), non_negative(c.live_bytes));
        for t in shares.get(&s.id).into_iter().flatten() {
            let (blocks, bytes) = (t.blocks.min(live_blocks), t.bytes.min(live_bytes));
            if blocks == 0 && bytes == 0 {
                continue;
            }
            live_blocks -= blocks;
            live_bytes -= bytes;
            let name = b.strings.get(&t.name);
            samples.push(proto::Sample {
                location_id: location_id.clone(),
                value: vec![0, 0, count(blocks), count(bytes)],
                label: vec![
                    proto::Label {
                        key: thread_key,
                        str: name,
                        ..Default::default()
                    },
                    proto::Label {
                        key: tid_key,
                        num: i64::from(t.tid),
                        ..Default::default()
                    },
                ],
            });
        }
        let rest = [c.total_blocks, c.total_bytes, live_blocks, live_bytes];
        if rest.iter().any(|&v| v != 0) {
            samples.push(proto::Sample {
                location_id,
                value: rest.map(count).to_vec(),
                label: Vec::new(),
            });
        }
    }
    let mapping = modules
        .iter()
        .enumerate()
        .map(|(i, m)| proto::Mapping {
            id: i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: 0,
            filename: b.strings.get(&m.path),
            build_id: m.build_id.as_deref().map_or(0, |id| b.strings.get(id)),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        })
        .collect();
    let space = b.strings.get("space");
    let comment = vec![b.strings.get(comment)];
    proto::Profile {
        sample_type,
        sample: samples,
        mapping,
        location: b.locations,
        function: b.functions,
        string_table: b.strings.table,
        time_nanos,
        period_type: Some(proto::ValueType {
            r#type: space,
            unit: bytes_unit,
        }),
        // Go's convention: the mean bytes between samples (its MemProfileRate); 1 when every
        // allocation is recorded.
        period: i64::try_from(profile.sample_mean.max(1)).unwrap_or(i64::MAX),
        comment,
        default_sample_type,
    }
}

/// The target's modules as mappings, each with the build id of its file (checked against
/// the loaded one when the target was opened).
pub fn modules(target: &Target) -> Vec<ModuleInfo> {
    target
        .modules()
        .iter()
        .map(|m| ModuleInfo {
            path: String::from_utf8_lossy(m.path.as_os_str().as_bytes()).into_owned(),
            start: m.start,
            end: m.end,
            build_id: m.file.as_deref().and_then(build_id),
        })
        .collect()
}

/// The build id of the ELF file at `path`, read from its headers and notes only (a big
/// program's file is tens of MB: read whole, it was a tenth of `pprof`'s time).
fn build_id(path: &Path) -> Option<String> {
    use object::Object as _;
    let cache = object::ReadCache::new(std::fs::File::open(path).ok()?);
    let file = object::File::parse(&cache).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Live blocks per (stack, thread), from the live-block table and the heap's tagged blocks:
/// every live block read, so a heap's worth of reads, unless the process has only ever had
/// one thread, whose share of each stack is then all of its live count in `profile` (a
/// compiler's: the heap read was most of `pprof`'s time).
pub fn thread_shares(target: &Target, profile: &Profile) -> Result<Vec<ThreadShare>> {
    let layout = |e: mem_trace_read::layout::Error| Error::new(format!("{}: {e}", target.name()));
    let tables = target.tables().map_err(layout)?;
    let names: HashMap<u32, (String, u32)> = tables
        .threads()
        .map_err(layout)?
        .into_iter()
        .map(|(i, t)| (i, (t.name, t.tid)))
        .collect();
    if let [(_, (name, tid))] = names.iter().collect::<Vec<_>>()[..] {
        return Ok(profile
            .stacks
            .iter()
            .filter(|s| s.counts.live_blocks > 0 || s.counts.live_bytes > 0)
            .map(|s| ThreadShare {
                stack: s.id,
                name: name.clone(),
                tid: *tid,
                blocks: non_negative(s.counts.live_blocks),
                bytes: non_negative(s.counts.live_bytes),
            })
            .collect());
    }
    let mut sums: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    for block in tables.blocks().map_err(layout)? {
        let (bytes, blocks) = tables.counted(&block);
        let e = sums.entry((block.stack, block.thread)).or_default();
        e.0 += blocks;
        e.1 += bytes;
    }
    Ok(sums
        .into_iter()
        .map(|((stack, thread), (blocks, bytes))| {
            let (name, tid) = names
                .get(&thread)
                .cloned()
                .unwrap_or_else(|| (format!("thread {thread}"), 0));
            ThreadShare {
                stack,
                name,
                tid,
                blocks,
                bytes,
            }
        })
        .collect())
}

/// The gzipped encoding of `profile`, as pprof files are.
pub fn encode(profile: &proto::Profile) -> Vec<u8> {
    // The fastest level: on a compiler's 34k stacks the default one was a fifth of the whole
    // command's time, for a file a third smaller.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&profile.encode_to_vec())
        .and_then(|()| gz.finish())
        .expect("compressing into memory")
}

/// The profile of `target` now, gzipped.
pub fn of_target(target: &Target) -> Result<Vec<u8>> {
    let profile = stacks::read(target, None)?;
    let threads = thread_shares(target, &profile)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut comment = format!("mem-trace heap profile of {}", target.name());
    if profile.sample_mean != 0 {
        comment += &format!(
            ", estimated from samples: {}",
            mem_trace_read::sample::rate(profile.sample_mean)
        );
    }
    Ok(encode(&document(
        &profile,
        &threads,
        &modules(target),
        now,
        &comment,
    )))
}

/// `mem-trace pprof TARGET -o FILE`.
pub fn command(args: &PprofArgs) -> Result<()> {
    // Run by the profiler's reports (`X.pb.gz` beside each) with every signal blocked.
    crate::flamegraph::unblock_signals();
    let target = args.target.open()?;
    let progress = crate::progress::Progress::start("reading and symbolizing the stacks");
    let bytes = of_target(&target);
    progress.finish();
    let bytes = bytes?;
    write_to(&args.output, |w| w.write_all(&bytes))
}

#[cfg(test)]
mod tests;
