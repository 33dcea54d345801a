//! Records: serialising events for the writer, and reading them back (CRC-32C check + typed
//! parse) as `FileStore::open` does, per record and for a whole ~1 MB session file.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, SamplingMode, Throughput};
use kerman::event_log::file::raw;
use kerman::Event;

use crate::session::{file_bytes, frame, Builder};

/// The three records worth telling apart: a prompt splice (small, one message), an assistant
/// message with a tool call (cites its chunks) and a ~6 kB tool result.
fn samples(events: &[Event]) -> Vec<(&'static str, Event)> {
    let find = |kind: &str| events.iter().find(|e| e.kind() == kind).cloned().expect("the turn logs this type");
    vec![
        ("splice_user_message", find("agent/inbox/spliced")),
        ("assistant_message_tool_call", find("assistant/message")),
        ("tool_result_6k", find("tool/result")),
    ]
}

pub fn benches(c: &mut Criterion) {
    let one_turn = Builder::with_events(1).events();
    let samples = samples(&one_turn);

    let mut group = c.benchmark_group("event_to_json");
    for (name, event) in &samples {
        group.throughput(Throughput::Bytes(event.to_json().len() as u64));
        group.bench_function(*name, |b| b.iter(|| black_box(event).to_json()));
    }
    group.finish();

    let mut group = c.benchmark_group("record_read");
    // Type strings are interned across a file, so a long scan almost always hits; a hit must
    // not allocate, as in the reader.
    let mut types: HashMap<String, Arc<str>> = HashMap::new();
    let mut intern = |kind: &str| -> Arc<str> {
        if let Some(k) = types.get(kind) {
            return Arc::clone(k);
        }
        let k: Arc<str> = Arc::from(kind);
        types.insert(kind.to_string(), Arc::clone(&k));
        k
    };
    for (name, event) in &samples {
        let line = frame(&event.to_json());
        group.throughput(Throughput::Bytes(line.len() as u64 + 1));
        group.bench_function(format!("unframe_parse/{name}"), |b| {
            b.iter(|| {
                let json = raw::unframe(black_box(line.as_bytes())).expect("checksum matches");
                Event::from_json(json, &mut intern).expect("a valid record")
            });
        });
    }
    // The checksum alone, on the largest record: how much of its read is CRC-32C.
    let (_, tool_result) = &samples[2];
    let line = frame(&tool_result.to_json());
    group.throughput(Throughput::Bytes(line.len() as u64 + 1));
    group
        .bench_function("unframe/tool_result_6k", |b| b.iter(|| raw::unframe(black_box(line.as_bytes())).expect("checksum matches").len()));
    group.finish();

    let session = Builder::with_file_size(1_000_000);
    let bytes = file_bytes(&session.log);
    let id = session.log.id().to_string();
    let check = raw::scan(&bytes, &id).expect("the header reads");
    assert!(check.corruption.is_none() && check.good_len == bytes.len() as u64, "the generated file reads back whole");
    assert_eq!(check.events.len() as u64, session.log.len());

    let mut group = c.benchmark_group("session_scan");
    // Milliseconds per iteration: flat sampling keeps the run inside the measurement time.
    group.sampling_mode(SamplingMode::Flat).sample_size(30);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function(format!("file_{}_events", check.events.len()), |b| {
        // The events are kept by `open`; dropping them is not part of the read.
        b.iter_with_large_drop(|| raw::scan(black_box(&bytes), &id).expect("the header reads"));
    });
    group.finish();
}
