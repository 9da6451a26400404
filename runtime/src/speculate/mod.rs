//! Speculative decoding on the static graphs: a [`Speculator`] proposes the tokens that may follow,
//! one AR-n step of the target model verifies them all ([`Session::verify`]), and the accepted
//! ones are committed with `commit(k)` ([`Session::accept`]); the rejected rows are dropped (free
//! with `shift`/`conveyor`, whose commit is a pointer move).
//!
//! Speculators ([`SpecKind`], CLI `--speculate`):
//! - `prompt-lookup[:K]` ([`prompt_lookup`]): the longest suffix n-gram of the text so far (prompt
//!   and generated tokens) is looked up earlier in it, and the K tokens that followed are proposed.
//!   No extra model; it pays off when the answer copies the prompt (rewrite, edit, summarise,
//!   code with identifiers from the question).
//! - `draft:PATH[:K]` ([`draft`]): a second model sharing the tokenizer proposes K tokens greedily
//!   on its own session and cache.
//! - `lookahead[:W,N,G]` ([`lookahead`]): Jacobi iteration over the verification rows with an
//!   n-gram pool (Genie's `lade` window, n-gram size and pool cap); no extra model.
//!
//! How many proposed tokens a step verifies is the [`planner`]'s choice (or all of them:
//! [`Speculation::verifying_all`]).
//!
//! **Lossless.** With greedy sampling the text is exactly plain decoding's: a proposed token is
//! accepted only where the target's own argmax of that row equals it, and the cache is left as
//! plain decoding leaves it (the step's last token is never cached when the token budget ends, a
//! stop token is never cached, slides happen at the same length: when the rows of a verification
//! step do not fit, the step is a plain AR-1 decode with the overflow policy). This holds because
//! each row's logits of an AR-n step equal the AR-1 step's (the reference executor's sums are exact
//! integers; tested for every strategy in `tests/speculate.rs`).

use crate::backend::Backend;
use crate::sampler::Sampler;
use crate::session::{
    GenerateOptions, Generation, Session, SessionError, StopReason, TextCodec, TextOutput,
};
use std::path::PathBuf;
use std::time::Instant;

pub mod draft;
pub mod lookahead;
pub mod planner;
pub mod prompt_lookup;
mod stats;

pub use lookahead::Lookahead;
pub use prompt_lookup::PromptLookup;
pub use stats::SpecStats;

/// Errors of speculative decoding.
#[derive(Debug, thiserror::Error)]
pub enum SpeculateError {
    /// A `--speculate` value that cannot be used (the message says why).
    #[error("--speculate {spec}: {reason}")]
    Parse { spec: String, reason: String },
    /// A step of the target (or draft) model failed.
    #[error("speculative decoding: {what}")]
    Session {
        what: &'static str,
        #[source]
        source: SessionError,
    },
}

impl SpeculateError {
    /// The error's kind: `bad_option`, or the session error's.
    pub fn kind(&self) -> &'static str {
        match self {
            SpeculateError::Parse { .. } => "bad_option",
            SpeculateError::Session { source, .. } => source.kind(),
        }
    }
}

/// Wraps a session error with what was being done.
fn during(what: &'static str) -> impl FnOnce(SessionError) -> SpeculateError {
    move |source| SpeculateError::Session { what, source }
}

/// Tokens proposed to follow the text so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// The speculator's confidence class (prompt lookup: the length of the n-gram matched): the
    /// planner estimates acceptance per class to decide how many tokens to verify.
    pub class: usize,
}

/// Something that guesses the tokens that follow: the one interface of every speculator.
pub trait Speculator: Send {
    /// The speculator's spelling (`prompt-lookup:4`).
    fn name(&self) -> String;
    /// Tokens proposed per step at most (K).
    fn max_proposal(&self) -> usize;
    /// Proposes at most `max` tokens to follow `history`: every token of the text so far (the
    /// cached ones, then the next token, which is not cached yet).
    fn propose(&mut self, history: &[u32], max: usize) -> Result<Proposal, SpeculateError>;
    /// What the verification of `run` (the next token, then the proposed tokens verified) found:
    /// `greedy[i]` is the target's greedy token after `run[..=i]`, and the first `accepted`
    /// proposed tokens were accepted. Speculators that learn from the target's rows (lookahead's
    /// Jacobi guesses and n-gram pool) use it; the default ignores it.
    fn observe(&mut self, run: &[u32], greedy: &[u32], accepted: usize) {
        let _ = (run, greedy, accepted);
    }
}

