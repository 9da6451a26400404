use std::io::Cursor;

use super::*;
use crate::gguf_file::tests::Writer;
use test_support::files::ScratchDir;

const TOKENS: [&str; 11] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "h",
    "i",
    "hi",
    "Ġ",
    "Ġhi",
    "1",
    "2",
    "12",
];
const MERGES: [&str; 3] = ["h i", "Ġ hi", "1 2"];

pub(crate) fn vocab_gguf(pre: &str) -> Writer {
    let mut g = Writer::default();
    g.str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", pre);
    g.str_array("tokenizer.ggml.tokens", &TOKENS);
    g.str_array("tokenizer.ggml.merges", &MERGES);
    g.i32_array(
        "tokenizer.ggml.token_type",
        &[3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1],
    );
    g.u32("tokenizer.ggml.bos_token_id", 1);
    g
}

fn build(g: &Writer) -> Result<HfTokenizer, Error> {
    let bytes = g.bytes();
    HfTokenizer::from_gguf(&GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).unwrap())
}

#[test]
fn gguf_bpe_merges_specials_and_digits() {
    let tok = build(&vocab_gguf("smollm")).unwrap();
    assert_eq!(tok.encode("hi hi", false).unwrap(), [5, 7]);
    assert_eq!(
        tok.encode("<|im_start|>hi<|im_end|>", false).unwrap(),
        [1, 5, 2]
    );
    // smollm splits digits before BPE, so the merge "1 2" never applies; gpt2 does not.
    assert_eq!(tok.encode("12", false).unwrap(), [8, 9]);
    assert_eq!(
        build(&vocab_gguf("gpt2"))
            .unwrap()
            .encode("12", false)
            .unwrap(),
        [10]
    );
    assert_eq!(
        tok.decode(&[1, 5, 7, 2], false).unwrap(),
        "<|im_start|>hi hi<|im_end|>"
    );
    assert_eq!(tok.decode(&[1, 5, 7, 2], true).unwrap(), "hi hi");
    // BOS only when the file asks for it.
    assert_eq!(tok.encode("hi", true).unwrap(), [5]);
    let mut g = vocab_gguf("smollm");
    g.bool("tokenizer.ggml.add_bos_token", true);
    assert_eq!(build(&g).unwrap().encode("hi", true).unwrap(), [1, 5]);
}

#[test]
fn tokenizer_json_round_trip() {
    let tok = build(&vocab_gguf("smollm")).unwrap();
    let dir = ScratchDir::new("tokenizer-round-trip");
    let path = dir.join("tokenizer.json");
    tok.inner().save(&path, false).unwrap();
    let again = HfTokenizer::from_file(&path, None).unwrap();
    for s in ["hi hi", "<|im_start|>hi 12<|im_end|>"] {
        assert_eq!(again.encode(s, true).unwrap(), tok.encode(s, true).unwrap());
    }
    let missing = HfTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"), None);
    // Read through the capped reader: a missing file is a file error naming it.
    let e = missing.unwrap_err();
    assert!(matches!(e, Error::File(_)), "{e}");
    assert_eq!(e.to_string(), "cannot open /nonexistent/tokenizer.json");
}

fn reason(r: Result<HfTokenizer, Error>) -> String {
    match r {
        Err(Error::Tokenizer { reason }) => reason,
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
}

#[test]
fn bad_tokenizer_metadata_is_an_error() {
    assert!(reason(build(&vocab_gguf("mystery"))).contains("mystery"));
    let mut g = vocab_gguf("smollm");
    g.kv[0].2 = crate::gguf_file::tests::gguf_str("llama-sp");
    assert!(reason(build(&g)).contains("tokenizer.ggml.model"));
    let mut g = vocab_gguf("smollm");
    g.kv.retain(|kv| kv.0 != "tokenizer.ggml.merges");
    g.str_array("tokenizer.ggml.merges", &["h i", "hi"]);
    assert!(reason(build(&g)).contains("entry 1"));
    let mut g = vocab_gguf("smollm");
    g.kv.retain(|kv| kv.0 != "tokenizer.ggml.token_type");
    g.i32_array("tokenizer.ggml.token_type", &[3]);
    assert!(reason(build(&g)).contains("token_type"));
    let mut g = vocab_gguf("smollm");
    g.kv.retain(|kv| kv.0 != "tokenizer.ggml.tokens");
    g.str_array("tokenizer.ggml.tokens", &["h", "h"]);
    assert!(reason(build(&g)).contains("twice"));
}
