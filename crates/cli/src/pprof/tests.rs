use super::*;
use crate::stacks::{Frame, Stack};
use mem_trace_format::Counts;
use mem_trace_read::symbolize::SymFrame;

fn sym(name: &str, file: &str, line: u32) -> SymFrame {
    SymFrame {
        function: Some(name.into()),
        file: Some(file.into()),
        line,
        column: 0,
        inlined: false,
    }
}

fn profile() -> Profile {
    let main = Frame {
        ra: 0x40_1000,
        symbols: vec![sym("main", "/src/p.c", 9)],
        module: Some((b"/bin/p".to_vec(), 0)),
    };
    Profile {
        stacks: vec![
            Stack {
                id: 1,
                counts: Counts {
                    live_bytes: 100,
                    live_blocks: 2,
                    total_bytes: 300,
                    total_blocks: 6,
                    ..Counts::default()
                },
                frames: crate::stacks::shared(vec![
                    Frame {
                        ra: 0x40_1234,
                        symbols: vec![sym("inner", "/src/p.c", 3), sym("outer", "/src/p.c", 5)],
                        module: Some((b"/bin/p".to_vec(), 0)),
                    },
                    main.clone(),
                ]),
            },
            Stack {
                id: 2,
                counts: Counts {
                    live_bytes: 50,
                    live_blocks: 1,
                    total_bytes: 50,
                    total_blocks: 1,
                    ..Counts::default()
                },
                frames: crate::stacks::shared(vec![
                    Frame {
                        ra: 0x7f00_0000_1678,
                        symbols: vec![],
                        module: Some((b"/lib/libx.so".to_vec(), 0x7f00_0000_0000)),
                    },
                    main,
                ]),
            },
        ],
        now_seq: 10,
        peak_seq: 5,
        sample_mean: 0,
    }
}

fn modules() -> Vec<ModuleInfo> {
    vec![
        ModuleInfo {
            path: "/bin/p".into(),
            start: 0x40_0000,
            end: 0x40_4000,
            build_id: Some("abcd".into()),
        },
        ModuleInfo {
            path: "/lib/libx.so".into(),
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            build_id: None,
        },
    ]
}

#[test]
fn go_heap_convention_with_inlined_lines_and_thread_labels() {
    let threads = [ThreadShare {
        stack: 1,
        name: "worker".into(),
        tid: 77,
        blocks: 2,
        bytes: 100,
    }];
    let p = document(&profile(), &threads, &modules(), 123, "a test");
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(0), "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ]
    );
    assert_eq!(s(p.default_sample_type), "inuse_space");
    let period = p.period_type.unwrap();
    assert_eq!(
        (s(period.r#type), s(period.unit), p.period),
        ("space", "bytes", 1)
    );
    // Location ids run from 1; one location per return address, inlined frames as lines.
    let ids: Vec<u64> = p.location.iter().map(|l| l.id).collect();
    assert_eq!(ids, [1, 2, 3]);
    let names = |l: &proto::Location| -> Vec<String> {
        l.line
            .iter()
            .map(|ln| s(p.function[ln.function_id as usize - 1].name).to_string())
            .collect()
    };
    assert_eq!(names(&p.location[0]), ["inner", "outer"]);
    assert_eq!(p.location[0].line[0].line, 3);
    assert_eq!(names(&p.location[1]), ["main"]);
    assert_eq!(names(&p.location[2]), ["libx.so+0x1678"]);
    assert_eq!(p.location[2].mapping_id, 2);
    assert_eq!(p.location[0].mapping_id, 1);
    assert_eq!(s(p.mapping[0].build_id), "abcd");
    assert_eq!(p.mapping[1].build_id, 0);
    // Stack 1: its live blocks all on the worker's labelled sample, the allocations on one
    // sample without a thread; stack 2 has no thread share: one sample with everything.
    assert_eq!(p.sample.len(), 3);
    assert_eq!(p.sample[0].value, [0, 0, 2, 100]);
    assert_eq!(p.sample[0].location_id, [1, 2]);
    let label = p.sample[0].label[0];
    assert_eq!((s(label.key), s(label.str)), ("thread", "worker"));
    assert_eq!(
        (s(p.sample[0].label[1].key), p.sample[0].label[1].num),
        ("tid", 77)
    );
    assert_eq!(p.sample[1].value, [6, 300, 0, 0]);
    assert!(p.sample[1].label.is_empty());
    assert_eq!(p.sample[2].value, [1, 50, 1, 50]);
    assert_eq!(p.sample[2].location_id, [3, 2]);
    assert_eq!(s(p.comment[0]), "a test");
}

#[test]
fn the_encoding_is_gzipped_protobuf_that_decodes_back() {
    use prost::Message as _;
    let p = document(&profile(), &[], &modules(), 0, "");
    let bytes = encode(&p);
    assert_eq!(&bytes[..2], &[0x1f, 0x8b]);
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).unwrap();
    assert_eq!(proto::Profile::decode(&raw[..]).unwrap(), p);
}

#[test]
fn a_stack_without_frames_and_a_cut_stack_get_named_locations() {
    let mut prof = profile();
    prof.stacks[0].frames.clear();
    prof.stacks[1].frames.push(std::rc::Rc::new(Frame {
        ra: mem_trace_format::CUT_MARKER,
        ..Frame::default()
    }));
    let p = document(&prof, &[], &modules(), 0, "");
    let s = |i: i64| p.string_table[i as usize].as_str();
    let name =
        |id: u64| s(p.function[p.location[id as usize - 1].line[0].function_id as usize - 1].name);
    assert_eq!(name(p.sample[0].location_id[0]), "[no stack recorded]");
    assert_eq!(
        name(*p.sample[1].location_id.last().unwrap()),
        "[stack cut: MEM_TRACE_MAX_STACKS]"
    );
}
