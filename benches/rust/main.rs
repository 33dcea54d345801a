//! Criterion micro-benchmarks of the Rust core's hot paths (`make bench-rust`).
//!
//! They time the core alone, with no Python around it, so a change in the core shows up here
//! before it is lost in the noise of the end-to-end ratios of `benches/python/bench.py`.
//! What each one measures is listed in docs/performance.md.

mod inbox;
mod projection;
mod records;
mod session;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

/// Short runs, so the whole set takes about a minute: on a shared 2-core VM longer runs buy
/// less precision than the drift between runs costs. Command-line flags still override this.
fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2)).without_plots()
}

criterion_group! {
    name = micro;
    config = config();
    targets = inbox::benches, records::benches, projection::benches
}
criterion_main!(micro);
