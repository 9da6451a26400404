//! One generation: options, stop conditions, cancellation and the text a generation streams.
//!
//! [`TextOutput`] is the one place that turns sampled tokens into streamed text; plain decoding
//! ([`Session::generate`]) and speculative decoding (`htpkv::speculate`) both push their tokens
//! through it, so stop strings, the token budget and cancellation behave the same in both.
//!
//! Stop strings are matched in the decoded text, across token boundaries, and never emitted: the
//! streamed text holds back only its longest ending that could still grow into a stop string, and
//! is cut where a stop string starts. The tokens of a generation are every sampled token, including
//! the one that completed a stop string; as after any stop, the cache holds all of them but the last.

use super::{BOS, Session, SessionError, TextCodec};
use crate::backend::Backend;
use crate::constraint::{Constraint, ConstraintFactory};
use crate::sampler::{Sampler, SamplerOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The longest stop string accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;
/// The most stop strings one generation takes.
pub const MAX_STOPS: usize = 16;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced its end of text (EOS, or end of turn).
    EndOfText,
    /// A stop string appeared in the text (it is not part of the text).
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The cancel handle was used.
    Cancelled,
    /// The token callback asked to stop.
    Callback,
}

impl StopReason {
    /// The finish reason as OpenAI's API and `--json` name it: `stop`, `length`, `context` or
    /// `cancelled` (a callback that stops counts as a cancel).
    pub fn finish_reason(self) -> &'static str {
        match self {
            StopReason::EndOfText | StopReason::StopString => "stop",
            StopReason::MaxTokens => "length",
            StopReason::ContextFull => "context",
            StopReason::Cancelled | StopReason::Callback => "cancelled",
        }
    }
}

/// A handle that cancels generation from another thread: the generation stops at its next step
/// boundary with [`StopReason::Cancelled`], the cache holding exactly the tokens it committed (the
/// session can go on, or be saved). Clones share one flag; a cancelled handle stays cancelled.
#[derive(Debug, Clone)]
pub struct Cancel(Flag);

#[derive(Debug, Clone)]
enum Flag {
    Shared(Arc<AtomicBool>),
    Static(&'static AtomicBool),
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel::new()
    }
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel(Flag::Shared(Arc::new(AtomicBool::new(false))))
    }

    /// A handle over a static flag: one a signal handler may set (it allocates nothing).
    pub fn from_static(flag: &'static AtomicBool) -> Cancel {
        Cancel(Flag::Static(flag))
    }

    fn flag(&self) -> &AtomicBool {
        match &self.0 {
            Flag::Shared(f) => f,
            Flag::Static(f) => f,
        }
    }

    /// Asks the generations holding this handle to stop.
    pub fn cancel(&self) {
        self.flag().store(true, Ordering::Release);
    }

    /// True when `other` is a clone of this handle (they share one flag).
    pub fn same_flag(&self, other: &Cancel) -> bool {
        std::ptr::eq(self.flag(), other.flag())
    }

    /// True once [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag().load(Ordering::Acquire)
    }
}

/// Options of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// The most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerOptions,
    /// Stop strings (at most [`MAX_STOPS`], each 1 to [`MAX_STOP_BYTES`] bytes).
    pub stop: Vec<String>,
    /// Cancels the generation from another thread.
    pub cancel: Option<Cancel>,
    /// Constrains the output (a JSON schema, a regex, a grammar).
    pub constraint: Option<Arc<dyn ConstraintFactory>>,
}

impl Default for GenerateOptions {
    /// 256 tokens at most, greedy.
    fn default() -> Self {
        GenerateOptions::new(256, SamplerOptions::default())
    }
}

impl GenerateOptions {
    /// Up to `max_tokens` tokens chosen by `sampler`, without stop strings, cancel or constraint.
    pub fn new(max_tokens: usize, sampler: SamplerOptions) -> GenerateOptions {
        GenerateOptions {
            max_tokens,
            sampler,
            stop: Vec::new(),
            cancel: None,
            constraint: None,
        }
    }

    /// Refuses stop strings that are empty, too long or too many.
    pub fn check(&self) -> Result<(), SessionError> {
        if self.stop.len() > MAX_STOPS {
            return Err(SessionError::Input(format!(
                "{} stop strings; at most {MAX_STOPS} are accepted",
                self.stop.len()
            )));
        }
        if let Some(s) = self
            .stop
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(SessionError::Input(format!(
                "a stop string must have 1 to {MAX_STOP_BYTES} bytes, got {}",
                s.len()
            )));
        }
        Ok(())
    }

    /// True when the cancel handle was used.
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
}

