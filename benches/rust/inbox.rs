//! Inbox mutations: the core of P1 (append + remove pair) and P2 (claim of 10), without the
//! Python binding around them.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use kerman::inbox::{Lists, Splice};
use kerman::{Inbox, MemoryStore, Store, Target};

use crate::session::user_message;

/// Pairs run against one log before it is replaced: every pair commits two events, and a log
/// that grew for the whole run would hold gigabytes and measure `Vec` growth, not the inbox.
const PAIRS_PER_LOG: u64 = 10_000;

fn fresh_inbox() -> Inbox {
    let log = MemoryStore::new().create(None).expect("a new memory session");
    Inbox::new(log, None).expect("an empty log replays")
}

pub fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("splice");
    // A short prompt, as in P1. Its JSON is cached on first use, so the pair measures
    // normalise + validate + commit + apply, not message serialisation.
    let message = user_message(40, 1);

    group.bench_function("inbox_append_remove_pair", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = (iters - done).min(PAIRS_PER_LOG);
                let inbox = fresh_inbox();
                let start = Instant::now();
                for _ in 0..n {
                    inbox.append(Target::NextTurn, Arc::clone(&message)).expect("append");
                    black_box(inbox.remove(message.id()).expect("remove"));
                }
                timed += start.elapsed();
                done += n;
            }
            timed
        });
    });

    // The same pair on bare lists: what is left of the one above without the log commit.
    group.bench_function("lists_insert_remove_pair", |b| {
        let inserted = vec![Arc::clone(&message)];
        let insert = Splice { target: Target::NextTurn, start: 0, removed: 0, inserted, canceled: false, by: None };
        let remove = Splice { target: Target::NextTurn, start: 0, removed: 1, inserted: Vec::new(), canceled: true, by: None };
        let mut lists = Lists::default();
        b.iter(|| {
            lists.splice(black_box(&insert)).expect("insert");
            black_box(lists.splice(black_box(&remove)).expect("remove"))
        });
    });
    group.finish();

    let mut group = c.benchmark_group("claim");
    let batch: Vec<_> = (0..10).map(|i| user_message(40, 100 + i)).collect();
    group.bench_function("next_step_batch_of_10", |b| {
        // A fresh inbox per claim: the ten appends (and the log's allocation) stay untimed,
        // and so does dropping it afterwards. Batches of 32 keep the prepared inboxes in cache,
        // as P2's one long-lived inbox is; `SmallInput` prepares thousands at once and then
        // times cache misses (0.7-1.4 µs against a steady 0.5 µs here).
        b.iter_batched_ref(
            || {
                let inbox = fresh_inbox();
                for m in &batch {
                    inbox.append(Target::NextStep, Arc::clone(m)).expect("append");
                }
                inbox
            },
            |inbox| inbox.claim(Target::NextStep, 1).expect("claim"),
            BatchSize::NumIterations(32),
        );
    });
    group.finish();
}
