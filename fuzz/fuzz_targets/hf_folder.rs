#![no_main]

#[path = "../checks/hf_folder.rs"]
mod check;

// One folder per fuzzing process (this crate is built apart from the workspace, without its
// test_support), made afresh for each input and removed after it; a failing check aborts.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("htpkv-fuzz-hf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    check::check(&dir, data);
    let _ = std::fs::remove_dir_all(&dir);
});
