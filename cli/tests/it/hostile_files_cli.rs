//! Hostile files, round two (issue 21 part A): outputs that are special files or inputs, special
//! files as inputs, bundles written whole, and messages naming the bad file once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::cli::compile_args;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs htpkv with a deadline: a run still going after `limit` is killed and the test fails (a
/// FIFO that blocks at `open` must not hang the suite).
pub(crate) fn run(args: &[&str], cache: &Path, limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_htpkv"))
        .args(args)
        .env("HTPKV_CACHE_DIR", cache)
        .env_remove("HTPKV_MODEL_DIR")
        .env_remove("HTPKV_QNN_SYSTEM")
        .env_remove("HTPKV_QNN_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("htpkv {args:?} still running after {limit:?} (blocked?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn htpkv(args: &[&str], cache: &Path) -> Output {
    run(args, cache, Duration::from_secs(300))
}

fn htpkv_owned(args: &[String], cache: &Path) -> Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    htpkv(&refs, cache)
}

/// The error line of a failed run.
pub(crate) fn failure(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "succeeded: {}{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {err}"))
        .to_owned()
}

pub(crate) fn mkfifo(path: &Path, test: &str) -> bool {
    let made = Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    // Without mkfifo the FIFO cases are skipped by the one rule: saying so, and failing in CI.
    made || test_support::fetched::missing::<()>(test, "mkfifo is unavailable: the FIFO cases")
        .is_some()
}

#[cfg(unix)]
fn file_type(path: &Path) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let ft = std::fs::symlink_metadata(path).unwrap().file_type();
    match () {
        _ if ft.is_fifo() => "fifo",
        _ if ft.is_char_device() => "char",
        _ if ft.is_symlink() => "symlink",
        _ if ft.is_file() => "file",
        _ => "other",
    }
}

/// A copy of the llama2.c model in `work/model`.
fn model_copy(work: &Path) -> PathBuf {
    let m = work.join("model");
    std::fs::create_dir_all(&m).unwrap();
    for f in ["stories260K.bin", "tok512.bin"] {
        std::fs::copy(stories260k_dir().join(f), m.join(f)).unwrap();
    }
    m
}

fn generate_save<'a>(model: &'a Path, save: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["generate", "--model", s(model), "--steps", "4"];
    v.extend(extra);
    v.extend(["--save", s(save)]);
    v
}

/// Finding 1: `--save` had its own writer (predictable temporary name, `File::create`, rename):
/// it replaced FIFOs, symlinks, device nodes, the checkpoint, the tokenizer and the compiled file.
#[test]
fn save_never_replaces_special_files_or_inputs() {
    let work = ScratchDir::new("hostile-files-save");
    let cache = work.join("cache");
    let model = model_copy(&work);
    // A FIFO: refused before the model is opened, and still a FIFO.
    let fifo = work.join("fifo.session");
    if mkfifo(&fifo, "save_never_replaces_special_files_or_inputs") {
        let o = run(
            &generate_save(&model, &fifo, &[]),
            &cache,
            Duration::from_secs(120),
        );
        assert_eq!(
            failure(&o),
            format!(
                "error: --save: refusing to write {}: it is a FIFO, not a regular file",
                fifo.display()
            )
        );
        assert_eq!(file_type(&fifo), "fifo");
    }
    // A symlink: the file it points to is untouched.
    let precious = work.join("precious");
    std::fs::write(&precious, b"keep").unwrap();
    let link = work.join("link.session");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let o = htpkv(&generate_save(&model, &link, &[]), &cache);
    assert!(failure(&o).contains("it is a symbolic link"), "{o:?}");
    assert_eq!(file_type(&link), "symlink");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep");
    // A character device made here (the same device as /dev/null, where root can make one).
    let dev = work.join("null.session");
    let made = Command::new("mknod")
        .args([s(&dev), "c", "1", "3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let o = htpkv(&generate_save(&model, &dev, &[]), &cache);
        assert!(failure(&o).contains("it is a character device"), "{o:?}");
        assert_eq!(file_type(&dev), "char");
    }
    // The checkpoint and the tokenizer of the model: refused, unchanged.
    for name in ["stories260K.bin", "tok512.bin"] {
        let input = model.join(name);
        let before = std::fs::read(&input).unwrap();
        let o = htpkv(&generate_save(&model, &input, &[]), &cache);
        assert!(
            failure(&o).contains("it is the same file as the input")
                || failure(&o).contains("it is one of this command's inputs"),
            "{name}: {o:?}"
        );
        assert_eq!(std::fs::read(&input).unwrap(), before, "{name}");
    }
    // The compiled file given with --compiled (another spelling: a hard link).
    let compiled = work.join("m.htpkv");
    let o = htpkv_owned(&compile_args(&model, &compiled, &[]), &cache);
    assert!(o.status.success(), "{o:?}");
    let alias = work.join("alias.session");
    std::fs::hard_link(&compiled, &alias).unwrap();
    let before = std::fs::read(&compiled).unwrap();
    let o = htpkv(
        &generate_save(&model, &alias, &["--compiled", s(&compiled)]),
        &cache,
    );
    assert_eq!(
        failure(&o),
        format!(
            "error: --save: refusing to write {}: it is the same file as the input {}",
            alias.display(),
            compiled.display()
        )
    );
    assert_eq!(std::fs::read(&compiled).unwrap(), before);
    // The cache entry the engine compiled into (found only after the model is opened).
    let o = htpkv(
        &["generate", "--model", s(&model), "--steps", "1", "--json"],
        &cache,
    );
    assert!(o.status.success(), "{o:?}");
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "htpkv"))
        .expect("a cache entry");
    let before = std::fs::read(&entry).unwrap();
    let o = htpkv(&generate_save(&model, &entry, &[]), &cache);
    assert!(failure(&o).contains("inputs"), "{o:?}");
    assert_eq!(std::fs::read(&entry).unwrap(), before);
    // A good save leaves only the session file beside it.
    let out_dir = work.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let good = out_dir.join("s.session");
    let o = htpkv(&generate_save(&model, &good, &[]), &cache);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);
    // --resume and --save may name the same file: it is read whole before it is replaced.
    let o = htpkv(
        &generate_save(&model, &good, &["--resume", s(&good)]),
        &cache,
    );
    assert!(o.status.success(), "{o:?}");
}

