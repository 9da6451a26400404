//! `htpkv generate` and `htpkv compile` as a user runs them.

use crate::htpkv;
use crate::ok_stdout as text;
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

#[test]
fn generate_streams_the_known_story_and_every_strategy_agrees() {
    let dir = stories260k_dir();
    let cache = ScratchDir::new("cli-gen");
    let dir = dir.to_str().unwrap();
    let mut outputs = Vec::new();
    for update in ["shift", "conveyor", "smart_mask", "naive"] {
        let o = htpkv(
            &[
                "generate",
                "--model-dir",
                dir,
                "--steps",
                "40",
                "--update",
                update,
            ],
            &cache,
        );
        outputs.push(text(&o));
    }
    assert!(
        outputs[0].starts_with("Once upon a time, there was a little girl named Lily."),
        "{}",
        outputs[0]
    );
    assert!(
        outputs.iter().all(|o| *o == outputs[0]),
        "strategies disagree: {outputs:#?}"
    );
    // The compiled model was cached on first use and reused after.
    let cached: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(
        cached.len(),
        1,
        "one compiled file expected in {}",
        cache.display()
    );
}

#[test]
fn generate_json_holds_text_and_stats() {
    let dir = stories260k_dir();
    let cache = ScratchDir::new("cli-json");
    let o = htpkv(
        &[
            "generate",
            "Lily and Ben",
            "--model-dir",
            dir.to_str().unwrap(),
            "--steps",
            "16",
            "--json",
            "--kv-dtype",
            "f32",
            "--weights",
            "f32",
        ],
        &cache,
    );
    let doc: serde_json::Value = serde_json::from_str(&text(&o)).expect("one JSON document");
    assert!(doc["text"].as_str().unwrap().len() > 10);
    assert_eq!(doc["generated_tokens"], 16);
    assert!(doc["kv"]["region_bytes"].as_u64().unwrap() > 0);
    assert!(doc["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn missing_model_says_where_to_get_it() {
    let cache = ScratchDir::new("cli-missing");
    let o = htpkv(&["generate", "--model-dir", "/nonexistent/models"], &cache);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/models"), "{err}");
    assert!(
        err.contains("b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"),
        "{err}"
    );
}

#[test]
fn compile_writes_a_file_and_rejects_a_truncated_checkpoint() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("cli-compile");
    let out = work.join("model.htpkv");
    let ckpt = dir.join("stories260K.bin");
    let tok = dir.join("tok512.bin");
    let o = htpkv(
        &[
            "compile",
            "--model",
            ckpt.to_str().unwrap(),
            "--tokenizer",
            tok.to_str().unwrap(),
            "--context",
            "128",
            "--ar",
            "1,16",
            "--kv-dtype",
            "u8",
            "--weights",
            "i8",
            "--out",
            out.to_str().unwrap(),
        ],
        &work,
    );
    text(&o);
    assert!(std::fs::metadata(&out).unwrap().len() > 1000);
    // The compiled file runs.
    let o = htpkv(
        &[
            "generate",
            "--model-dir",
            dir.to_str().unwrap(),
            "--compiled",
            out.to_str().unwrap(),
            "--steps",
            "8",
        ],
        &work,
    );
    assert!(!text(&o).trim().is_empty());
    // A truncated checkpoint is refused with what was expected.
    let bytes = std::fs::read(&ckpt).unwrap();
    let short = work.join("short.bin");
    std::fs::write(&short, &bytes[..bytes.len() / 2]).unwrap();
    let o = htpkv(
        &[
            "compile",
            "--model",
            short.to_str().unwrap(),
            "--tokenizer",
            tok.to_str().unwrap(),
            "--out",
            work.join("x").to_str().unwrap(),
        ],
        &work,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("1056540") || err.contains("1,056,540"),
        "{err}"
    );
    // A truncated compiled file is refused too.
    let compiled = std::fs::read(&out).unwrap();
    let cut = work.join("cut.htpkv");
    std::fs::write(&cut, &compiled[..compiled.len() - 100]).unwrap();
    let o = htpkv(
        &[
            "generate",
            "--model-dir",
            dir.to_str().unwrap(),
            "--compiled",
            cut.to_str().unwrap(),
        ],
        &work,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cut.htpkv"));
}

/// 20 tokens saved, then 20 resumed (under another strategy) read exactly like one run of 40.
#[test]
fn generate_save_then_resume_continues_the_same_text() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("cli-resume");
    let (dir, file) = (dir.to_str().unwrap(), work.join("story.session"));
    let file = file.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model-dir", dir];
        args.extend_from_slice(extra);
        text(&htpkv(&args, &work))
            .trim_end_matches('\n')
            .to_string()
    };
    let first = run(&["--steps", "20", "--save", file, "--update", "shift"]);
    let second = run(&["--steps", "20", "--resume", file, "--update", "smart_mask"]);
    let whole = run(&["--steps", "40"]);
    assert!(
        first.len() > 20 && second.len() > 20,
        "{first:?} {second:?}"
    );
    assert_eq!(format!("{first}{second}"), whole);
    // A file that is not a session: a clear error, no text.
    let bogus = work.join("bogus.session");
    std::fs::write(&bogus, b"hello").unwrap();
    let o = htpkv(
        &[
            "generate",
            "--model-dir",
            dir,
            "--resume",
            bogus.to_str().unwrap(),
        ],
        &work,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--resume") && err.contains("truncated"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}

/// `--overflow slide` goes past the context (more than 3x), shows each slide in the JSON, and a run
/// saved and resumed across slides gives the same text as one run; `stop` ends at the context.
#[test]
fn generate_slides_past_the_context_and_resumes_across_slides() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("cli-slide");
    let (dir, file) = (dir.to_str().unwrap(), work.join("chat.session"));
    let file = file.to_str().unwrap();
    let base = [
        "generate",
        "--model-dir",
        dir,
        "--context",
        "64",
        "--ar",
        "1,8",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        text(&htpkv(&args, &work))
    };
    // A slide at 63 tokens keeps 4, drops 14 and moves, in each of the 40 buffers, the 4 kept
    // rows (`shift`, whose windows end at their last row) or the 45 rows after the dropped ones
    // (`conveyor`, the default, whose rows stay where they were written); the text is the same.
    let mut texts = Vec::new();
    for (update, moved) in [("shift", 4 * 40), ("conveyor", 45 * 40)] {
        let doc: serde_json::Value = serde_json::from_str(&run(&[
            "Once upon a time",
            "--steps",
            "200",
            "--overflow",
            "slide",
            "--keep",
            "4",
            "--json",
            "--update",
            update,
        ]))
        .unwrap();
        assert_eq!(doc["generated_tokens"], 200, "{doc}");
        let slides = doc["slides"].as_array().unwrap();
        assert!(slides.len() >= 9, "{doc}");
        assert!(
            slides
                .iter()
                .all(|s| s["rows_moved"] == moved && s["dropped"] == 14),
            "{update}: {doc}"
        );
        assert!(
            slides
                .iter()
                .all(|s| s["requant"]["elements"].as_u64() > Some(0))
        );
        texts.push(doc["text"].clone());
    }
    assert_eq!(
        texts[0], texts[1],
        "shift and conveyor slide to the same text"
    );
    let stopped: serde_json::Value =
        serde_json::from_str(&run(&["Once upon a time", "--steps", "200", "--json"])).unwrap();
    assert_eq!(stopped["stop"], "ContextFull");
    let slide = ["--overflow", "slide", "--keep", "4"];
    let mut first = vec!["Once upon a time", "--steps", "100", "--save", file];
    first.extend_from_slice(&slide);
    let mut second = vec!["--steps", "100", "--resume", file, "--update", "naive"];
    second.extend_from_slice(&slide);
    let mut whole = vec!["Once upon a time", "--steps", "200"];
    whole.extend_from_slice(&slide);
    let (first, second, whole) = (run(&first), run(&second), run(&whole));
    assert_eq!(
        format!(
            "{}{}",
            first.trim_end_matches('\n'),
            second.trim_end_matches('\n')
        ),
        whole.trim_end_matches('\n')
    );
    let bad = htpkv(&[&base[..], &["--overflow", "sideways"]].concat(), &work);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown overflow policy `sideways`"));
}

fn eval(extra: &[&str], cache: &std::path::Path) -> serde_json::Value {
    let dir = stories260k_dir();
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ref_backend/examples/data/declaration.txt"
    );
    let mut args = vec![
        "eval",
        "--model",
        dir.to_str().unwrap(),
        "--text",
        file,
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&text(&htpkv(&args, cache))).unwrap()
}

