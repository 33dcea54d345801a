//! Fuzz targets for kerman's parsers. The checks live in `checks.rs`, which
//! `tests/rust/fuzz_corpus.rs` also compiles, so `cargo test` replays the corpus through
//! exactly what the fuzzer ran.

mod checks;

pub use checks::{message_from_json, record_reader, splice_validator};
