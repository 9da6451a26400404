//! Hugging Face tokenizers: from a `tokenizer.json`, or built from GGUF metadata:
//! - `tokenizer.ggml.model = gpt2`: byte-level BPE vocabulary and merges, with the
//!   pre-tokenizer that `tokenizer.ggml.pre` names;
//! - `tokenizer.ggml.model = llama`: SentencePiece BPE (vocabulary with scores, `<0xXX>` byte
//!   fallback, `▁` for spaces, a leading space unless `tokenizer.ggml.add_space_prefix` is
//!   false). Its merges are derived from the scores: every split of a piece into two pieces of
//!   the vocabulary is a merge, ranked by the merged piece's score, so merging the
//!   lowest-ranked pair first is SentencePiece's highest-score-first rule.
//!
//! Pre-tokenizers known by their GGUF name: `gpt2`/`default` (GPT-2's regex), `smollm` and
//! `starcoder` (single digits, then GPT-2's regex), `llama-bpe`/`llama3` (Llama 3's regex),
//! `qwen2` (Qwen2's regex). Other names are an error rather than a silently different split.

use std::path::Path;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{
    NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence,
};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::Error;
use crate::gguf_file::{Array, GgufFile, Value};

/// GGUF `tokenizer.ggml.token_type` of control tokens (`<|im_start|>` and the like).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `tokenizer.ggml.token_type` of user-defined tokens.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer regex.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer regex (Llama 3's with single digits).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A Hugging Face tokenizer plus the BOS id to prepend when the model wants one.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    add_bos: Option<u32>,
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer {
        reason: format!("{what}: {e}"),
    }
}

impl HfTokenizer {
    /// Reads a `tokenizer.json`. `add_bos` is the id to prepend in [`encode`](Self::encode)
    /// when its post-processor does not already (pass `None` to rely on the file).
    /// The file is read under [`crate::fsio::FileKind::TOKENIZER`]'s cap.
    /// The same tokenizer prepending `add_bos` (none: no BOS) in [`encode`](Self::encode).
    pub fn with_bos(self, add_bos: Option<u32>) -> Self {
        HfTokenizer { add_bos, ..self }
    }

    /// Reads a `tokenizer.json`. (See [`with_bos`](Self::with_bos).)
    pub fn from_file(path: &Path, add_bos: Option<u32>) -> Result<Self, Error> {
        let bytes = crate::fsio::read_capped(path, crate::fsio::FileKind::TOKENIZER)?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| tok_err(&format!("cannot load {}", path.display()), e))?;
        Ok(HfTokenizer { inner, add_bos })
    }

    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.*`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, Error> {
        let tokens = string_array(file, "tokenizer.ggml.tokens")?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        if vocab.len() != tokens.len() {
            return Err(tok_err("tokenizer.ggml.tokens", "a token appears twice"));
        }
        let model = str_key(file, "tokenizer.ggml.model")?;
        let (mut inner, bos_default) = match model {
            "gpt2" => (byte_level_bpe(file, vocab)?, false),
            "llama" => (sentencepiece_bpe(file, tokens, vocab)?, true),
            other => {
                let why = format!("{other} is not supported (gpt2, llama)");
                return Err(tok_err("tokenizer.ggml.model", why));
            }
        };
        add_typed_tokens(&mut inner, file, tokens)?;
        let add_bos = file
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(bos_default);
        let bos = file
            .get("tokenizer.ggml.bos_token_id")
            .and_then(Value::as_u64);
        Ok(HfTokenizer {
            inner,
            add_bos: bos.filter(|_| add_bos).map(|b| b as u32),
        })
    }

    /// Token ids of `text`. Special tokens written in the text (e.g. `<|im_start|>`) become
    /// their single ids; with `add_bos` the model's BOS is prepended when it wants one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| tok_err("encode", e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        ids.extend(self.add_bos.filter(|_| add_bos));
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids`; special tokens are dropped when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, Error> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| tok_err("decode", e))
    }

    /// An incremental decoder for streaming output: feed ids one at a time and get text as
    /// soon as it forms whole characters (a multi-byte character split over tokens comes out
    /// with its last token).
    pub fn stream(&self, skip_special: bool) -> TextStream<'_> {
        TextStream(self.inner.decode_stream(skip_special))
    }

    /// The id of token string `token`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// GPT-2 style byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names.
fn byte_level_bpe(file: &GgufFile, vocab: Vocab) -> Result<tokenizers::Tokenizer, Error> {
    let merges = string_array(file, "tokenizer.ggml.merges")?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, split_merges(merges)?)
        .build()
        .map_err(|e| tok_err("byte-level BPE", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let pre = file
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevel::default()));
    Ok(inner)
}