/// Finding 2: `budget CONFIG --plot CONFIG` replaced the config with the SVG (also when it was
/// the second of several configs).
#[test]
fn budget_plot_never_replaces_a_config() {
    let work = ScratchDir::new("hostile-files-plot");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let a = work.join("a.yaml");
    let b = work.join("b.yaml");
    std::fs::copy(root.join("stories260K.yaml"), &a).unwrap();
    std::fs::copy(root.join("llama-3.2-1b.yaml"), &b).unwrap();
    let before = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    for target in [&a, &b] {
        let o = htpkv(&["budget", s(&a), s(&b), "--plot", s(target)], &work);
        assert_eq!(
            failure(&o),
            format!(
                "error: --plot: refusing to write {}: it is one of this command's inputs",
                target.display()
            )
        );
    }
    // Another spelling of the second config.
    let other = format!("{}/./b.yaml", work.display());
    let o = htpkv(&["budget", s(&a), s(&b), "--plot", &other], &work);
    assert!(failure(&o).contains("same file as the input"), "{o:?}");
    assert_eq!(
        (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap()),
        before
    );
    let svg = work.join("plot.svg");
    let o = htpkv(&["budget", s(&a), s(&b), "--plot", s(&svg)], &work);
    assert!(o.status.success(), "{o:?}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

/// Finding 5: `inspect /dev/zero` grew to 12-17 GB; a FIFO blocked at `open`. Both are refused
/// before a byte is read (and before the QNN library is looked for).
#[test]
fn special_files_as_inputs_are_refused_without_blocking() {
    let work = ScratchDir::new("hostile-files-special-in");
    let o = run(&["inspect", "/dev/zero"], &work, Duration::from_secs(60));
    assert_eq!(
        failure(&o),
        "error: context binary /dev/zero is a character device, not a regular file"
    );
    let fifo = work.join("fifo");
    if !mkfifo(
        &fifo,
        "special_files_as_inputs_are_refused_without_blocking",
    ) {
        return;
    }
    let tok = stories260k_dir().join("tok512.bin");
    let out = work.join("o.htpkv");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["inspect", s(&fifo)],
            format!("context binary {} is a FIFO", fifo.display()),
        ),
        (
            vec![
                "compile",
                "--model",
                s(&fifo),
                "--tokenizer",
                s(&tok),
                "--out",
                s(&out),
            ],
            format!("checkpoint {} is a FIFO", fifo.display()),
        ),
        (
            vec!["budget", s(&fifo)],
            format!("{} is a FIFO", fifo.display()),
        ),
    ];
    for (args, expected) in cases {
        let o = run(&args, &work, Duration::from_secs(60));
        let line = failure(&o);
        assert!(line.contains(&expected), "{args:?}: {line}");
        assert_eq!(line.matches(s(&fifo)).count(), 1, "{line}");
    }
}