/// `htpkv eval` scores a text against the f32 model: the reference executor with f32 weights and
/// K/V is the f32 forward's own arithmetic, so a correct alignment of positions gives KL 0 and
/// full agreement exactly (an off-by-one would not); the default quantized run is close but not
/// equal, and both perplexities are finite and alike.
#[test]
fn eval_scores_a_text_against_the_f32_model() {
    let cache = ScratchDir::new("cli-eval");
    let exact = eval(
        &["--tokens", "64", "--weights", "f32", "--kv-dtype", "f32"],
        &cache,
    );
    assert_eq!(exact["positions"], 64, "{exact}");
    assert_eq!(exact["mean_kl"], 0.0, "{exact}");
    assert_eq!(exact["top1_agreement"], 1.0, "{exact}");
    assert_eq!(exact["perplexity"], exact["f32_perplexity"], "{exact}");
    // --skip feeds the first positions unscored (llama-perplexity's second half of a chunk).
    let half = eval(
        &[
            "--tokens",
            "64",
            "--skip",
            "32",
            "--weights",
            "f32",
            "--kv-dtype",
            "f32",
        ],
        &cache,
    );
    assert_eq!(half["positions"], 32, "{half}");
    assert_eq!(half["mean_kl"], 0.0, "{half}");
    assert_ne!(half["f32_perplexity"], exact["f32_perplexity"], "{half}");
    let q = eval(
        &["--tokens", "64", "--weights", "i8", "--kv-dtype", "u8"],
        &cache,
    );
    let (kl, top1) = (
        q["mean_kl"].as_f64().unwrap(),
        q["top1_agreement"].as_f64().unwrap(),
    );
    assert!(kl > 0.0 && kl < 0.05, "{q}");
    assert!((0.8..1.0).contains(&top1), "{q}");
    let (p, pf) = (
        q["perplexity"].as_f64().unwrap(),
        q["f32_perplexity"].as_f64().unwrap(),
    );
    assert!(p.is_finite() && (p / pf - 1.0).abs() < 0.2, "{q}");
    // 4-bit LPBQ weights run, further from the f32 model than i8, and no further than half again
    // their measured KL (0.1607 on this text when written; i8: 0.0073).
    let q4 = eval(
        &["--tokens", "64", "--weights", "i4", "--kv-dtype", "u8"],
        &cache,
    );
    let kl4 = q4["mean_kl"].as_f64().unwrap();
    assert!(kl4 > kl && kl4 < 1.5 * 0.1607, "i4 {q4} i8 {q}");
    // V and down kept in f16: nearer the f32 model than i8, further than f16 weights.
    let mixed = eval(
        &["--tokens", "64", "--weights", "i8f16", "--kv-dtype", "u16"],
        &cache,
    );
    let i8_u16 = eval(
        &["--tokens", "64", "--weights", "i8", "--kv-dtype", "u16"],
        &cache,
    );
    let (klm, kl8) = (
        mixed["mean_kl"].as_f64().unwrap(),
        i8_u16["mean_kl"].as_f64().unwrap(),
    );
    assert!(klm > 0.0 && klm < 0.8 * kl8, "i8f16 {mixed} i8 {i8_u16}");
}

