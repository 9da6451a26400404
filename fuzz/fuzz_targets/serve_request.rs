#![no_main]

#[path = "../checks/serve_request.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
