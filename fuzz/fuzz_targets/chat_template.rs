#![no_main]

#[path = "../checks/chat_template.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