/// Turns byte pieces into valid UTF-8 text as they stream: incomplete sequences wait for their next
/// bytes, invalid bytes become U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("validated"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// The length of the longest ending of `text` that is the start of one of `stops` (shorter than
/// that stop): text that could still become a stop string, so it is held back. The ending starts on
/// a character boundary, since it equals the start of a string.
pub fn stop_prefix_len(text: &str, stops: &[String]) -> usize {
    let bytes = text.as_bytes();
    stops
        .iter()
        .flat_map(|s| (1..s.len().min(bytes.len() + 1)).map(move |k| (s, k)))
        .filter(|(s, k)| bytes.ends_with(&s.as_bytes()[..*k]))
        .map(|(_, k)| k)
        .max()
        .unwrap_or(0)
}

/// The earliest position at or after `from` where one of `stops` starts in `text`.
pub fn find_stop(text: &str, from: usize, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i))
        .min()
}

/// The text a generation streams: tokens become UTF-8 pieces, stop strings are matched and held
/// back, and the token budget and the cancel handle are checked.
pub struct TextOutput<'a> {
    codec: &'a dyn TextCodec,
    on_text: &'a mut dyn FnMut(&str) -> bool,
    options: &'a GenerateOptions,
    tokens: Vec<u32>,
    text: String,
    /// How much of `text` went to `on_text`.
    emitted: usize,
    utf8: Utf8Stream,
    prev: u32,
}

impl std::fmt::Debug for TextOutput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextOutput")
            .field("tokens", &self.tokens.len())
            .field("emitted", &self.emitted)
            .finish()
    }
}

impl<'a> TextOutput<'a> {
    /// An empty output after `prev` (the last cached token, or BOS).
    pub fn new(
        codec: &'a dyn TextCodec,
        options: &'a GenerateOptions,
        prev: Option<u32>,
        on_text: &'a mut dyn FnMut(&str) -> bool,
    ) -> TextOutput<'a> {
        TextOutput {
            codec,
            on_text,
            options,
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            utf8: Utf8Stream::default(),
            prev: prev.unwrap_or(BOS),
        }
    }

    /// The tokens pushed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many more tokens the budget allows.
    pub fn budget_left(&self) -> usize {
        self.options.max_tokens - self.tokens.len()
    }

    /// The tokenizer the text comes from.
    pub fn codec(&self) -> &'a dyn TextCodec {
        self.codec
    }

    /// Why generation ends before its first token, if it does: no token budget, or cancelled
    /// (during the prompt's prefill, say).
    pub fn stop_before_first(&self) -> Option<StopReason> {
        if !self.tokens.is_empty() {
            None
        } else if self.options.max_tokens == 0 {
            Some(StopReason::MaxTokens)
        } else {
            self.options.cancelled().then_some(StopReason::Cancelled)
        }
    }

    /// Adds a sampled token (not end of text); `Some` when generation ends after it: a stop string
    /// completed, the callback asked to stop, or the token budget is spent.
    ///
    /// A constrained text is spelled with the bytes the constraint matched
    /// ([`TextCodec::token_bytes`]): after BOS a tokenizer drops a token's leading space that the
    /// grammar saw, and the text must be what the grammar accepted (issue 36).
    pub fn push(&mut self, token: u32) -> Option<StopReason> {
        self.tokens.push(token);
        let bytes = match self.options.constraint {
            Some(_) => self.codec.token_bytes(token),
            None => self.codec.decode_piece(self.prev, token),
        };
        let piece = self.utf8.push(&bytes);
        self.prev = token;
        self.text.push_str(&piece);
        if let Some(at) = find_stop(&self.text, self.emitted, &self.options.stop) {
            self.text.truncate(at);
            self.emit(at);
            return Some(StopReason::StopString);
        }
        let safe =
            self.text.len() - stop_prefix_len(&self.text[self.emitted..], &self.options.stop);
        if !self.emit(safe) {
            return Some(StopReason::Callback);
        }
        (self.tokens.len() == self.options.max_tokens).then_some(StopReason::MaxTokens)
    }

    /// Streams `text[emitted..to]`; false when the callback asked to stop.
    fn emit(&mut self, to: usize) -> bool {
        if to <= self.emitted {
            return true;
        }
        let go_on = (self.on_text)(&self.text[self.emitted..to]);
        self.emitted = to;
        go_on
    }

    /// Ends the output: unless a stop string ended it, the held-back text and any incomplete UTF-8
    /// sequence are streamed.
    pub fn finish(mut self, prompt_tokens: Vec<u32>, stop: StopReason) -> Generation {
        if stop != StopReason::StopString {
            let tail = self.utf8.finish();
            self.text.push_str(&tail);
            self.emit(self.text.len());
        }
        Generation {
            prompt_tokens,
            tokens: self.tokens,
            text: self.text,
            stop,
        }
    }
}

