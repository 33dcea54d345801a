#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kerman_fuzz::splice_validator(data));
