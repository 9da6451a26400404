//! Fuzz check of the llama2.c tokenizer: the first two bytes choose the vocabulary size, the
//! rest is the tokenizer file. A tokenizer that loads encodes and decodes text made of the same
//! bytes without panicking, never below its own lower bound on the token count, and decoding
//! inverts encoding.

use model::llama2c::Tokenizer;

pub fn check(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let vocab = usize::from(u16::from_le_bytes([data[0], data[1]]) % 600);
    let Ok(tok) = Tokenizer::from_bytes(&data[2..], vocab, "fuzz") else {
        return;
    };
    let text = String::from_utf8_lossy(&data[data.len().saturating_sub(64)..]).into_owned();
    let ids = tok.encode(&text, true, true);
    assert!(tok.min_tokens(&text) + 2 <= ids.len().max(2));
    // Byte fallback needs the 256 byte tokens after <unk>, <s>, </s>, and their pieces.
    let complete = vocab >= 259
        && (0..=255u8)
            .all(|b| tok.piece(u32::from(b) + 3) == Some(format!("<0x{b:02X}>").as_bytes()));
    if complete && tok.lookup(b" ").is_some() {
        assert_eq!(tok.decode(&ids), text.as_bytes());
    }
}
