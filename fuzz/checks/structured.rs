//! Fuzz check of structured output's inputs (issue 36): the first byte picks the kind (JSON
//! schema, Lark grammar, regex), the rest is its text. Compiling never panics nor overflows a stack
//! (what llguidance cannot compile safely is refused first), and a JSON schema that compiles
//! lets a greedy generation over a byte vocabulary end only in JSON.

use htpkv_runtime::session::TextCodec;
use htpkv_structured::{OutputFormat, Vocabulary};
use std::sync::Arc;

/// One token per byte, then the end token.
#[derive(Debug)]
pub struct Bytes;

pub const END: u32 = 256;

impl TextCodec for Bytes {
    fn encode(&self, text: &str, _bos: bool) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode_piece(&self, _prev: u32, token: u32) -> Vec<u8> {
        u8::try_from(token).map(|b| vec![b]).unwrap_or_default()
    }
    fn is_stop(&self, token: u32) -> bool {
        token == END
    }
    fn vocab_size(&self) -> Option<usize> {
        Some(END as usize + 1)
    }
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        if token == END {
            b"\xFF<end>".to_vec()
        } else {
            self.decode_piece(0, token)
        }
    }
}

pub fn check(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let format = match kind % 3 {
        0 => match serde_json::from_str(&text) {
            Ok(schema) => OutputFormat::JsonSchema(schema),
            Err(_) => return,
        },
        1 => OutputFormat::Lark(text),
        _ => OutputFormat::Regex(text),
    };
    let vocab = Arc::new(Vocabulary::new(&Bytes).expect("a byte vocabulary"));
    let Ok(grammar) = vocab.compile(&format, "fuzz") else {
        return;
    };
    let mut state = grammar.factory().start().expect("a fresh parser");
    let mut out = Vec::new();
    for _ in 0..64 {
        let mut logits = vec![0.0f32; END as usize + 1];
        if state.mask(&mut logits).is_err() {
            return;
        }
        // The end when allowed, else the first allowed byte: the shortest answers.
        let pick = if logits[END as usize].is_finite() {
            END
        } else {
            (0..END)
                .find(|&t| logits[t as usize].is_finite())
                .expect("a token is allowed")
        };
        state.commit(pick).expect("an allowed token commits");
        if pick == END {
            if matches!(format, OutputFormat::JsonSchema(_)) {
                serde_json::from_slice::<serde_json::Value>(&out).expect("an ended answer is JSON");
            }
            return;
        }
        out.push(pick as u8);
    }
}
