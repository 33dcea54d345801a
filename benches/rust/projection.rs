//! Projection folds over a long session: what a UI or a reconnect pays to rebuild the inbox
//! and find the last accounted turn from the log alone.

use std::hint::black_box;

use criterion::{Criterion, SamplingMode, Throughput};
use kerman::{consumed_work, InboxProjection};

use crate::session::Builder;

pub fn benches(c: &mut Criterion) {
    let events = Builder::with_events(10_000).events();
    let projection = InboxProjection::fold(&events).expect("the generated splices replay");
    assert_eq!(projection.items().len(), 0, "every generated turn claims what it queued");
    assert!(consumed_work(&events).end.is_some());

    let mut group = c.benchmark_group("projection");
    // Milliseconds per iteration: flat sampling keeps the run inside the measurement time.
    group.sampling_mode(SamplingMode::Flat).sample_size(30);
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function(format!("inbox_fold/{}_events", events.len()), |b| {
        b.iter_with_large_drop(|| InboxProjection::fold(black_box(&events)).expect("replays"));
    });
    group.bench_function(format!("consumed_work/{}_events", events.len()), |b| b.iter(|| consumed_work(black_box(&events))));
    group.finish();
}