/// A text that cannot be scored is refused naming the file; a device is refused unread.
#[test]
fn eval_refuses_texts_it_cannot_score() {
    let cache = ScratchDir::new("cli-eval-bad");
    let empty = cache.join("empty.txt");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(&empty, "").unwrap();
    let dir = stories260k_dir();
    for (file, expected) in [
        (empty.to_str().unwrap(), "at least 2 are needed"),
        ("/dev/zero", "/dev/zero"),
    ] {
        let o = htpkv(
            &["eval", "--model", dir.to_str().unwrap(), "--text", file],
            &cache,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(expected),
            "{file}: {err}"
        );
    }
}

/// `--top-k 1` leaves one candidate, so sampling at any temperature gives the greedy text;
/// `--top-k 2` at a high temperature does not; a `--min-p` outside [0, 1) is refused by name.
#[test]
fn top_k_and_min_p_truncate_sampling() {
    let dir = stories260k_dir().to_str().unwrap().to_owned();
    let cache = ScratchDir::new("cli-topk");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model-dir", &dir, "--steps", "40"];
        args.extend_from_slice(extra);
        htpkv(&args, &cache)
    };
    let greedy = text(&run(&[]));
    let hot = ["--temperature", "1.5", "--seed", "9"];
    let top1 = text(&run(&[&hot[..], &["--top-k", "1"]].concat()));
    assert_eq!(top1, greedy);
    let top2 = text(&run(&[&hot[..], &["--top-k", "2", "--top-p", "1"]].concat()));
    assert_ne!(top2, greedy);
    let bad = run(&["--temperature", "1", "--min-p", "1.5"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("min_p must be in [0, 1)"),
        "{err}"
    );
}

