#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kerman_fuzz::message_from_json(data));
