//! Cross-check of the GGUF SentencePiece (`llama`) tokenizer in `model`: stories260K's
//! vocabulary and scores, presented as GGUF metadata, must encode and decode like llama2.c's
//! own tokenizer.

use ::model::HfTokenizer;
use ::model::gguf::{Array, GgufFile, Value};
use model::llama2c::Tokenizer;

/// GGUF `tokenizer.ggml.*` metadata for a llama2.c tokenizer: spaces back to `▁`, BOS/EOS
/// as `<s>`/`</s>`, types unknown (2), control (3), byte (6) and normal (1).
fn as_gguf(tok: &Tokenizer) -> GgufFile {
    let n = tok.vocab_size() as u32;
    let piece = |id: u32| match id {
        1 => "<s>".to_owned(),
        2 => "</s>".to_owned(),
        _ => String::from_utf8_lossy(tok.piece(id).unwrap()).replace(' ', "▁"),
    };
    let ty = |id: u32| match id {
        0 => 2,
        1 | 2 => 3,
        3..=258 => 6,
        _ => 1,
    };
    let s = |v: &str| Value::String(v.to_owned());
    let metadata = vec![
        ("tokenizer.ggml.model".to_owned(), s("llama")),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(Array::String((0..n).map(piece).collect())),
        ),
        (
            "tokenizer.ggml.scores".to_owned(),
            Value::Array(Array::Float(
                (0..n).map(|i| tok.score(i).unwrap()).collect(),
            )),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(Array::Signed((0..n).map(ty).collect())),
        ),
        ("tokenizer.ggml.bos_token_id".to_owned(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".to_owned(), Value::U32(0)),
    ];
    GgufFile {
        version: 3,
        metadata,
        tensors: Vec::new(),
        alignment: 32,
        data_offset: 0,
    }
}

#[test]
fn gguf_sentencepiece_encodes_like_llama2c() {
    let files = test_support::stories::stories260k();
    let (_, tok) = files.load().unwrap();
    let hf = HfTokenizer::from_gguf(&as_gguf(&tok)).unwrap();
    let texts = [
        "Once upon a time, there was a little girl named Lily.",
        "She said: \"Wow!\" and ran  away.\nThe end.",
        "Zebras jumped quickly over 123 lazy dogs.",
        "Café: über naïve ☃ 🙂",
        " leading and trailing spaces ",
    ];
    for text in texts {
        let want = tok.encode(text, true, false);
        let got = hf.encode(text, true).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(hf.decode(&got, true).unwrap(), text, "{text:?}");
    }
}
