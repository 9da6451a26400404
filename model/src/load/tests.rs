use super::*;
use crate::config::tests::tiny;
use crate::forward::tests::synthetic;
use crate::gguf::tests::tiny_gguf;
use crate::gguf_file::tests::Writer;
use crate::hf::tests::{tiny_json, write_model};
use crate::tokenizer::tests::vocab_gguf;
use crate::{Message, WeightSource};
use test_support::files::ScratchDir;

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}";

#[test]
fn gguf_file_loads_with_tokenizer_and_template() {
    let dir = ScratchDir::new("load-gguf");
    let c = tiny();
    let w = synthetic(&c, 31);
    let mut g: Writer = tiny_gguf(&c, &w);
    g.kv.extend(
        vocab_gguf("smollm")
            .kv
            .into_iter()
            .filter(|kv| !kv.0.ends_with("bos_token_id")),
    );
    g.str("tokenizer.chat_template", TEMPLATE);
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    assert_eq!(format_of(&path).unwrap(), ModelFormat::Gguf);
    assert_eq!(describe(&path).unwrap(), c);
    let m = load(&path).unwrap();
    assert_eq!(m.config, c);
    assert_eq!(
        m.weights.tensor(crate::Tensor::OutputNorm),
        w.tensor(crate::Tensor::OutputNorm)
    );
    let text = m
        .chat
        .unwrap()
        .render_chat(&[Message::new("user", "hi hi")], false)
        .unwrap();
    assert_eq!(m.tokenizer.encode(&text, true).unwrap(), [1, 5, 7, 2]);
}

/// A Hugging Face folder `name` with the tiny config and its safetensors (no tokenizer files).
fn tiny_folder(name: &str) -> (ScratchDir, crate::LlamaConfig) {
    let dir = ScratchDir::new(name);
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    let c = crate::hf::config_from_json(&tiny_json().to_string(), "t").unwrap();
    write_model(&dir, &c, &synthetic(&c, 32), |_| safetensors::Dtype::F32);
    (dir, c)
}

#[test]
fn hf_folder_loads_with_tokenizer_json_and_config() {
    let (dir, c) = tiny_folder("load-hf");
    let bytes = vocab_gguf("smollm").bytes();
    let file =
        crate::gguf::GgufFile::read(std::io::Cursor::new(&bytes), bytes.len() as u64).unwrap();
    let tok = HfTokenizer::from_gguf(&file).unwrap();
    tok.inner().save(dir.join("tokenizer.json"), false).unwrap();
    assert_eq!(format_of(&dir).unwrap(), ModelFormat::HfFolder);
    assert_eq!(describe(&dir).unwrap(), c);
    let m = load(&dir).unwrap();
    assert!(m.chat.is_none());
    assert_eq!(m.tokenizer.encode("hi", true).unwrap(), [5]);
    let cfg = serde_json::json!({"add_bos_token": true, "chat_template": TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let m = load(&dir).unwrap();
    assert!(m.chat.is_some());
    assert_eq!(m.tokenizer.encode("hi", true).unwrap(), [1, 5]);
}

#[test]
fn other_paths_are_unknown_formats() {
    let dir = ScratchDir::new("load-unknown");
    assert!(matches!(format_of(&dir), Err(Error::UnknownFormat { .. })));
    let f = dir.join("model.bin");
    std::fs::write(&f, b"GGML and more").unwrap();
    assert!(matches!(describe(&f), Err(Error::UnknownFormat { .. })));
    assert!(matches!(
        load(&dir.join("absent")),
        Err(Error::File(crate::fsio::FileError::Io { op: "open", .. }))
    ));
}

/// Issue 21 finding 5: an HF folder's `tokenizer_config.json` was read with `read_to_string` and
/// no cap, its `tokenizer.json` uncapped too; a FIFO given as a model blocked at `open`. Each
/// file is refused from its size (sparse files here: nothing is read) or its type.
#[test]
fn hf_folder_files_are_capped_and_special_files_refused() {
    let (dir, _) = tiny_folder("load-caps");
    let sparse = |name: &str, len: u64| {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_len(len).unwrap();
    };
    let too_large = |e: Error, name: &str| {
        let text = e.to_string();
        assert!(
            matches!(e, Error::File(crate::fsio::FileError::TooLarge { .. })),
            "{name}: {text}"
        );
        assert_eq!(text.matches(name).count(), 1, "{text}");
    };
    sparse("tokenizer.json", (64 << 20) + 1);
    too_large(load(&dir).unwrap_err(), "tokenizer.json");
    sparse("tokenizer_config.json", (16 << 20) + 1);
    too_large(load(&dir).unwrap_err(), "tokenizer_config.json");
    sparse("config.json", (16 << 20) + 1);
    too_large(describe(&dir).unwrap_err(), "config.json");
    // A FIFO as the model file: refused at once, never opened for a blocking read.
    let fifo = dir.join("model.gguf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(describe(&f).map(|_| ()).map_err(|e| e.to_string()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("describe of a FIFO blocked");
        assert_eq!(
            got.unwrap_err(),
            format!("GGUF file {} is a FIFO, not a regular file", fifo.display())
        );
    }
}

#[test]
fn a_gguf_template_that_never_ends_fails_naming_the_file() {
    let dir = ScratchDir::new("load-gguf-loop");
    let c = tiny();
    let mut g: Writer = tiny_gguf(&c, &synthetic(&c, 33));
    g.kv.extend(
        vocab_gguf("smollm")
            .kv
            .into_iter()
            .filter(|kv| !kv.0.ends_with("_token_id")),
    );
    g.str(
        "tokenizer.chat_template",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    );
    let path = dir.join("loop.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    let chat = load_text(&path).unwrap().chat.unwrap();
    let err = chat
        .render_chat(&[Message::new("user", "hi")], true)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("{}: tokenizer.chat_template: ", path.display())),
        "{msg}"
    );
}

/// Issue 21, finding 13: errors about what `--model F` holds name F.
#[test]
fn description_and_tokenizer_errors_name_the_model_file() {
    let dir = ScratchDir::new("load-names");
    let c = tiny();
    let chain = |e: Error| e.with_causes();
    // A GGUF tokenizer the loader cannot build.
    let mut g: Writer = tiny_gguf(&c, &synthetic(&c, 34));
    g.kv.extend(
        vocab_gguf("smollm")
            .kv
            .into_iter()
            .filter(|kv| !kv.0.ends_with("_token_id") && kv.0 != "tokenizer.ggml.model"),
    );
    g.str("tokenizer.ggml.model", "bert");
    let path = dir.join("bert.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    let msg = chain(load_text(&path).unwrap_err());
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("tokenizer.ggml.model") && msg.contains("bert"),
        "{msg}"
    );
    // A description its own fields contradict.
    let mut g: Writer = tiny_gguf(&c, &synthetic(&c, 35));
    g.kv.retain(|kv| kv.0 != "llama.attention.head_count_kv");
    g.u32("llama.attention.head_count_kv", 3);
    std::fs::write(&path, g.bytes()).unwrap();
    let msg = chain(describe(&path).unwrap_err());
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(msg.contains("n_kv_heads"), "{msg}");
    // A folder whose config.json is not a file is a Hugging Face folder with a bad config.json,
    // not "no llama2.c model here".
    let hf = dir.join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::create_dir(hf.join("config.json")).unwrap();
    assert_eq!(format_of(&hf).unwrap(), ModelFormat::HfFolder);
    let msg = chain(describe(&hf).unwrap_err());
    assert!(
        msg.contains(&hf.join("config.json").display().to_string()),
        "{msg}"
    );
}