/// Which speculator, as `--speculate` spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecKind {
    /// `prompt-lookup[:K]`.
    PromptLookup { k: usize },
    /// `draft:PATH[:K]`.
    Draft { path: PathBuf, k: usize },
    /// `lookahead[:W,N,G]`: a window of W Jacobi guesses, N-grams, at most G per first token.
    Lookahead {
        window: usize,
        ngram: usize,
        cap: usize,
    },
}

impl SpecKind {
    /// Default K of `prompt-lookup` (see docs/measurements/speculation.md).
    pub const DEFAULT_LOOKUP_K: usize = 4;
    /// Default K of `draft`.
    pub const DEFAULT_DRAFT_K: usize = 4;
    /// Largest K accepted (a verification step runs K + 1 rows).
    pub const MAX_K: usize = 64;
    /// Default `lookahead` W, N, G.
    pub const DEFAULT_LOOKAHEAD: (usize, usize, usize) = (4, 3, 8);

    /// Parses `prompt-lookup[:K]` or `draft:PATH[:K]` (a PATH ending in `:N` needs `:K` after it).
    pub fn parse(spec: &str) -> Result<SpecKind, SpeculateError> {
        let bad = |reason: String| SpeculateError::Parse {
            spec: spec.to_owned(),
            reason,
        };
        let (name, arg) = spec.split_once(':').unwrap_or((spec, ""));
        match name {
            "prompt-lookup" => Ok(SpecKind::PromptLookup {
                k: parse_k(arg, Self::DEFAULT_LOOKUP_K).map_err(bad)?,
            }),
            "lookahead" => {
                let (window, ngram, cap) = parse_lookahead(arg).map_err(bad)?;
                Ok(SpecKind::Lookahead { window, ngram, cap })
            }
            "draft" if !arg.is_empty() => {
                let (path, k) = match arg.rsplit_once(':') {
                    Some((path, k)) if k.parse::<usize>().is_ok() => (path, k),
                    _ => (arg, ""),
                };
                Ok(SpecKind::Draft {
                    path: PathBuf::from(path),
                    k: parse_k(k, Self::DEFAULT_DRAFT_K).map_err(bad)?,
                })
            }
            "draft" => Err(bad("draft needs a model: draft:PATH[:K]".into())),
            other => Err(bad(format!(
                "unknown speculator `{other}` (expected prompt-lookup[:K], lookahead[:W,N,G] or \
                 draft:PATH[:K])"
            ))),
        }
    }

    /// Tokens proposed per step at most.
    pub fn k(&self) -> usize {
        match *self {
            SpecKind::PromptLookup { k } | SpecKind::Draft { k, .. } => k,
            SpecKind::Lookahead { window, ngram, .. } => window.max(ngram - 1),
        }
    }

    /// The AR variant a verification step wants: K + 1 rows (the next token and K proposed).
    pub fn verify_ar(&self) -> usize {
        self.k() + 1
    }

    /// `ar` with [`verify_ar`](Self::verify_ar) added (sorted, without repeats): the default
    /// variants when speculation asks for none of its own.
    pub fn with_verify_ar(&self, mut ar: Vec<usize>) -> Vec<usize> {
        ar.push(self.verify_ar());
        ar.sort_unstable();
        ar.dedup();
        ar
    }
}

/// `W,N,G` of `lookahead` (the defaults when empty): W and N - 1 from 1 to [`SpecKind::MAX_K`],
/// G from 1 to 1024.
fn parse_lookahead(arg: &str) -> Result<(usize, usize, usize), String> {
    if arg.is_empty() {
        return Ok(SpecKind::DEFAULT_LOOKAHEAD);
    }
    let nums: Vec<usize> = arg
        .split(',')
        .map(|v| v.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("expected W,N,G (three numbers), got `{arg}`"))?;
    match nums[..] {
        [w, n, g]
            if (1..=SpecKind::MAX_K).contains(&w)
                && (2..=SpecKind::MAX_K + 1).contains(&n)
                && (1..=1024).contains(&g) =>
        {
            Ok((w, n, g))
        }
        _ => Err(format!(
            "expected W,N,G with W from 1 to {max}, N from 2 to {}, G from 1 to 1024, got `{arg}`",
            SpecKind::MAX_K + 1,
            max = SpecKind::MAX_K
        )),
    }
}

