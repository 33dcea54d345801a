//! Replays the committed fuzz corpus and crash reproducers (`fuzz/corpus/<target>/`,
//! `fuzz/regressions/<target>/`) through the same checks the fuzz targets run, so plain
//! `cargo test` keeps every input the fuzzer ever found interesting.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

#[path = "../../fuzz/src/checks.rs"]
mod checks;

fn replay(target: &str, check: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = fs::read_dir(fuzz.join(kind).join(target)) else { continue };
        inputs.extend(entries.map(|e| e.expect("reading the corpus").path()));
    }
    inputs.sort();
    assert!(!inputs.is_empty(), "no corpus for {target}");
    for path in &inputs {
        let data = fs::read(path).expect("reading a corpus file");
        assert!(
            catch_unwind(AssertUnwindSafe(|| check(&data))).is_ok(),
            "fuzz input {} fails its checks (see the panic above)",
            path.display()
        );
    }
}

#[test]
fn record_reader_corpus() {
    replay("record_reader", checks::record_reader);
}

#[test]
fn splice_validator_corpus() {
    replay("splice_validator", checks::splice_validator);
}

#[test]
fn message_from_json_corpus() {
    replay("message_from_json", checks::message_from_json);
}
