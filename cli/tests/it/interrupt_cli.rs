//! Ctrl-C and `--stop` from the command line: a SIGINT while text streams cancels the generation at
//! a step boundary, exits 0 and still saves the session; a stop string ends the text unprinted.

use crate::{htpkv, htpkv_command};
use std::io::Read;
use std::process::Stdio;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

#[test]
fn ctrl_c_cancels_generation_and_save_still_saves() {
    let cache = ScratchDir::new("interrupt-ctrl-c");
    let dir = stories260k_dir();
    let dir = dir.to_str().unwrap();
    let saved = cache.join("cancelled.session");
    let saved = saved.to_str().unwrap();
    // Compile first, so the SIGINT lands while text streams (not while compiling).
    let warm = htpkv(&["generate", "--model", dir, "--steps", "1"], &cache);
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );
    let args = [
        "generate",
        "Once upon a time",
        "--model",
        dir,
        "--steps",
        "1000000",
        "--overflow",
        "slide",
        "--save",
        saved,
    ];
    let mut child = htpkv_command(&args, &cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = vec![0u8; 200];
    stdout.read_exact(&mut seen).expect("text streams");
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("stopped: cancelled"), "{stderr}");
    // The saved session continues.
    let resumed = htpkv(
        &[
            "generate", "", "--model", dir, "--resume", saved, "--steps", "8", "--json",
        ],
        &cache,
    );
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(doc["generated_tokens"], 8, "{doc}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_stop_string_ends_the_text_unprinted_and_json_names_the_finish_reason() {
    let cache = ScratchDir::new("interrupt-stop");
    let dir = stories260k_dir();
    let dir = dir.to_str().unwrap();
    let base = [
        "generate",
        "Once upon a time",
        "--model",
        dir,
        "--steps",
        "48",
        "--json",
    ];
    let whole = htpkv(&base, &cache);
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let whole: serde_json::Value = serde_json::from_slice(&whole.stdout).unwrap();
    assert_eq!(whole["finish_reason"], "length");
    let text = whole["text"].as_str().unwrap();
    // The third word of the text, with the space before it.
    let word = text.split(' ').nth(3).unwrap();
    let stop = format!(" {word}");
    let cut = text.find(&stop).unwrap();
    let stopped = htpkv(&[&base[..], &["--stop", &stop]].concat(), &cache);
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    let stopped: serde_json::Value = serde_json::from_slice(&stopped.stdout).unwrap();
    assert_eq!(stopped["finish_reason"], "stop");
    assert_eq!(stopped["text"], text[..cut]);
    // Streamed (no --json): the prompt, then the same text, never the stop string.
    let streamed = htpkv(&[&base[..6], &["--stop", &stop]].concat(), &cache);
    let printed = String::from_utf8(streamed.stdout).unwrap();
    assert_eq!(
        printed.trim_end(),
        format!("Once upon a time{}", &text[..cut]).trim_end()
    );
    let refused = htpkv(&[&base[..], &["--stop", ""]].concat(), &cache);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("stop string"));
    std::fs::remove_dir_all(&cache).unwrap();
}