/// K from `arg` (`default` when empty): 1 to [`SpecKind::MAX_K`].
fn parse_k(arg: &str, default: usize) -> Result<usize, String> {
    if arg.is_empty() {
        return Ok(default);
    }
    match arg.parse::<usize>() {
        Ok(k) if (1..=SpecKind::MAX_K).contains(&k) => Ok(k),
        _ => Err(format!(
            "K must be a number from 1 to {}, got `{arg}`",
            SpecKind::MAX_K
        )),
    }
}

/// A speculator and its counters: what a session generates with instead of plain decoding.
pub struct Speculation {
    speculator: Box<dyn Speculator>,
    stats: SpecStats,
    planner: planner::Planner,
    /// Verify every proposed token that fits, not the planner's choice.
    verify_all: bool,
}

impl std::fmt::Debug for Speculation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("speculator", &self.speculator.name())
            .field("stats", &self.stats)
            .finish()
    }
}

/// What the generation loop does after one step.
enum Next {
    /// Go on; `Some(token)` is the next token, already chosen by the step.
    Go(Option<u32>),
    Stop(StopReason),
}

impl Speculation {
    /// Speculative decoding with `speculator`.
    pub fn new(speculator: Box<dyn Speculator>) -> Speculation {
        Speculation {
            speculator,
            stats: SpecStats::default(),
            planner: planner::Planner::default(),
            verify_all: false,
        }
    }

    /// Verifies every proposed token (that fits a compiled variant) instead of the number the
    /// planner expects to be fastest: for backends where a wide step costs about a narrow one,
    /// and for tests.
    pub fn verifying_all(mut self) -> Speculation {
        self.verify_all = true;
        self
    }

    /// The speculator's spelling.
    pub fn name(&self) -> String {
        self.speculator.name()
    }

