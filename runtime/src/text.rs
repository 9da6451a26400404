//! Text in and out of a model: the tokenizers behind [`TextCodec`] (llama2.c's own, and a Hugging
//! Face tokenizer from `tokenizer.json` or GGUF metadata), and chat prompts.
//!
//! Chat prompts are rendered with the model's chat template (GGUF `tokenizer.chat_template`, or
//! `tokenizer_config.json`), with `add_generation_prompt`. A model without a template (the
//! llama2.c story models) gets the **plain fallback**: one `<role>: <text>` line per turn, in
//! order, and `assistant: ` where an answer is to begin (with `add_generation_prompt`).

use crate::session::{TextCodec, special_bytes};
use model::{ChatTemplate, HfTokenizer, Message};
use std::collections::HashMap;
use tokenizers::DecoderWrapper;

/// A Hugging Face tokenizer as a [`TextCodec`], with the model's stop tokens.
#[derive(Debug)]
pub struct HfCodec {
    tokenizer: HfTokenizer,
    stops: Vec<u32>,
    /// GPT-2 style byte-level BPE (token strings spell bytes through GPT-2's byte alphabet);
    /// otherwise SentencePiece style (`▁` for a space, `<0xNN>` for a byte).
    byte_level: bool,
    /// [`TextCodec::bytes_per_token`]: [`NORMALIZER_SLACK`] times the longest token string.
    bytes_per_token: usize,
    /// The special added tokens and their content, read once (the tokenizer hands out a copy of
    /// its added-token table on every query).
    specials: HashMap<u32, String>,
}

/// How much a Hugging Face normalizer may shrink a text (NFC/NFKC compose three Hangul jamo,
/// 9 bytes, into one 3-byte syllable): the text bound allows each token `NORMALIZER_SLACK` times
/// the bytes of the longest token string. (A tokenizer whose token can stand for unbounded text,
/// such as a fused `<unk>`, is capped by the same rule.)
pub const NORMALIZER_SLACK: usize = 4;

impl HfCodec {
    /// Wraps `tokenizer`; generation stops at any of `stops` (the model's EOS and end-of-turn).
    pub fn new(tokenizer: HfTokenizer, stops: Vec<u32>) -> HfCodec {
        let byte_level = matches!(
            tokenizer.inner().get_decoder(),
            Some(DecoderWrapper::ByteLevel(_))
        );
        let longest = tokenizer
            .inner()
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1);
        let specials = (tokenizer.inner().get_added_tokens_decoder().into_iter())
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        HfCodec {
            tokenizer,
            stops,
            byte_level,
            bytes_per_token: NORMALIZER_SLACK * longest.max(1),
            specials,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &HfTokenizer {
        &self.tokenizer
    }

    fn is_special(&self, token: u32) -> bool {
        self.specials.contains_key(&token)
    }
}

/// The byte a GPT-2 byte-level alphabet character stands for: bytes that are printable and not a
/// space stand for themselves, the other 68 bytes are spelled by U+0100.. in byte order.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| matches!(b, 33..=126 | 161..=172 | 174..=255);
    let cp = u32::from(c);
    if printable(cp) {
        return u8::try_from(cp).ok();
    }
    let n = cp.checked_sub(256)?;
    (0u32..=255)
        .filter(|&b| !printable(b))
        .nth(n as usize)
        .and_then(|b| u8::try_from(b).ok())
}

impl TextCodec for HfCodec {
    /// Encodes `text`; special tokens written in it (e.g. `<|im_start|>`) become their ids. A text
    /// the tokenizer rejects encodes to no tokens (the session then refuses the empty prompt).
    fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        self.tokenizer.encode(text, bos).unwrap_or_default()
    }

    /// The bytes of `token` (special tokens: none). `prev` is not needed: these tokenizers spell
    /// spaces inside the token.
    fn decode_piece(&self, _prev: u32, token: u32) -> Vec<u8> {
        if self.is_special(token) {
            return Vec::new();
        }
        let Some(piece) = self.tokenizer.inner().id_to_token(token) else {
            return Vec::new();
        };
        if self.byte_level {
            let mut out = Vec::with_capacity(piece.len());
            for c in piece.chars() {
                match byte_level_byte(c) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(c.to_string().as_bytes()),
                }
            }
            return out;
        }
        let hex = piece
            .strip_prefix("<0x")
            .and_then(|h| h.strip_suffix('>'))
            .filter(|h| h.len() == 2);
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(b) => vec![b],
            None => piece.replace('\u{2581}', " ").into_bytes(),
        }
    }

    fn bytes_per_token(&self) -> Option<usize> {
        Some(self.bytes_per_token)
    }

    fn is_stop(&self, token: u32) -> bool {
        self.stops.contains(&token)
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.tokenizer.inner().get_vocab_size(true))
    }

    /// Special tokens are spelled [`crate::session::SPECIAL_TOKEN_MARKER`] then their content; other tokens as
    /// [`TextCodec::decode_piece`] spells them.
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        match self.specials.get(&token) {
            Some(content) => special_bytes(content),
            None => self.decode_piece(0, token),
        }
    }
}