impl<B: Backend> Session<B> {
    /// Samples a token from the last logits, masked by `constraint` when there is one (which then
    /// advances past the token).
    pub fn sample_constrained(
        &self,
        sampler: &mut Sampler,
        constraint: Option<&mut Box<dyn Constraint>>,
    ) -> Result<u32, SessionError> {
        let Some(c) = constraint else {
            return self.sample(sampler);
        };
        if self.last_logits.is_empty() {
            return Err(SessionError::Input(
                "no logits yet: prefill or decode first".into(),
            ));
        }
        let mut logits = self.last_logits.clone();
        c.mask(&mut logits)?;
        let token = sampler.sample_after(&logits, &self.tokens)?;
        c.commit(token)?;
        Ok(token)
    }

    /// Prefills `prompt` (tokenized with BOS when the cache is empty) unless it is empty and the
    /// session has logits to continue from (e.g. a restored session); the prompt's tokens.
    pub fn start_generation(
        &mut self,
        codec: &dyn TextCodec,
        prompt: &str,
    ) -> Result<Vec<u32>, SessionError> {
        let prompt_tokens = self.encode_fitting(codec, prompt)?;
        if prompt_tokens.is_empty() {
            if self.last_logits.is_empty() {
                return Err(SessionError::Input(
                    "the prompt encodes to no tokens".into(),
                ));
            }
        } else {
            self.prefill(&prompt_tokens)?;
        }
        Ok(prompt_tokens)
    }

    /// Why generation ends before the token just pushed to `out` is decoded, if it does: the
    /// context is full (and the overflow rule is `stop`), or the cancel handle was used. Every stop
    /// leaves the last generated token undecoded, so the cache holds exactly the tokens before it.
    pub fn stop_before_decode(&self, out: &TextOutput<'_>) -> Option<StopReason> {
        if self.overflow == super::Overflow::Stop && self.cache.len() + 1 > self.capacity() {
            Some(StopReason::ContextFull)
        } else {
            out.options.cancelled().then_some(StopReason::Cancelled)
        }
    }

    /// Generates text after `prompt`. When the cache is empty the prompt starts with BOS; otherwise it
    /// continues the cached text, and an empty prompt continues from the last logits (e.g. of a
    /// restored session). Text streams to `on_text` in valid UTF-8 pieces; returning false stops.
    /// Stop strings, the cancel handle and the constraint of `options` apply.
    pub fn generate(
        &mut self,
        codec: &dyn TextCodec,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, SessionError> {
        options.check()?;
        let mut sampler = Sampler::new(options.sampler)?;
        let mut constraint = options.constraint.as_ref().map(|f| f.start()).transpose()?;
        let prompt_tokens = self.start_generation(codec, prompt)?;
        let mut out = TextOutput::new(codec, options, self.tokens.last().copied(), on_text);
        let stop = loop {
            if let Some(s) = out.stop_before_first() {
                break s;
            }
            let next = self.sample_constrained(&mut sampler, constraint.as_mut())?;
            if codec.is_stop(next) {
                break StopReason::EndOfText;
            }
            if let Some(s) = out.push(next).or_else(|| self.stop_before_decode(&out)) {
                break s;
            }
            self.decode(next)?;
        };
        Ok(out.finish(prompt_tokens, stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_held_back_ending_is_the_longest_start_of_a_stop_string() {
        assert_eq!(stop_prefix_len("hello wor", &stops(&["world"])), 3);
        assert_eq!(stop_prefix_len("abc", &stops(&["c!", "bc?"])), 2);
        assert_eq!(stop_prefix_len("abc", &stops(&["x", "cc"])), 1);
        assert_eq!(stop_prefix_len("abc", &stops(&[])), 0);
        // A whole stop string is a match, not a held-back start.
        assert_eq!(stop_prefix_len("abc", &stops(&["bc"])), 0);
        // A shorter text than the stop string: the whole text may be held back.
        assert_eq!(stop_prefix_len("ab", &stops(&["abcdef"])), 2);
        // Multi-byte: the ending starts on a character boundary.
        let text = "café";
        let k = stop_prefix_len(text, &stops(&["é!"]));
        assert_eq!(k, 2);
        assert!(text.is_char_boundary(text.len() - k));
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let s = stops(&["cd", "b"]);
        assert_eq!(find_stop("abcd", 0, &s), Some(1));
        assert_eq!(find_stop("abcd", 2, &s), Some(2));
        assert_eq!(find_stop("abcd", 3, &s), None);
    }

    #[test]
    fn finish_reasons_are_openais_names() {
        use StopReason::*;
        let names: Vec<_> = [
            EndOfText,
            StopString,
            MaxTokens,
            ContextFull,
            Cancelled,
            Callback,
        ]
        .map(StopReason::finish_reason)
        .to_vec();
        assert_eq!(
            names,
            [
                "stop",
                "stop",
                "length",
                "context",
                "cancelled",
                "cancelled"
            ]
        );
    }

    #[test]
    fn clones_of_a_cancel_handle_share_one_flag() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
        static FLAG: AtomicBool = AtomicBool::new(false);
        let s = Cancel::from_static(&FLAG);
        s.clone().cancel();
        assert!(s.is_cancelled() && FLAG.load(Ordering::Relaxed));
    }
}
