//! The CLI's integration tests, one binary (`cargo test -p htpkv-cli --test it`), one module per
//! old test file; each runs the `htpkv` and `genie-run` binaries in child processes. What only
//! needs the binary under test is here; the rest they share is in `test_support`.

mod aihub_split_cli;
mod budget_cli;
mod chat_cli;
mod default_weights;
mod generate_cli;
mod genie_cli;
mod hostile_budget_cli;
mod hostile_cli;
mod hostile_files_cli;
mod hostile_input_cli;
mod interrupt_cli;
mod model_budget_cli;
mod qnn_cli;
mod real_qnn;
mod serve;
mod speculate_cli;
mod structured_cli;
mod windows_cli;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The `htpkv` binary with `args`, compiled models cached in `cache` and no model override.
pub fn htpkv_command(args: &[&str], cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_htpkv"));
    command
        .args(args)
        .env("HTPKV_CACHE_DIR", cache)
        .env_remove("HTPKV_MODEL_DIR");
    command
}

/// The standard output of a successful run (the run's stderr when it failed).
pub fn ok_stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The JSON document a successful run printed (the run's stderr when it failed).
pub fn ok_json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Runs the `htpkv` binary with compiled models cached in `cache` and no model override.
pub fn htpkv(args: &[&str], cache: &Path) -> Output {
    htpkv_command(args, cache).output().expect("runs")
}

/// [`htpkv`] with `stdin` written to its standard input (`htpkv chat`'s turns).
pub fn htpkv_with_stdin(args: &[&str], cache: &Path, stdin: &str) -> Output {
    let mut child = htpkv_command(args, cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// `htpkv compile --context 64 --ar 1,8 --convention aihub --tokenizer-json … --out dir/name`
/// with `extra` options (`--parts N`, `--split S`, …), stories260K, compiled models cached in
/// `dir/cache`.
pub fn compile_aihub(dir: &Path, name: &str, extra: &[&str]) -> Output {
    let tok = test_support::stories::stories_tokenizer_json(dir);
    let out = dir.join(name);
    let mut args = vec![
        "compile",
        "--context",
        "64",
        "--ar",
        "1,8",
        "--convention",
        "aihub",
    ];
    args.extend(extra);
    args.extend(["--tokenizer-json", tok.to_str().unwrap()]);
    args.extend(["--out", out.to_str().unwrap()]);
    htpkv(&args, &dir.join("cache"))
}