/// Finding 13: `budget F.gguf` printed the path twice.
#[test]
fn budget_of_a_bad_gguf_names_it_once() {
    let work = ScratchDir::new("hostile-files-gguf");
    let gguf = work.join("bad.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend([0xff; 8]);
    std::fs::write(&gguf, bytes).unwrap();
    let o = htpkv(&["budget", s(&gguf)], &work);
    let line = failure(&o);
    assert_eq!(line.matches(s(&gguf)).count(), 1, "{line}");
}

/// Finding 14: `--qnn-memory` was accepted (and ignored) with the reference backend.
#[test]
fn qnn_memory_is_refused_with_the_reference_backend() {
    let work = ScratchDir::new("hostile-files-qnn-memory");
    let o = htpkv(
        &[
            "generate",
            "--model",
            s(&stories260k_dir()),
            "--steps",
            "1",
            "--qnn-memory",
            "gpu",
        ],
        &work,
    );
    assert_eq!(
        failure(&o),
        "error: --qnn-memory gpu applies only to --backend qnn (the reference backend runs in process)"
    );
}

fn compile_bundle(dir: &Path, out: &Path, cache: &Path) -> Output {
    // A stand-in tokenizer.json: the bundle only copies it.
    let tok = cache.join("tokenizer.json");
    std::fs::write(
        &tok,
        br#"{"model": {"type": "BPE", "vocab": {}, "merges": []}}"#,
    )
    .unwrap();
    let extra = ["--parts", "2", "--tokenizer-json", s(&tok)];
    htpkv_owned(&compile_args(dir, out, &extra), cache)
}

/// Finding 14: a bundle whose writing failed after some parts was left half-written (new parts
/// beside old ones). The bundle is written into a temporary directory and renamed into place:
/// an old bundle is replaced whole, and a directory that is no bundle is refused untouched.
#[test]
fn a_bundle_is_written_whole_or_not_at_all() {
    let work = ScratchDir::new("hostile-files-bundle");
    let dir = stories260k_dir();
    let out = work.join("bundle");
    let o = compile_bundle(&dir, &out, &work);
    assert!(o.status.success(), "{o:?}");
    let part1 = out.join("stories260K_part_1_of_2.bin");
    let part2 = out.join("stories260K_part_2_of_2.bin");
    let first = std::fs::read(&part1).unwrap();
    // The old bundle's second part is in the way (a directory): before, part 1 was replaced and
    // the compile then failed on part 2.
    std::fs::remove_file(&part2).unwrap();
    std::fs::create_dir(&part2).unwrap();
    std::fs::write(out.join("stale.bin"), b"old").unwrap();
    std::fs::write(&part1, b"old part").unwrap();
    let o = compile_bundle(&dir, &out, &work);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read(&part1).unwrap(), first);
    assert!(part2.is_file());
    assert!(
        !out.join("stale.bin").exists(),
        "the old bundle is replaced whole"
    );
    let names: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".bundle"))
        .collect();
    assert!(names.is_empty(), "leftovers beside the bundle: {names:?}");
    // A directory that is not a bundle is refused before anything is compiled or written.
    let home = work.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join("notes.txt"), b"mine").unwrap();
    let o = compile_bundle(&dir, &home, &work);
    assert!(failure(&o).contains("holds no genie_config.json"), "{o:?}");
    assert_eq!(std::fs::read_dir(&home).unwrap().count(), 1);
    assert_eq!(std::fs::read(home.join("notes.txt")).unwrap(), b"mine");
}

/// Finding 1, compile of a Hugging Face folder: only the folder was an input, so `--out
/// DIR/config.json` would replace the model's own config. Refused before the model is read.
#[test]
fn compile_never_replaces_a_file_of_a_model_folder() {
    let work = ScratchDir::new("hostile-files-hf-out");
    let folder = work.join("hf");
    std::fs::create_dir_all(&folder).unwrap();
    let config = folder.join("config.json");
    std::fs::write(&config, br#"{"model_type": "llama"}"#).unwrap();
    let o = htpkv(
        &["compile", "--model", s(&folder), "--out", s(&config)],
        &work,
    );
    assert_eq!(
        failure(&o),
        format!(
            "error: refusing to write {}: it is one of this command's inputs",
            config.display()
        )
    );
    assert_eq!(
        std::fs::read(&config).unwrap(),
        br#"{"model_type": "llama"}"#
    );
}
