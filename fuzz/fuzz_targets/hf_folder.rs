#![no_main]

#[path = "../checks/hf_folder.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