/// SentencePiece BPE: merges from the scores, byte fallback, `▁` for spaces.
fn sentencepiece_bpe(
    file: &GgufFile,
    tokens: &[String],
    vocab: Vocab,
) -> Result<tokenizers::Tokenizer, Error> {
    let key = "tokenizer.ggml.scores";
    let scores = match file.get(key).and_then(Value::as_array) {
        Some(Array::Float(s)) if s.len() == tokens.len() => s,
        _ => {
            return Err(tok_err(
                key,
                format!("missing, or not {} floats", tokens.len()),
            ));
        }
    };
    let merges = sentencepiece_merges(tokens, scores, &vocab);
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    let unk = file
        .get("tokenizer.ggml.unknown_token_id")
        .and_then(Value::as_u64);
    if let Some(unk) = unk.and_then(|u| tokens.get(u as usize)) {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe.build().map_err(|e| tok_err("SentencePiece BPE", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let prefix = file
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let (normalizer, decoder) = sentencepiece_text_rules(prefix)?;
    inner.with_normalizer(Some(normalizer));
    inner.with_decoder(Some(decoder));
    Ok(inner)
}

/// Every split of a piece into two pieces of the vocabulary, ranked by the merged piece's
/// score (highest first; ties in vocabulary order).
fn sentencepiece_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        for (i, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(i);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                ranked.push((scores[id], id as u32, li, ri));
            }
        }
    }
    let key = |e: &(f32, u32, u32, u32)| (e.1, e.2, e.3);
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(key(a).cmp(&key(b))));
    let piece = |i: u32| tokens[i as usize].clone();
    ranked
        .into_iter()
        .map(|(_, _, l, r)| (piece(l), piece(r)))
        .collect()
}

/// Normalizer and decoder of SentencePiece text: spaces as `▁`, an optional leading space.
fn sentencepiece_text_rules(prefix: bool) -> Result<(NormalizerWrapper, DecoderWrapper), Error> {
    let replace =
        |from: &str, to: &str| Replace::new(from, to).map_err(|e| tok_err("SentencePiece", e));
    let mut norm: Vec<NormalizerWrapper> = vec![replace(" ", "▁")?.into()];
    let mut dec: Vec<DecoderWrapper> = vec![
        replace("▁", " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix {
        norm.insert(0, Prepend::new("▁".to_owned()).into());
        dec.push(Strip::new(' ', 1, 0).into());
    }
    Ok((
        NormalizerSequence::new(norm).into(),
        DecoderSequence::new(dec).into(),
    ))
}

type InnerStream<'a> = tokenizers::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    NormalizerWrapper,
    PreTokenizerWrapper,
    tokenizers::processors::PostProcessorWrapper,
    DecoderWrapper,
>;

/// Streaming decoder of one [`HfTokenizer`] (see [`HfTokenizer::stream`]).
pub struct TextStream<'a>(InnerStream<'a>);

impl std::fmt::Debug for TextStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TextStream")
    }
}

impl TextStream<'_> {
    /// Adds token `id`; returns the text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>, Error> {
        self.0.step(id).map_err(|e| tok_err("decode", e))
    }
}

fn str_key<'a>(file: &'a GgufFile, key: &str) -> Result<&'a str, Error> {
    file.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| tok_err(key, "missing or not a string"))
}

fn string_array<'a>(file: &'a GgufFile, key: &str) -> Result<&'a [String], Error> {
    match file.get(key).and_then(Value::as_array) {
        Some(Array::String(v)) => Ok(v),
        _ => Err(tok_err(key, "missing or not an array of strings")),
    }
}

/// GGUF merges are `"left right"`; byte-level tokens never contain a space.
fn split_merges(merges: &[String]) -> Result<Vec<(String, String)>, Error> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_owned(), b.to_owned()))
            }
            _ => Err(tok_err(
                "tokenizer.ggml.merges",
                format!("entry {i} {m:?} is not \"left right\""),
            )),
        })
        .collect()
}

fn regex_split(pattern: &str) -> Result<PreTokenizerWrapper, Error> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| tok_err("pre-tokenizer regex", e))?;
    Ok(split.into())
}

/// The pre-tokenizer llama.cpp calls `name`.
fn pre_tokenizer(name: &str) -> Result<PreTokenizerWrapper, Error> {
    let byte_level = |regex: bool| PreTokenizerWrapper::from(ByteLevel::new(false, true, regex));
    let steps = match name {
        "default" | "gpt2" => vec![byte_level(true)],
        "smollm" | "starcoder" => vec![Digits::new(true).into(), byte_level(true)],
        "llama-bpe" | "llama3" => vec![regex_split(LLAMA3_REGEX)?, byte_level(false)],
        "qwen2" => vec![regex_split(QWEN2_REGEX)?, byte_level(false)],
        other => {
            return Err(tok_err(
                "tokenizer.ggml.pre",
                format!("pre-tokenizer {other} is not supported"),
            ));
        }
    };
    Ok(Sequence::new(steps).into())
}

/// Registers control tokens as special and user-defined ones as added tokens, so the text
/// `<|im_start|>` encodes to its one id.
fn add_typed_tokens(
    inner: &mut tokenizers::Tokenizer,
    file: &GgufFile,
    tokens: &[String],
) -> Result<(), Error> {
    let key = "tokenizer.ggml.token_type";
    let types = match file.get(key).and_then(Value::as_array) {
        Some(Array::Signed(v)) => v,
        None => return Ok(()),
        Some(_) => return Err(tok_err(key, "not an array of integers")),
    };
    if types.len() != tokens.len() {
        let why = format!("{} entries for {} tokens", types.len(), tokens.len());
        return Err(tok_err(key, why));
    }
    let of_type = |ty: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(types)
            .filter(|&(_, &t)| t == ty)
            .map(|(tok, _)| AddedToken::from(tok.clone(), special))
            .collect()
    };
    inner.add_special_tokens(&of_type(TOKEN_TYPE_CONTROL, true));
    inner.add_tokens(&of_type(TOKEN_TYPE_USER_DEFINED, false));
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
