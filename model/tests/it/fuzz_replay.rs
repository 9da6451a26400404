//! Replays the `chat_template`, `checkpoint`, `gguf_model`, `hf_folder` and `tokenizer` fuzz corpora (see the README's
//! "Fuzzing") through their checks, and pins what the seeds of issue 21 must give: the valid
//! models load, each disagreement between description and tensors is refused.

use std::io::Cursor;
use std::path::PathBuf;

use test_support::files::ScratchDir;

#[path = "../../../fuzz/checks/chat_template.rs"]
mod chat_template;
#[path = "../../../fuzz/checks/checkpoint.rs"]
mod checkpoint;
#[path = "../../../fuzz/checks/gguf_model.rs"]
mod gguf_model;
#[path = "../../../fuzz/checks/hf_folder.rs"]
mod hf_folder;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../../fuzz/checks/tokenizer.rs"]
mod tokenizer;

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn chat_template_corpus() {
    replay::replay("chat_template", chat_template::check);
}

#[test]
fn checkpoint_corpus() {
    replay::replay("checkpoint", checkpoint::check);
}

#[test]
fn tokenizer_corpus() {
    replay::replay("tokenizer", tokenizer::check);
}

#[test]
fn gguf_model_corpus() {
    replay::replay("gguf_model", gguf_model::check);
}

#[test]
fn hf_folder_corpus() {
    replay::replay("hf_folder", |data| {
        hf_folder::check(&ScratchDir::new("fuzz-hf-folder"), data)
    });
}

#[test]
fn gguf_seeds_load_or_are_refused_naming_the_tensor_or_key() {
    let describe = |name: &str| {
        let bytes = seed("gguf_model", name);
        let file = model::gguf::GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).unwrap();
        let config = model::gguf::llama_config(&file, name, &mut Cursor::new(&bytes))?;
        model::gguf::read_weights(&file, &config, &mut Cursor::new(&bytes), name).map(drop)
    };
    describe("valid").unwrap();
    describe("looping_template").unwrap();
    // Partial rotary embeddings are read since issue 37 (Phi-4-mini rotates 3/4 of each head).
    describe("partial_rope").unwrap();
    for (name, says) in [
        ("block_count_below_layers", "tensor blk.1."),
        ("block_count_1000", "tensor blk.2."),
        ("unknown_tensor", "tensor blk.0.mystery.weight"),
        ("nan_weight", "holds NaN"),
        ("rope_dim_2_pow_30", "invalid"),
    ] {
        let msg = describe(name).unwrap_err().to_string();
        assert!(msg.starts_with(name) && msg.contains(says), "{name}: {msg}");
    }
}

#[test]
fn hf_seeds_load_or_are_refused() {
    let load = |name: &str| {
        let dir = ScratchDir::new(&format!("hf-seed-{name}"));
        for (file, body) in hf_folder::files(&seed("hf_folder", name)) {
            std::fs::write(dir.join(file), body).unwrap();
        }
        let loaded = model::load(&dir).map(|m| m.chat.is_some());
        loaded.map_err(|e| e.with_causes())
    };
    assert_eq!(load("valid"), Ok(false));
    assert_eq!(load("chat_template"), Ok(true));
    assert_eq!(load("looping_template"), Ok(true));
    assert_eq!(load("partial_rotary_factor"), Ok(false));
    for (name, says) in [
        ("fewer_layers", "is not part of the model"),
        ("repeated_tensor", "shards must not repeat a tensor"),
        ("unknown_tensor", "tensor model.mystery"),
        ("nan_weight", "holds NaN"),
        ("config_not_json", "config.json"),
    ] {
        let msg = load(name).unwrap_err();
        assert!(msg.contains(says), "{name}: {msg}");
    }
}
