//! Hostile input to `htpkv compile` and `htpkv generate` (issue 14, rows 5-16): every case ends
//! in a clear error, fast, without touching files it must not touch.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::htpkv;
use test_support::cli::compile_args;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

/// A copy of the model in `work/other` whose checkpoint differs in one bit of its last weight;
/// returns the directory and the altered checkpoint's bytes.
fn altered_model(dir: &Path, work: &Path) -> (PathBuf, Vec<u8>) {
    let other = work.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut ckpt = std::fs::read(dir.join("stories260K.bin")).unwrap();
    let last = ckpt.len() - 1;
    ckpt[last] ^= 0x01;
    std::fs::write(other.join("stories260K.bin"), &ckpt).unwrap();
    std::fs::copy(dir.join("tok512.bin"), other.join("tok512.bin")).unwrap();
    (other, ckpt)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The error line of a failed run.
fn failure(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = stderr(o);
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {err}"))
        .to_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(args: &[String], cache: &Path) -> Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    htpkv(&refs, cache)
}

/// Row 5: /dev/zero as checkpoint or tokenizer was read without a cap (10 GB, hang).
#[test]
fn dev_zero_inputs_fail_fast() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-zero");
    let out = work.join("m.htpkv");
    let started = Instant::now();
    let o = htpkv(
        &[
            "compile",
            "--model",
            "/dev/zero",
            "--tokenizer",
            s(&dir.join("tok512.bin")),
            "--out",
            s(&out),
        ],
        &work,
    );
    assert_eq!(
        failure(&o),
        "error: checkpoint /dev/zero is a character device, not a regular file"
    );
    let mut args = compile_args(&dir, &out, &[]);
    args[4] = "/dev/zero".into();
    let o = run(&args, &work);
    assert_eq!(
        failure(&o),
        "error: tokenizer /dev/zero is a character device, not a regular file"
    );
    let o = run(
        &compile_args(&dir, &out, &["--calibration-prompts", "/dev/zero"]),
        &work,
    );
    assert_eq!(
        failure(&o),
        "error: calibration prompt file /dev/zero is a character device, not a regular file"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(!out.exists());
}

/// Row 7: `--out` a device, FIFO, symlink or the checkpoint itself was replaced by a file.
#[test]
fn compile_never_clobbers_special_files_or_its_inputs() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-clobber");
    let o = run(&compile_args(&dir, Path::new("/dev/null"), &[]), &work);
    assert_eq!(
        failure(&o),
        "error: refusing to write /dev/null: it is a character device, not a regular file"
    );
    let target = work.join("precious");
    std::fs::write(&target, b"keep").unwrap();
    let link = work.join("link.htpkv");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = run(&compile_args(&dir, &link, &[]), &work);
    assert!(
        failure(&o).contains("it is a symbolic link"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let fifo = work.join("fifo");
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let o = run(&compile_args(&dir, &fifo, &[]), &work);
        assert!(failure(&o).contains("it is a FIFO"), "{}", stderr(&o));
    }
    // --out equal to --model: refused before anything is read.
    let ckpt = work.join("stories260K.bin");
    std::fs::copy(dir.join("stories260K.bin"), &ckpt).unwrap();
    let before = std::fs::read(&ckpt).unwrap();
    let mut args = compile_args(&dir, &ckpt, &[]);
    args[2] = s(&ckpt).into();
    let o = run(&args, &work);
    assert_eq!(
        failure(&o),
        format!(
            "error: refusing to write {}: it is one of this command's inputs",
            ckpt.display()
        )
    );
    assert_eq!(std::fs::read(&ckpt).unwrap(), before);
}

/// Row 8: a compile that cannot be read back replaced the good file first.
#[test]
fn a_failed_compile_keeps_the_existing_output() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-keep");
    let out = work.join("good.htpkv");
    std::fs::write(&out, b"the good file").unwrap();
    let mut args = compile_args(&dir, &out, &[]);
    assert_eq!(args[9], "--calibration-tokens");
    args[10] = "1048577".into();
    let o = run(&args, &work);
    assert_eq!(
        failure(&o),
        "error: compiling the model: invalid compile options: calibration_tokens 1048577 exceeds the maximum 1048576 (the file format's limit)"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"the good file");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 1, "no leftovers");
}

