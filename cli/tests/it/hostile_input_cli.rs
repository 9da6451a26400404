//! Hostile input, round three (issue 36), on the command line: structured-output files through
//! the capped reader, schemas llguidance cannot compile safely refused by name, and `eval`'s
//! numbers checked.

use std::path::Path;
use std::time::Duration;

use crate::hostile_files_cli::{failure, mkfifo, run, s};
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

fn generate(extra: &[&str], cache: &Path) -> std::process::Output {
    let dir = stories260k_dir();
    let mut args = vec!["generate", "--model", s(&dir), "--steps", "8"];
    args.extend_from_slice(extra);
    run(&args, cache, Duration::from_secs(120))
}

/// Finding 4: `--json-schema`, `--grammar` and `--tools` read through the capped reader: a FIFO
/// is refused without blocking, `/dev/zero` and a file past the cap without reading them.
#[test]
fn structured_files_go_through_the_capped_reader() {
    let cache = ScratchDir::new("hostile-input-files");
    std::fs::create_dir_all(&cache).unwrap();
    let fifo = cache.join("schema.fifo");
    if !mkfifo(&fifo, "structured_files_go_through_the_capped_reader") {
        return;
    }
    let big = cache.join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(2 << 30).unwrap();
    for option in ["--json-schema", "--grammar"] {
        for (path, expected) in [
            (fifo.as_path(), "FIFO"),
            (Path::new("/dev/zero"), "not a regular file"),
            (big.as_path(), "cap"),
        ] {
            let err = failure(&generate(&[option, s(path)], &cache));
            assert!(
                err.contains(option) && err.contains(expected),
                "{option} {path:?}: {err}"
            );
        }
    }
    let err = failure(&generate(&["--chat", "hi", "--tools", s(&fifo)], &cache));
    assert!(err.contains("--tools") && err.contains("FIFO"), "{err}");
}

