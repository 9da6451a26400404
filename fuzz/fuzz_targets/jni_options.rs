#![no_main]

#[path = "../checks/jni_options.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