/// A repetition penalty changes the greedy story (stories260K repeats its names), and speculative
/// decoding under the same penalty gives the same text as plain decoding: both penalize what
/// precedes each token.
#[test]
fn penalties_change_greedy_text_and_speculation_keeps_it() {
    let dir = stories260k_dir().to_str().unwrap().to_owned();
    let cache = ScratchDir::new("cli-penalty");
    // A prompt whose story repeats itself, so that prompt lookup's proposals are accepted.
    let prompt = "Tom had a red ball. Tom liked the red ball. One day, Tom lost the red ball.";
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", prompt, "--model-dir", &dir, "--steps", "80"];
        args.extend_from_slice(extra);
        htpkv(&args, &cache)
    };
    let plain = text(&run(&[]));
    let penalty = ["--repeat-penalty", "1.1", "--penalty-last-n", "32"];
    let penalized = text(&run(&penalty));
    assert_ne!(penalized, plain);
    let spec = text(&run(
        &[&penalty[..], &["--speculate", "prompt-lookup"]].concat()
    ));
    assert_eq!(spec, penalized);
    let bad = run(&["--repeat-penalty", "0"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("repeat_penalty must be"),
        "{err}"
    );
}

/// `--json` counts the committed K/V codes (every layer, KV head, K and V, head dim, for every
/// cached token) and those at the encoding's extremes, as many as the saved session's K/V rows
/// hold; `--stats` prints the line; a float cache has none.
#[test]
fn json_and_stats_report_kv_saturation() {
    let dir = stories260k_dir();
    let cache = ScratchDir::new("cli-saturation");
    let dir = dir.to_str().unwrap();
    let args = [
        "generate",
        "Once upon a time",
        "--model",
        dir,
        "--steps",
        "40",
    ];
    let o = htpkv(&[&args[..], &["--json"]].concat(), &cache);
    let doc: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    let cached =
        doc["prompt_tokens"].as_u64().unwrap() + doc["generated_tokens"].as_u64().unwrap() - 1;
    // stories260K: 5 layers, 4 KV heads, head dim 8, K and V.
    let s = &doc["kv_saturation"];
    assert_eq!(s["codes"].as_u64().unwrap(), cached * 5 * 4 * 8 * 2, "{s}");
    // The session file (`--save`) holds every cached K/V code: counted there independently, the
    // codes at the extremes are those the run reported (the save caches the last token too).
    let saved = cache.join("saturation.session");
    let o = htpkv(
        &[
            &args[..],
            &["--kv-dtype", "u8", "--json", "--save"],
            &[saved.to_str().unwrap()],
        ]
        .concat(),
        &cache,
    );
    let doc: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    let (saturated, codes) = saturated_in_session_file(&std::fs::read(&saved).unwrap());
    let s = &doc["kv_saturation"];
    assert_eq!(s["codes"].as_u64().unwrap(), codes, "{s}");
    assert_eq!(s["saturated_codes"].as_u64().unwrap(), saturated, "{s}");
    assert!(saturated > 0, "a case with saturated codes: {s}");
    let stats = htpkv(&[&args[..], &["--stats"]].concat(), &cache);
    let err = String::from_utf8_lossy(&stats.stderr);
    assert!(err.contains("kv saturation: "), "{err}");
    let float = htpkv(
        &[&args[..], &["--kv-dtype", "f32", "--json"]].concat(),
        &cache,
    );
    let doc: serde_json::Value = serde_json::from_str(&text(&float)).unwrap();
    assert_eq!(doc["kv_saturation"]["codes"], 0);
    std::fs::remove_dir_all(&cache).unwrap();
}

