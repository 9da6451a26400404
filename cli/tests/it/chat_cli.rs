//! `htpkv chat` (stdin piped) and `htpkv generate --chat`, on the embedded stories260K model and
//! on SmolLM2 (GGUF).

use std::path::Path;
use std::process::Output;

use crate::{htpkv, ok_stdout};
use test_support::files::ScratchDir;
use test_support::stories::stories260k_dir;

fn chat(args: &[&str], stdin: &str, cache: &Path) -> Output {
    crate::htpkv_with_stdin(&[&["chat"], args].concat(), cache, stdin)
}

#[test]
fn chat_answers_each_line_resets_and_quits_on_the_story_model() {
    let cache = ScratchDir::new("chat-story");
    let dir = stories260k_dir();
    let dir = dir.to_str().unwrap();
    let args = ["--model", dir, "--steps", "16"];
    let o = chat(
        &[&args[..], &["--stats"]].concat(),
        "Once upon a time\n\nThe dog ran\n/reset\nOnce upon a time\n/quit\nnever read\n",
        &cache,
    );
    let out = ok_stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    // After /reset the conversation starts again: the same first answer.
    assert_eq!(lines[0], lines[2]);
    assert!(!lines[0].trim().is_empty());
    // One question answers the same through generate --chat.
    let once = htpkv(
        &[&["generate", "--chat", "Once upon a time"], &args[..]].concat(),
        &cache,
    );
    assert_eq!(ok_stdout(&once).trim_end(), lines[0]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("peak memory: "), "{stderr}");
}

#[test]
fn generate_json_reports_peak_memory_and_rejects_a_non_model_file() {
    let cache = ScratchDir::new("chat-json");
    let dir = stories260k_dir();
    let o = htpkv(
        &[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--steps",
            "4",
            "--json",
        ],
        &cache,
    );
    let doc: serde_json::Value = serde_json::from_str(&ok_stdout(&o)).unwrap();
    let peak = doc["peak_memory_bytes"].as_u64();
    if cfg!(target_os = "linux") {
        assert!(peak.unwrap() > 1 << 20, "{doc}");
    }
    let bogus = cache.join("model.gguf");
    std::fs::write(&bogus, b"not a model at all").unwrap();
    let o = htpkv(
        &[
            "generate",
            "--model",
            bogus.to_str().unwrap(),
            "--chat",
            "hi",
        ],
        &cache,
    );
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("model.gguf"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn smollm2_answers_the_capital_of_france_with_f32_weights_and_kv() {
    let Some(model) = test_support::fetched::smollm2_gguf("smollm2_answers_the_capital_of_france")
    else {
        return;
    };
    let cache = ScratchDir::new("chat-smollm2");
    let o = htpkv(
        &[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--chat",
            "What is the capital of France?",
            "--kv-dtype",
            "f32",
            "--weights",
            "f32",
            "--context",
            "128",
            "--steps",
            "24",
        ],
        &cache,
    );
    assert_eq!(ok_stdout(&o).trim_end(), "The capital of France is Paris.");
}

#[test]
fn a_chat_longer_than_the_context_slides_with_overflow_slide() {
    let cache = ScratchDir::new("chat-slide");
    let dir = stories260k_dir();
    let dir = dir.to_str().unwrap();
    let args = ["--model", dir, "--steps", "12", "--context", "64"];
    let turns = "Once upon a time\nThe dog ran\n".repeat(6);
    let o = chat(
        &[&args[..], &["--overflow", "slide", "--stats"]].concat(),
        &turns,
        &cache,
    );
    let out = ok_stdout(&o);
    assert_eq!(out.lines().count(), 12, "{out}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("slide at "), "{stderr}");
    // Without a policy the chat stops where the context is full, saying so.
    let o = chat(&args, &turns, &cache);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("the context holds only"), "{stderr}");
}

#[test]
fn a_chat_line_of_megabytes_is_refused_before_it_is_tokenized() {
    let cache = ScratchDir::new("chat-huge");
    let dir = stories260k_dir();
    let dir = dir.to_str().unwrap();
    let line = "a".repeat(32 << 20) + "\n";
    let o = chat(
        &["--model", dir, "--steps", "4", "--context", "64", "--stats"],
        &line,
        &cache,
    );
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("tokens but the context holds only"),
        "{stderr}"
    );
    assert!(stderr.contains("at least"), "{stderr}");
}

/// Issue 21, finding 13, and issue 38: `--tokenizer FILE` alone is the llama2.c model's tokenizer
/// (here the discovered stories260K's), so a missing file is refused naming it; `--convention`
/// alone is about context binaries.
#[test]
fn a_tokenizer_without_binaries_is_named_as_the_option_given() {
    let cache = ScratchDir::new("chat-tokenizer-alone");
    let o = htpkv(
        &[
            "generate",
            "--tokenizer",
            "/nonexistent/tokenizer.json",
            "Once",
        ],
        &cache,
    );
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("/nonexistent/tokenizer.json"), "{stderr}");
    assert!(!stderr.contains("--bundle and --convention"), "{stderr}");
    let o = htpkv(&["generate", "--convention", "aihub", "Once"], &cache);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("--convention describes context binaries"),
        "{stderr}"
    );
}

/// Issue 37: a base model without a chat template (the toy llama GGUF, as Gemma 3 270M) refuses
/// chat turns naming the file, while `generate` from a plain prompt works; `--chat-template FILE`
/// gives it one, and the answer is the plain generation of the prompt that template renders.
#[test]
fn a_model_without_a_template_refuses_chat_until_given_one() {
    let cache = ScratchDir::new("chat-no-template");
    std::fs::create_dir_all(&cache).unwrap();
    let model = cache.join("llama.gguf");
    std::fs::write(&model, test_support::families::toy_gguf("llama").unwrap()).unwrap();
    let m = model.to_str().unwrap();
    let shape = ["--model", m, "--steps", "6", "--context", "64"];
    let refused = htpkv(
        &[&["generate", "--chat", "hi"], &shape[..]].concat(),
        &cache,
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("llama.gguf has no chat template"), "{err}");
    let template = cache.join("turns.jinja");
    let jinja = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
                 {% if add_generation_prompt %}assistant:{% endif %}";
    std::fs::write(&template, jinja).unwrap();
    let t = template.to_str().unwrap();
    let chat = [
        &["generate", "--chat", "hi", "--chat-template", t],
        &shape[..],
    ]
    .concat();
    let answered = ok_stdout(&htpkv(&chat, &cache));
    let plain_args = [&["generate", "user: hi\nassistant:"], &shape[..]].concat();
    let plain = ok_stdout(&htpkv(&plain_args, &cache));
    assert!(
        plain.trim_end().ends_with(answered.trim_end()),
        "{answered:?} vs {plain:?}"
    );
    // The template adds calibration conversations, so the cache keeps both builds apart: running
    // either again compiles nothing (they used to overwrite one entry in turn).
    let entries = std::fs::read_dir(&cache).unwrap().flatten();
    let compiled = entries.filter(|e| e.path().extension().is_some_and(|x| x == "htpkv"));
    assert_eq!(compiled.count(), 2);
    for args in [&chat, &plain_args] {
        let o = htpkv(args, &cache);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains("compil"), "{err}");
    }
}
