//! Constraints over llguidance: a [`Vocabulary`] (the tokenizer's token bytes, built once per
//! model), an [`OutputFormat`] (JSON schema, regex, Lark grammar) compiled against it into a
//! [`Grammar`], the [`ConstraintFactory`] a generation carries.

use crate::{OutputFormat, StructuredError};
use htpkv_runtime::constraint::{Constraint, ConstraintError, ConstraintFactory};
use htpkv_runtime::session::TextCodec;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A tokenizer's vocabulary as llguidance sees it: every token's bytes
/// ([`TextCodec::token_bytes`]) and the tokens that end the text ([`TextCodec::is_stop`]).
/// Building it walks the whole vocabulary (tens of milliseconds for 49k tokens), so a server
/// builds one per model and shares it.
pub struct Vocabulary {
    factory: ParserFactory,
    stops: Vec<u32>,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("size", &self.size())
            .field("stops", &self.stops)
            .finish()
    }
}

impl Vocabulary {
    /// The vocabulary of `codec`. Refused (`unsupported`) when the codec cannot list its tokens
    /// or has no stop token (a finished grammar must be able to end the text).
    pub fn new(codec: &dyn TextCodec) -> Result<Vocabulary, StructuredError> {
        let size = codec.vocab_size().ok_or_else(|| {
            StructuredError::unsupported("tokenizer", "it does not list its vocabulary")
        })?;
        let size32 = u32::try_from(size)
            .map_err(|_| StructuredError::unsupported("tokenizer", "vocabulary too large"))?;
        let stops: Vec<u32> = (0..size32).filter(|&t| codec.is_stop(t)).collect();
        let Some(&eos) = stops.first() else {
            return Err(StructuredError::unsupported(
                "tokenizer",
                "no token ends the text, so a finished grammar could not end it",
            ));
        };
        let words: Vec<Vec<u8>> = (0..size32).map(|t| codec.token_bytes(t)).collect();
        let trie = TokTrie::from(&TokRxInfo::new(size32, eos), &words).with_eos_tokens(&stops);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| StructuredError::invalid_from("tokenizer", "llguidance refused it", e))?;
        factory.quiet();
        Ok(Vocabulary { factory, stops })
    }

    /// The number of token ids.
    pub fn size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// The tokens that end the text (a finished grammar allows these, and only these).
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stops
    }

    /// Compiles `format` into a constraint factory; errors name `what` (the request's field,
    /// e.g. `response_format.json_schema`).
    ///
    /// What llguidance cannot compile safely is refused first ([`crate::guard`]: integer bounds
    /// past 2^53 − 1, nesting and `$ref` chains past their measured limits, Lark grammars nested
    /// too deep); the rest compiles on a thread of its own with a stack of
    /// [`guard::COMPILE_STACK_BYTES`](crate::guard::COMPILE_STACK_BYTES), whose panic is an error.
    pub fn compile(
        self: &Arc<Self>,
        format: &OutputFormat,
        what: &str,
    ) -> Result<Arc<Grammar>, StructuredError> {
        crate::guard::check(format, what)?;
        let vocab = Arc::clone(self);
        let owned = (format.clone(), what.to_owned());
        crate::guard::on_compile_thread(what, move || vocab.compile_unguarded(&owned.0, &owned.1))
    }

    /// [`Vocabulary::compile`] without the guard, on the caller's thread: only for measuring
    /// llguidance's own limits (`examples/stack_probe.rs`).
    #[doc(hidden)]
    pub fn compile_unguarded(
        self: &Arc<Self>,
        format: &OutputFormat,
        what: &str,
    ) -> Result<Arc<Grammar>, StructuredError> {
        let grammar = format.to_llguidance(what)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            StructuredError::invalid_from(
                what,
                format!("it does not compile: {}", first_line(&e)),
                e,
            )
        })?;
        let mut probe = Matcher::new(Ok(parser.clone()));
        probe.compute_mask().map_err(|e| {
            StructuredError::invalid_from(
                what,
                format!("no output can match it: {}", first_line(&e)),
                e,
            )
        })?;
        Ok(Arc::new(Grammar {
            vocab: Arc::clone(self),
            fresh: Mutex::new(parser),
            stats: Arc::default(),
        }))
    }
}

/// Mask counters shared by the generations of one [`Grammar`].
#[derive(Debug, Default)]
struct Counters {
    masks: AtomicU64,
    nanos: AtomicU64,
}

/// How much masking cost: masks computed and the time they took.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MaskStats {
    /// Masks computed (one per generated token).
    pub masks: u64,
    /// Their total time, in seconds.
    pub seconds: f64,
}

impl MaskStats {
    /// Milliseconds per mask (per generated token); 0 without masks.
    pub fn ms_per_token(&self) -> f64 {
        if self.masks == 0 {
            0.0
        } else {
            self.seconds * 1e3 / self.masks as f64
        }
    }
}

/// A compiled output format: the [`ConstraintFactory`] of [`htpkv_runtime::session::GenerateOptions`].
/// Each generation starts from a copy of the compiled parser.
pub struct Grammar {
    vocab: Arc<Vocabulary>,
    fresh: Mutex<TokenParser>,
    stats: Arc<Counters>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("vocab", &self.vocab)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Grammar {
    /// What masking cost so far, over every generation of this grammar.
    pub fn stats(&self) -> MaskStats {
        MaskStats {
            masks: self.stats.masks.load(Ordering::Relaxed),
            seconds: self.stats.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// The grammar as the runtime's factory type.
    pub fn factory(self: &Arc<Self>) -> Arc<dyn ConstraintFactory> {
        Arc::clone(self) as Arc<dyn ConstraintFactory>
    }
}

impl ConstraintFactory for Grammar {
    fn start(&self) -> Result<Box<dyn Constraint>, ConstraintError> {
        let parser = self
            .fresh
            .lock()
            .map_err(|_| ConstraintError("the compiled grammar's lock is poisoned".into()))?
            .clone();
        Ok(Box::new(GrammarState {
            matcher: Matcher::new(Ok(parser)),
            vocab: Arc::clone(&self.vocab),
            stats: Arc::clone(&self.stats),
        }))
    }
}

/// The parser state of one constrained generation.
struct GrammarState {
    matcher: Matcher,
    vocab: Arc<Vocabulary>,
    stats: Arc<Counters>,
}

/// The first line of an llguidance error (the rest is a dump of the parser's state).
fn first_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or_default().to_owned()
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint for GrammarState {
    /// Tokens the grammar refuses, and logits past the vocabulary (a model's padded rows), get
    /// negative infinity.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let started = Instant::now();
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| {
            ConstraintError(format!("computing the token mask: {}", first_line(&e)))
        })?;
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.stats.masks.fetch_add(1, Ordering::Relaxed);
        let size = self.vocab.size();
        let mut any = false;
        for (t, logit) in logits.iter_mut().enumerate() {
            let ok = t < size && allowed.is_allowed(t as u32);
            if ok {
                any = true;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(ConstraintError(
                "no token of the model may come next (the grammar cannot be completed)".into(),
            ));
        }
        Ok(())
    }

    /// A stop token ends the generation: the mask allowed it only where the grammar is complete,
    /// so there is nothing to advance (llguidance's parser may have stopped already).
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.vocab.stop_tokens().contains(&token) && !self.matcher.is_error() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| {
            ConstraintError(format!(
                "token {token} does not fit the grammar: {}",
                first_line(&e)
            ))
        })
    }
}