/// Rows 9, 12 and 14 on one compiled file.
#[test]
fn a_compiled_file_decides_and_must_match_its_checkpoint() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-compiled");
    let out = work.join("u8.htpkv");
    let o = run(
        &compile_args(&dir, &out, &["--kv-dtype", "u8", "--weights", "i8"]),
        &work,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let gen_args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "generate",
            "Lily",
            "--model-dir",
            s(&dir),
            "--compiled",
            s(&out),
            "--steps",
            "4",
            "--json",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    // Row 9: contradicting flags are an error naming both values ...
    let o = run(
        &gen_args(&["--context", "16", "--kv-dtype", "f32", "--weights", "f32"]),
        &work,
    );
    assert_eq!(
        failure(&o),
        format!(
            "error: --compiled {} contradicts the options given: --context 16, but the file's context is 64; \
             --kv-dtype f32, but the file's KV dtype is u8; --weights f32, but the file's weights are i8; \
             drop these options (the file decides) or compile a new file",
            out.display()
        )
    );
    // ... and without them the file decides, and --json reports what ran.
    let o = run(&gen_args(&["--kv-dtype", "u8"]), &work);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["kv_dtype"], "u8");
    assert_eq!(doc["weights"], "i8");
    assert_eq!(doc["context"], 64);
    assert_eq!(doc["ar"], serde_json::json!([1, 8]));

    // Row 12: the same file with another checkpoint (one weight changed) is refused.
    let (other, _) = altered_model(&dir, &work);
    let mut args = gen_args(&[]);
    args[3] = s(&other).into();
    let o = run(&args, &work);
    let err = failure(&o);
    assert!(
        err.starts_with(&format!(
            "error: {} was compiled from a checkpoint with sha256 b0a507e7ad0f6266",
            out.display()
        )),
        "{err}"
    );

    // Row 14: a missing file names itself once and its cause once.
    let o = htpkv(
        &[
            "generate",
            "--model-dir",
            s(&dir),
            "--compiled",
            "missing.htpkv",
        ],
        &work,
    );
    assert_eq!(
        stderr(&o),
        "error: cannot open missing.htpkv: No such file or directory (os error 2)\n"
    );
}

/// Row 12: a cache entry compiled from another checkpoint is recompiled, not used.
#[test]
fn a_cache_entry_from_another_checkpoint_is_recompiled() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-cache");
    let cache = work.join("cache");
    let args = |model_dir: &Path| -> Vec<String> {
        [
            "generate",
            "--model-dir",
            s(model_dir),
            "--context",
            "64",
            "--ar",
            "1,8",
            "--steps",
            "4",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let o = run(&args(&dir), &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    let entries: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1);
    // Another checkpoint whose cache name is given the first one's entry.
    let (other, ckpt) = altered_model(&dir, &work);
    let digest = model::llama2c::sha256_hex(&ckpt);
    let name = entries[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // `stories260K-{checkpoint}-{options}-c{calibration}.htpkv`: all but the checkpoint's digest.
    let keys = name.splitn(3, '-').nth(2).unwrap();
    let forged = cache.join(format!("stories260K-{}-{keys}", &digest[..16]));
    std::fs::copy(&entries[0], &forged).unwrap();
    let o = run(&args(&other), &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("was compiled from another checkpoint; recompiling"),
        "{}",
        stderr(&o)
    );
}

/// Row 16: options are checked before anything is compiled.
#[test]
fn every_option_is_checked_before_compiling() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-options");
    let cache = work.join("cache");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--n", "0"],
            "error: invalid value '0' for '--n <N>': must be between 1 and 256",
        ),
        (
            &["--beams", "257"],
            "error: invalid value '257' for '--beams <B>': must be between 1 and 256",
        ),
        (
            &["--ar", "511"],
            "error: invalid geometry: `ar` AR-511 never fits: with AR-511 as the smallest variant the cache holds context - 511 = 1 tokens, so context must be at least 1022",
        ),
        (
            &["--temperature", "nan"],
            "error: temperature must be a finite number >= 0, got NaN",
        ),
        (&["--top-p", "0"], "error: top_p must be in (0, 1], got 0"),
        (
            &["--weights", "i3"],
            "error: --weights: unknown weight type `i3` (expected i8, i4, i8f16, f16 or f32)",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["generate", "--model-dir", s(&dir)];
        args.extend_from_slice(extra);
        let o = htpkv(&args, &cache);
        assert_eq!(failure(&o), expected, "{extra:?}");
        assert!(!stderr(&o).contains("compiling"), "{}", stderr(&o));
        assert!(!cache.exists(), "{extra:?}: something was cached");
    }
}

/// Row 6: a 24,000-token prompt was tokenized for 132 s before being refused.
#[test]
fn an_overlong_prompt_is_refused_fast() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("hostile-prompt");
    let prompt = "Once upon a time, there was a little girl named Lily. ".repeat(2000);
    let started = Instant::now();
    let o = htpkv(
        &[
            "generate",
            &prompt,
            "--model-dir",
            s(&dir),
            "--context",
            "64",
            "--ar",
            "1,8",
        ],
        &work,
    );
    let err = failure(&o);
    assert!(
        err.starts_with("error: the prompt has at least ")
            && err.ends_with("tokens but the context holds only 63 more"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(120));
    assert!(o.stdout.is_empty(), "the refused prompt was printed");
}

/// `compile --target htp` refuses, by name and before loading any library or model, what the HTP
/// lowering does not take.
#[test]
fn the_htp_target_refuses_what_it_does_not_lower_by_name() {
    let work = ScratchDir::new("hostile-htp-refusals");
    let out = work.join("x.bin");
    let cases: [(&[&str], &str); 4] = [
        (&["--weights", "f16"], "--weights f16"),
        (&["--kv-dtype", "f16"], "--kv-dtype f16"),
        (&["--parts", "2"], "--parts without --convention aihub"),
        (&["--contexts", "32,64"], "--contexts"),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["compile", "--target", "htp", "--out", s(&out)];
        args.extend_from_slice(extra);
        let o = htpkv(&args, &work.join("cache"));
        let err = failure(&o);
        assert!(
            err.contains("--target htp does not take") && err.contains(expected),
            "{extra:?}: {err}"
        );
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
}