/// The K/V codes at their type's extremes in a session file, and all its codes, read by the layout
/// the file format documents (`runtime::persist`), not by htpkv's reader.
fn saturated_in_session_file(file: &[u8]) -> (u64, u64) {
    let mut at = 32; // magic, version, reserved, payload length, two CRCs
    let mut take = |n: usize| {
        at += n;
        &file[at - n..at]
    };
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap()) as usize;
    let (layers, heads, dim) = (word(take(4)), word(take(4)), word(take(4)));
    let dtype = take(1)[0];
    for _ in 0..layers * heads * 2 {
        match take(2)[1] {
            0 => {}
            1 => {
                take(8);
            }
            _ => {
                take(4);
                let scales = word(take(4));
                take(8 * scales);
            }
        }
    }
    let len = word(take(4));
    take(4 * len);
    if word(&file[8..12]) >= 2 {
        take(4); // the position offset
    }
    let logits = word(take(4));
    take(4 * logits);
    let (size, lo, hi): (usize, u16, u16) = match dtype {
        0 => (1, 0, 0xFF),
        1 => (2, 0, 0xFFFF),
        2 => (1, 0x80, 0x7F),
        3 => (2, 0x8000, 0x7FFF),
        other => panic!("not a fixed-point K/V type: {other}"),
    };
    let codes = take(layers * heads * 2 * len * dim * size);
    assert_eq!(at, file.len(), "the K/V rows end the file");
    let saturated = (codes.chunks_exact(size))
        .map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]))
        .filter(|&c| c == lo || c == hi)
        .count();
    (saturated as u64, (codes.len() / size) as u64)
}

/// Issue 38: one `--model` spelling. A llama2.c checkpoint file is a model for `generate` and
/// `compile` alike, its tokenizer found beside it (`tok{N}.bin`, else `tokenizer.bin`) or given with
/// `--tokenizer`; a file that is no model, or a checkpoint without a tokenizer, is refused naming
/// what is missing; a GGUF file refuses a llama2.c tokenizer.
#[test]
fn a_llama2c_checkpoint_file_is_a_model_like_its_directory() {
    let dir = stories260k_dir();
    let work = ScratchDir::new("cli-ckpt-file");
    let (ckpt, tok) = (dir.join("stories260K.bin"), dir.join("tok512.bin"));
    let run = |model: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--steps",
            "24",
        ];
        args.extend(extra);
        htpkv(&args, &work)
    };
    let from_dir = text(&run(&dir, &[]));
    assert!(from_dir.starts_with("Once upon a time"), "{from_dir}");
    assert_eq!(text(&run(&ckpt, &[])), from_dir);
    // Alone in a folder, the checkpoint needs its tokenizer named.
    let alone = work.join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    let lone = alone.join("my-model.bin");
    std::fs::copy(&ckpt, &lone).unwrap();
    let o = run(&lone, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for needle in ["my-model.bin", "tok512.bin", "tokenizer.bin", "--tokenizer"] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
    assert_eq!(
        text(&run(&lone, &["--tokenizer", tok.to_str().unwrap()])),
        from_dir
    );
    // compile takes the same spelling, without --tokenizer.
    let out = work.join("model.htpkv");
    let o = htpkv(
        &[
            "compile",
            "--model",
            ckpt.to_str().unwrap(),
            "--context",
            "64",
            "--ar",
            "1,8",
        ]
        .into_iter()
        .chain(["--out", out.to_str().unwrap()])
        .collect::<Vec<_>>(),
        &work,
    );
    text(&o);
    // A GGUF file brings its own tokenizer.
    let gguf = work.join("llama.gguf");
    std::fs::write(&gguf, test_support::families::toy_gguf("llama").unwrap()).unwrap();
    let o = run(&gguf, &["--tokenizer", tok.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is for llama2.c checkpoints") && err.contains("llama.gguf"),
        "{err}"
    );
    // A text file is no model: the message names it and what it was tried as.
    let notes = work.join("notes.txt");
    std::fs::write(&notes, "just some notes, not a model\n").unwrap();
    let o = run(&notes, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("notes.txt is neither a GGUF file") && err.contains("checkpoint"),
        "{err}"
    );
}
