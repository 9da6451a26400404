//! Writes every toy family's GGUF file (`<family>.gguf`) into a directory, for
//! `scripts/llamacpp-reference.py` to run llama.cpp on:
//! `cargo run -p test_support --example write-toy-ggufs -- DIR`.

use std::path::PathBuf;
use std::process::ExitCode;

use model::fsio;
use test_support::families::{FAMILIES, toy_gguf};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: write-toy-ggufs DIR");
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for family in FAMILIES {
        let bytes = toy_gguf(family).expect("FAMILIES lists only families toy_gguf makes");
        let path = dir.join(format!("{family}.gguf"));
        if let Err(e) = fsio::write_atomic(&path, &bytes) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
        println!("{} ({} bytes)", path.display(), bytes.len());
    }
    ExitCode::SUCCESS
}
