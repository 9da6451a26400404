#![no_main]

#[path = "../checks/gguf_model.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