    /// Counters since construction.
    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    /// [`Session::generate`] with speculative decoding: same arguments, same result (with greedy
    /// sampling, the same tokens), fewer target steps when proposals are accepted.
    pub fn generate<B: Backend>(
        &mut self,
        session: &mut Session<B>,
        codec: &dyn TextCodec,
        prompt: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, SpeculateError> {
        options.check().map_err(during("the generation options"))?;
        if options.constraint.is_some() {
            return Err(during("the generation options")(SessionError::Input(
                "constrained output (a schema, regex or grammar) is not combined with speculative \
                 decoding"
                    .into(),
            )));
        }
        let mut sampler = Sampler::new(options.sampler)
            .map_err(SessionError::from)
            .map_err(during("the sampler options"))?;
        let prompt_tokens = session
            .start_generation(codec, prompt)
            .map_err(during("starting"))?;
        let mut out = TextOutput::new(codec, options, session.tokens().last().copied(), on_text);
        let mut chosen = None;
        let stop = loop {
            if let Some(s) = out.stop_before_first() {
                break s;
            }
            let next = match chosen.take() {
                Some(t) => t,
                None => session.sample(&mut sampler).map_err(during("sampling"))?,
            };
            if codec.is_stop(next) {
                break StopReason::EndOfText;
            }
            if let Some(s) = out.push(next).or_else(|| session.stop_before_decode(&out)) {
                break s;
            }
            match self.step(session, &mut out, next, &mut sampler)? {
                Next::Go(t) => chosen = t,
                Next::Stop(s) => break s,
            }
        };
        Ok(out.finish(prompt_tokens, stop))
    }

    /// Runs `next` into the cache, with as many proposed tokens after it as are accepted.
    fn step<B: Backend>(
        &mut self,
        session: &mut Session<B>,
        out: &mut TextOutput<'_>,
        next: u32,
        sampler: &mut Sampler,
    ) -> Result<Next, SpeculateError> {
        let started = Instant::now();
        // Tokens emitted after `next` stay below the budget, so the last one is never cached
        // (as plain decoding leaves it).
        let budget = out.budget_left() - 1;
        let mut history = session.tokens().to_vec();
        history.push(next);
        let want = self.speculator.max_proposal().min(budget);
        let mut proposal = match want {
            0 => Proposal::default(),
            _ => self.speculator.propose(&history, want)?,
        };
        proposal.tokens.truncate(want);
        let (class, available) = (proposal.class, proposal.tokens.len());
        let variant = |n| session.verify_variant(n);
        let k = match self.verify_all {
            true => (1..=available)
                .rev()
                .find(|&k| variant(1 + k).is_some_and(|ar| ar > k)),
            false => Some(self.planner.choose(class, available, variant)),
        };
        let k = k.unwrap_or(0);
        proposal.tokens.truncate(k);
        let propose_seconds = started.elapsed().as_secs_f64();
        self.stats.propose_seconds += propose_seconds;
        let ar = match session.verify_variant(1 + k) {
            Some(ar) if k > 0 => ar,
            _ => {
                session
                    .decode(next)
                    .map_err(during("a plain decode step"))?;
                let seconds = started.elapsed().as_secs_f64() - propose_seconds;
                self.stats.plain_step(seconds);
                self.planner.step(1, seconds);
                return Ok(Next::Go(None));
            }
        };
        let (next, committed, accepted) =
            self.verify(session, out, next, &proposal, sampler, ar)?;
        let seconds = started.elapsed().as_secs_f64();
        session.record_decode(committed, seconds);
        self.stats.verify_step(ar, seconds - propose_seconds);
        self.planner.step(ar, seconds - propose_seconds);
        self.planner.outcome(class, k, accepted);
        Ok(next)
    }

    /// Verifies `next` and the proposal in one AR-`ar` step, emits the accepted tokens and commits
    /// them; returns what comes next, the rows committed and the proposed tokens accepted.
    fn verify<B: Backend>(
        &mut self,
        session: &mut Session<B>,
        out: &mut TextOutput<'_>,
        next: u32,
        proposal: &Proposal,
        sampler: &mut Sampler,
        ar: usize,
    ) -> Result<(Next, usize, usize), SpeculateError> {
        let mut run = Vec::with_capacity(1 + proposal.tokens.len());
        run.push(next);
        run.extend_from_slice(&proposal.tokens);
        let copied = |s: &Session<B>| s.cache().counters().bytes_copied;
        let before_plan = copied(session);
        // Row i follows the cached tokens and run[..=i]: the penalties see what plain decoding sees.
        let keep = sampler.history_len();
        let mut history = crate::sampler::recent(&[session.tokens(), &run[..1]], keep);
        let logits = session
            .verify(&run)
            .map_err(during("a verification step"))?;
        let vocab = logits.len() / run.len();
        // Each row is sampled as plain decoding samples it; a proposed token is accepted when the
        // sample is that token, and the first sample that differs is the next token (so every
        // emitted token is a sample of the target's distribution given the text before it).
        let (mut accepted, mut differing) = (0, None);
        for (row, &token) in logits.chunks_exact(vocab).zip(&proposal.tokens) {
            let sampled = (sampler.sample_after(row, &history))
                .map_err(SessionError::from)
                .map_err(during("sampling"))?;
            if sampled != token {
                differing = Some(sampled);
                break;
            }
            history.push(token);
            accepted += 1;
        }
        let greedy: Vec<u32> = logits
            .chunks_exact(vocab)
            .map(|row| model::ops::argmax(row) as u32)
            .collect();
        self.speculator.observe(&run, &greedy, accepted);
        let before_commit = copied(session);
        // Emit the accepted tokens as plain decoding would sample them.
        let mut result = Next::Go(differing);
        let mut keep = 1 + accepted;
        for (i, &token) in proposal.tokens[..accepted].iter().enumerate() {
            if out.codec().is_stop(token) {
                (keep, result) = (1 + i, Next::Stop(StopReason::EndOfText));
                break;
            }
            if let Some(s) = out.push(token) {
                (keep, result) = (1 + i, Next::Stop(s));
                break;
            }
        }
        session
            .accept(&run[..keep])
            .map_err(during("committing accepted tokens"))?;
        let copies = [before_commit - before_plan, copied(session) - before_commit];
        self.stats
            .outcome(proposal.tokens.len(), accepted, keep, ar, copies);
        Ok((result, keep, accepted))
    }
}