impl TextCodec for Box<dyn TextCodec + Send + Sync> {
    fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        (**self).encode(text, bos)
    }
    fn decode_piece(&self, prev: u32, token: u32) -> Vec<u8> {
        (**self).decode_piece(prev, token)
    }
    fn bytes_per_token(&self) -> Option<usize> {
        (**self).bytes_per_token()
    }
    fn is_stop(&self, token: u32) -> bool {
        (**self).is_stop(token)
    }
    fn vocab_size(&self) -> Option<usize> {
        (**self).vocab_size()
    }
    fn token_bytes(&self, token: u32) -> Vec<u8> {
        (**self).token_bytes(token)
    }
}

/// How a conversation becomes a prompt: the model's chat template or the plain fallback (see
/// the module docs).
#[derive(Debug)]
pub struct ChatFormat {
    template: Option<ChatTemplate>,
    /// A model file without a template (a base model): rendering is refused, naming it.
    missing: Option<String>,
}

impl ChatFormat {
    /// With `template`, or the plain fallback when `None` (llama2.c story models).
    pub fn new(template: Option<ChatTemplate>) -> ChatFormat {
        ChatFormat {
            template,
            missing: None,
        }
    }

    /// A model file (`origin`) that brings no chat template: a base model, which answers no chat
    /// turns; rendering is refused ([`model::Error::NoChatTemplate`]), and generating from a
    /// plain prompt works.
    pub fn missing(origin: impl Into<String>) -> ChatFormat {
        ChatFormat {
            template: None,
            missing: Some(origin.into()),
        }
    }

    /// True when the model has its own chat template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends where the assistant's
    /// answer starts (the plain fallback has no generation prompt).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, model::Error> {
        self.render_capped(messages, add_generation_prompt, usize::MAX)
    }

    /// [`ChatFormat::render`] refusing a template rendering of more than `max_bytes` bytes (and
    /// [`model::chat::MAX_RENDERED_BYTES`]); the template's work is bounded too
    /// ([`model::chat::TEMPLATE_FUEL`]). The plain fallback's length is the callers' to check.
    pub fn render_capped(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<String, model::Error> {
        self.render_with_tools(messages, None, add_generation_prompt, max_bytes)
    }

    /// True when the model's template describes tools itself (it refers to `tools`); otherwise
    /// tools are described in a system message (`htpkv_structured::tools`).
    pub fn takes_tools(&self) -> bool {
        self.template
            .as_ref()
            .is_some_and(ChatTemplate::mentions_tools)
    }

    /// [`ChatFormat::render_capped`] passing `tools` (an OpenAI `tools` array) to the template;
    /// the plain fallback ignores them.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<String, model::Error> {
        if let Some(origin) = &self.missing {
            let origin = origin.clone();
            return Err(model::Error::NoChatTemplate { origin });
        }
        match &self.template {
            Some(t) => t.render_with_tools(messages, tools, add_generation_prompt, max_bytes),
            None => {
                let mut out: String = messages
                    .iter()
                    .map(|m| format!("{}: {}\n", m.role, m.content))
                    .collect();
                if add_generation_prompt {
                    out.push_str("assistant: ");
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_covers_every_byte_once() {
        let mut seen = [false; 256];
        for cp in (0u32..=255).chain(256..256 + 68) {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            if let Some(b) = byte_level_byte(c) {
                assert!(!seen[usize::from(b)], "byte {b} twice");
                seen[usize::from(b)] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('\u{0200}'), None);
    }

    #[test]
    fn plain_fallback_labels_each_turn_with_its_role() {
        let chat = ChatFormat::new(None);
        let m = [
            Message::new("system", "Be brief."),
            Message::new("user", "Once upon a time"),
        ];
        assert_eq!(
            chat.render(&m, true).unwrap(),
            "system: Be brief.\nuser: Once upon a time\nassistant: "
        );
        assert_eq!(
            chat.render(&m, false).unwrap(),
            "system: Be brief.\nuser: Once upon a time\n"
        );
        assert!(!chat.has_template());
    }
}