/// Findings 1 and 2: a bound llguidance would negate past i64::MIN (an abort) or clamp (an answer
/// outside the schema) is refused, naming the option and the schema's place; so is a chain of
/// 400 `$ref`s, and the same schema inside a Lark `%json`.
#[test]
fn schemas_llguidance_cannot_compile_safely_are_refused_by_name() {
    let cache = ScratchDir::new("hostile-input-schemas");
    std::fs::create_dir_all(&cache).unwrap();
    let write = |name: &str, text: &str| {
        let p = cache.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let min = write(
        "min.json",
        r#"{"type":"integer","minimum":-9223372036854775807,"maximum":-9223372036854775807}"#,
    );
    let big = write(
        "big.json",
        r#"{"type":"integer","minimum":1e19,"maximum":2e19}"#,
    );
    let mut defs: Vec<String> = (0..400)
        .map(|i| format!(r##""a{i}":{{"$ref":"#/$defs/a{}"}}"##, i + 1))
        .collect();
    defs.push(r#""a400":{"type":"integer"}"#.into());
    let chain = write(
        "chain.json",
        &format!(
            r##"{{"$ref":"#/$defs/a0","$defs":{{{}}}}}"##,
            defs.join(",")
        ),
    );
    let lark = write(
        "g.lark",
        "start: n\nn: %json {\"type\":\"integer\",\"minimum\":-9223372036854775807}\n",
    );
    for (option, path, expected) in [
        // Both bounds are wrong: either is named first.
        (
            "--json-schema",
            &min,
            "imum = -9223372036854775807 is outside",
        ),
        ("--json-schema", &big, "is outside ±9007199254740991"),
        ("--json-schema", &chain, "deeper than 128"),
        ("--grammar", &lark, "/minimum"),
    ] {
        let o = generate(&[option, s(path)], &cache);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{option} {path:?}: killed by a signal?"
        );
        let err = failure(&o);
        assert!(err.contains(option) && err.contains(expected), "{err}");
    }
}

fn eval(extra: &[&str], cache: &Path) -> std::process::Output {
    let dir = stories260k_dir();
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ref_backend/examples/data/declaration.txt"
    );
    let mut args = vec!["eval", "--model", s(&dir), "--text", text, "--json"];
    args.extend_from_slice(extra);
    run(&args, cache, Duration::from_secs(120))
}

/// Finding 6 (eval): `--skip` cannot wrap, a position left to score is scored, and `--tokens 0`
/// blames the option.
#[test]
fn eval_numbers_are_checked_and_the_last_positions_scored() {
    let cache = ScratchDir::new("hostile-input-eval");
    let err = failure(&eval(&["--skip", "18446744073709551615"], &cache));
    assert!(
        err.contains("--skip 18446744073709551615 leaves no position"),
        "{err}"
    );
    let err = failure(&eval(&["--tokens", "0"], &cache));
    assert!(err.contains("--tokens 0"), "{err}");
    for (extra, positions) in [
        (&["--tokens", "1"][..], 1),
        (&["--tokens", "2", "--skip", "1"], 1),
    ] {
        let o = eval(extra, &cache);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|_| panic!("{extra:?}: {}", String::from_utf8_lossy(&o.stderr)));
        assert_eq!(doc["positions"], positions, "{extra:?}: {doc}");
        assert!(
            doc["perplexity"].as_f64().is_some_and(f64::is_finite),
            "{doc}"
        );
    }
}

fn genie_run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_genie-run"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("genie-run {args:?} blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Finding 7: a library path is checked before `dlopen`: a FIFO does not block, a truncated copy
/// of a library is a clean error (not `SIGBUS`), for `genie-run --genie` as for QNN's libraries
/// (the same check, `qnn_ffi::elf`).
#[test]
fn genie_run_checks_its_library_before_loading_it() {
    let dir = ScratchDir::new("hostile-input-genie-lib");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("libGenie.so");
    if !mkfifo(&fifo, "genie_run_checks_its_library_before_loading_it") {
        return;
    }
    let exe = std::fs::read(env!("CARGO_BIN_EXE_genie-run")).unwrap();
    let cut = dir.join("libCut.so");
    std::fs::write(&cut, &exe[..4096]).unwrap();
    let config = dir.join("c.json");
    std::fs::write(&config, "{}").unwrap();
    for (lib, expected) in [(&fifo, "FIFO"), (&cut, "past its end")] {
        let o = genie_run(&[
            "--genie".as_ref(),
            lib.as_os_str(),
            "check-config".as_ref(),
            config.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{lib:?}: killed by a signal?");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(expected), "{err}");
    }
}

/// Finding 5: `genie-run dialog` refuses a configuration that is not an object (it panicked), the
/// bundle path rules apply to the files it names, and `--out` refuses each of them.
#[test]
fn genie_run_dialog_refuses_bad_configs_and_never_replaces_a_named_file() {
    let Some(libs) = test_support::fetched::qnn_libs("genie_run_dialog_refuses_bad_configs") else {
        return;
    };
    let scratch = ScratchDir::new("hostile-input-genie-dialog");
    let dir = scratch.join("bundle");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(scratch.join("x")).unwrap();
    std::fs::write(scratch.join("x/c.bin"), "x").unwrap();
    let genie = libs.genie();
    let dialog = |config: &Path, out: Option<&Path>| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--genie".as_ref(), genie.as_os_str()];
        if let Some(out) = out {
            args.extend(["--out".as_ref(), out.as_os_str()]);
        }
        args.extend([
            "dialog".as_ref(),
            config.as_os_str(),
            "--prompt".as_ref(),
            "x".as_ref(),
            "--max-tokens".as_ref(),
            "4".as_ref(),
        ]);
        genie_run(&args)
    };
    for (name, text, expected) in [
        ("five.json", r#"{"dialog":5}"#, "`dialog` is a JSON object"),
        (
            "list.json",
            "[1,2]",
            "a Genie configuration is a JSON object",
        ),
        (
            "passwd.json",
            r#"{"dialog":{"tokenizer":{"path":"/etc/passwd"}}}"#,
            "relative path inside",
        ),
        (
            "up.json",
            r#"{"dialog":{"tokenizer":{"path":"../x/c.bin"}}}"#,
            "relative path inside",
        ),
    ] {
        let config = dir.join(name);
        std::fs::write(&config, text).unwrap();
        let o = dialog(&config, None);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(expected), "{name}: {err}");
    }
    let bin = dir.join("part.bin");
    std::fs::write(&bin, "context").unwrap();
    let config = dir.join("named.json");
    std::fs::write(
        &config,
        r#"{"dialog":{"engine":{"model":{"binary":{"ctx-bins":["part.bin"]}}}}}"#,
    )
    .unwrap();
    let o = dialog(&config, Some(&bin));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("refusing to write"),
        "{err}"
    );
    assert_eq!(std::fs::read(&bin).unwrap(), b"context");
}

/// Finding 8 (speculation): a draft model of another vocabulary is refused before anything is
/// compiled or printed (it was compiled and run before the mismatch showed mid-generation).
#[test]
fn a_draft_of_another_vocabulary_is_refused_before_compiling() {
    let cache = ScratchDir::new("hostile-input-draft");
    let draft = cache.join("draft");
    std::fs::create_dir_all(&draft).unwrap();
    let model = stories260k_dir();
    for entry in std::fs::read_dir(&model).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), draft.join(entry.file_name())).unwrap();
    }
    // One piece spelled otherwise, same length: the ids line up, one token's bytes do not.
    let tokenizer = draft.join("tok512.bin");
    let mut bytes = std::fs::read(&tokenizer).unwrap();
    let at = bytes
        .windows(3)
        .position(|w| w == b"the")
        .expect("a piece with `the`");
    bytes[at + 2] = b'x';
    std::fs::write(&tokenizer, bytes).unwrap();
    let spec = format!("draft:{}:2", s(&draft));
    let started = std::time::Instant::now();
    let o = generate(&["--speculate", &spec], &cache);
    let err = failure(&o);
    assert!(
        err.contains("--speculate draft:") && err.contains("must share"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "printed before refusing");
    assert!(started.elapsed() < Duration::from_secs(30));
    // The model itself as its draft shares every token: it runs.
    let same = format!("draft:{}:2", s(&model));
    let o = generate(&["--speculate", &same], &cache);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
