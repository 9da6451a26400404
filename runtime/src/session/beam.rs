//! Beam search and parallel sampling over ONE cache: the prompt is prefilled once and its rows are
//! shared by every beam (or sample); each beam's own rows live in the same window and a per-row mask
//! shows each beam only its own (see [`kv_manager::beam`]).
//!
//! - **Steps.** All live beams step together in one AR-n step, n the smallest AR variant with room
//!   for them (query row q = beam q; spare rows are padding). When no variant has room (e.g. a model
//!   compiled with `ar: [1, 32]` and 64 beams) the beams step one at a time on the smallest variant,
//!   each with its own mask: the same results, n graph runs per token instead of one.
//! - **Beam search** ([`Session::beam_search`]): every step ranks, for each live beam, its 2B most
//!   likely next tokens by the beam's summed log-probability; going down that list, a stop token
//!   ranked among the first B ends its hypothesis (scored `logprob / len^alpha`, len counting the stop
//!   token, [`crate::sampler::length_penalized`]), any other token extends a beam, until B beams are
//!   live. The cache is then reordered (`beam_idx`: rows remapped, never copied). The search ends when
//!   no beam is live, at `max_tokens`, when the context cannot hold another step, or early: once B
//!   hypotheses have finished and the best live beam's score is no better than the worst finished one.
//!   The result is the best B hypotheses, finished or not, best first.
//! - **Parallel sampling** ([`Session::sample_n`]): N samples share the prompt's prefill; sample i
//!   uses its own sampler seeded `seed + i`, so it is exactly what `generate` with that seed gives
//!   (the reference backend's logits per beam are bit-identical to a cache of its own; tested).
//!
//! After either call the session holds the prompt again (every beam row is given back), with the
//! prompt's last logits.

use super::{Session, SessionError, StopReason, TextCodec, Utf8Stream};
use crate::backend::Backend;
use crate::sampler::{Sampler, SamplerOptions, length_penalized, top_logprobs};
use kv_manager::beam::MAX_BEAMS;
use kv_manager::{BeamCounters, BeamError, BeamKv};

/// Options of a beam search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamOptions {
    /// B: hypotheses kept (1..=256).
    pub beams: usize,
    /// alpha of the length penalty `logprob / len^alpha` (finite; 0 ranks by the plain sum).
    pub length_penalty: f32,
    /// Tokens generated per hypothesis at most (at least 1).
    pub max_tokens: usize,
}

/// One hypothesis of a beam search.
#[derive(Debug, Clone, PartialEq)]
pub struct Beam {
    /// Generated tokens (without the stop token).
    pub tokens: Vec<u32>,
    /// Summed log-probability of the tokens (and of the stop token when `finished`).
    pub logprob: f64,
    /// `logprob / len^alpha`, len including the stop token.
    pub score: f64,
    /// True when the hypothesis ended with a stop token.
    pub finished: bool,
}

/// What the beams cost in the cache, at the peak of the search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeamMemory {
    /// Prompt tokens (stored once).
    pub prompt_rows: usize,
    /// The most rows the beams held at once (prompt once, each live row once).
    pub peak_rows_held: usize,
    /// The most rows B independent caches would have held at once.
    pub peak_rows_independent: usize,
    /// The cache's length at its peak (held rows plus freed rows not yet reused).
    pub peak_cache_len: usize,
    /// Graph runs, and whether some step ran its beams one at a time (no AR variant had room).
    pub steps: usize,
    pub one_at_a_time: bool,
    pub counters: BeamCounters,
}

/// The result of a beam search.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamSearch {
    /// The best hypotheses, best score first.
    pub beams: Vec<Beam>,
    pub stop: StopReason,
    pub memory: BeamMemory,
}

/// The result of parallel sampling.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    /// Sample i's tokens (without the stop token) and why it stopped.
    pub samples: Vec<(Vec<u32>, StopReason)>,
    pub memory: BeamMemory,
}

/// A live hypothesis: its tokens (the last one not yet in the cache) and summed log-probability.
#[derive(Debug, Clone)]
struct Live {
    tokens: Vec<u32>,
    logprob: f64,
}

impl<B: Backend> Session<B> {
    /// Beam search after `prompt` (module docs). The prompt is prefilled after what the cache holds.
    pub fn beam_search(
        &mut self,
        prompt: &[u32],
        options: &BeamOptions,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<BeamSearch, SessionError> {
        check_count(options.beams)?;
        if !options.length_penalty.is_finite() || options.max_tokens == 0 {
            return Err(SessionError::Input(format!(
                "beam search needs a finite length penalty and max_tokens >= 1, got {} and {}",
                options.length_penalty, options.max_tokens
            )));
        }
        self.prefill(prompt)?;
        let first = self.last_logits.clone();
        let b = options.beams;
        let mut kv = BeamKv::new(&self.cache, b)?;
        let mut memory = BeamMemory::default();
        let mut parents = vec![(
            Live {
                tokens: Vec::new(),
                logprob: 0.0,
            },
            first.clone(),
        )];
        let mut finished: Vec<Beam> = Vec::new();
        let stop = loop {
            let live = select(&parents, b, options.length_penalty, is_stop, &mut finished)?;
            let Some(best) = live.iter().map(|(_, l)| score(l, options)).reduce(f64::max) else {
                break StopReason::EndOfText;
            };
            let worst_finished = finished.iter().map(|f| f.score).reduce(f64::min);
            if finished.len() >= b && worst_finished.is_some_and(|w| best <= w) {
                break StopReason::EndOfText;
            }
            if live[0].1.tokens.len() >= options.max_tokens || !self.beams_fit(live.len()) {
                let reason = if live[0].1.tokens.len() >= options.max_tokens {
                    StopReason::MaxTokens
                } else {
                    StopReason::ContextFull
                };
                finished.extend(live.into_iter().map(|(_, l)| unfinished(l, options)));
                break reason;
            }
            let idx: Vec<usize> = live.iter().map(|(p, _)| *p).collect();
            kv.reorder(&mut self.cache, &idx)?;
            let feed: Vec<u32> = live
                .iter()
                .map(|(_, l)| *l.tokens.last().expect("one"))
                .collect();
            let logits = self.beam_step(&mut kv, &feed, &mut memory)?;
            parents = live.into_iter().map(|(_, l)| l).zip(logits).collect();
        };
        self.end_beams(kv, first, &mut memory)?;
        finished.sort_by(|x, y| y.score.total_cmp(&x.score));
        finished.truncate(b);
        Ok(BeamSearch {
            beams: finished,
            stop,
            memory,
        })
    }

    /// `n` samples after `prompt` sharing its prefill; sample i samples with seed `sampler.seed + i`.
    pub fn sample_n(
        &mut self,
        prompt: &[u32],
        n: usize,
        max_tokens: usize,
        sampler: SamplerOptions,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Samples, SessionError> {
        check_count(n)?;
        let mut samplers = (0..n)
            .map(|i| {
                Sampler::new(SamplerOptions {
                    seed: sampler.seed.wrapping_add(i as u64),
                    ..sampler
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.prefill(prompt)?;
        let first = self.last_logits.clone();
        let before = self.tokens.clone();
        let mut kv = BeamKv::new(&self.cache, n)?;
        let mut memory = BeamMemory::default();
        let mut tokens = vec![Vec::new(); n];
        let mut stops = vec![None; n];
        let mut logits = vec![first.clone(); n];
        loop {
            // Each live sample draws its next token from its own logits, as `generate` does.
            let mut live = Vec::new();
            for i in 0..n {
                if stops[i].is_some() {
                    continue;
                }
                let keep = samplers[i].history_len();
                let history = crate::sampler::recent(&[&before, &tokens[i]], keep);
                let next = samplers[i].sample_after(&logits[i], &history)?;
                if is_stop(next) {
                    stops[i] = Some(StopReason::EndOfText);
                    continue;
                }
                tokens[i].push(next);
                if tokens[i].len() >= max_tokens {
                    stops[i] = Some(StopReason::MaxTokens);
                    continue;
                }
                live.push(i);
            }
            if live.is_empty() {
                break;
            }
            if !self.beams_fit(live.len()) {
                live.iter()
                    .for_each(|&i| stops[i] = Some(StopReason::ContextFull));
                break;
            }
            let feed: Vec<u32> = live
                .iter()
                .map(|&i| *tokens[i].last().expect("one"))
                .collect();
            let rows = self.beam_step_of(&mut kv, &live, &feed, &mut memory)?;
            for (&i, row) in live.iter().zip(rows) {
                logits[i] = row;
            }
        }
        self.end_beams(kv, first, &mut memory)?;
        let samples = tokens
            .into_iter()
            .zip(stops)
            .map(|(t, s)| (t, s.unwrap_or(StopReason::MaxTokens)))
            .collect();
        Ok(Samples { samples, memory })
    }

    /// True when the cache can take one more step of `beams` beams (batched, or one at a time).
    fn beams_fit(&self, beams: usize) -> bool {
        let g = &self.cache.spec().geometry;
        let need = match self.batch_variant(beams) {
            Some(ar) => ar,
            None => beams - 1 + g.min_ar(),
        };
        self.cache.len() + need <= g.capacity()
    }

    /// The smallest AR variant with a query row for each of `beams` beams.
    fn batch_variant(&self, beams: usize) -> Option<usize> {
        let g = &self.cache.spec().geometry;
        g.ar_variants.iter().copied().filter(|&n| n >= beams).min()
    }

    /// Steps beams `0..feed.len()` (beam q fed `feed[q]`); returns each beam's logits.
    fn beam_step(
        &mut self,
        kv: &mut BeamKv,
        feed: &[u32],
        memory: &mut BeamMemory,
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        let beams: Vec<usize> = (0..feed.len()).collect();
        self.beam_step_of(kv, &beams, feed, memory)
    }

    /// Steps `beams` (beam `beams[q]` fed `feed[q]`): one batched step when a variant has room,
    /// else one step per beam. Returns the logits of each, in order.
    fn beam_step_of(
        &mut self,
        kv: &mut BeamKv,
        beams: &[usize],
        feed: &[u32],
        memory: &mut BeamMemory,
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        let groups: Vec<(usize, std::ops::Range<usize>)> = match self.batch_variant(beams.len()) {
            Some(ar) => vec![(ar, 0..beams.len())],
            None => {
                let ar = self.cache.spec().geometry.min_ar();
                (0..beams.len()).map(|q| (ar, q..q + 1)).collect()
            }
        };
        memory.one_at_a_time |= groups.len() > 1;
        let mut out = Vec::with_capacity(beams.len());
        for (ar, range) in groups {
            let slot = self.slot_for(ar);
            let tokens = &feed[range.clone()];
            self.check_step(slot, tokens)?;
            kv.plan(&mut self.cache, ar, &beams[range])?;
            self.execute(slot, tokens, kv.pending_plan())?;
            kv.commit(&mut self.cache)?;
            let v = self.vocab;
            out.extend((0..tokens.len()).map(|q| self.logits[q * v..(q + 1) * v].to_vec()));
            memory.steps += 1;
        }
        memory.peak_rows_held = memory.peak_rows_held.max(kv.rows_held());
        memory.peak_rows_independent = memory.peak_rows_independent.max(kv.rows_independent());
        memory.peak_cache_len = memory.peak_cache_len.max(self.cache.len());
        Ok(out)
    }

    /// Gives every beam row back: the session holds the prompt and its last logits again.
    fn end_beams(
        &mut self,
        kv: BeamKv,
        prompt_logits: Vec<f32>,
        memory: &mut BeamMemory,
    ) -> Result<(), SessionError> {
        memory.prompt_rows = kv.prompt_len();
        memory.counters = *kv.counters();
        kv.finish(&mut self.cache)?;
        self.last_logits = prompt_logits;
        Ok(())
    }
}

/// The text of generated `tokens` after the token `prev` (the prompt's last).
pub fn decode_text(codec: &dyn TextCodec, prev: u32, tokens: &[u32]) -> String {
    let mut utf8 = Utf8Stream::default();
    let mut text = String::new();
    let mut prev = prev;
    for &t in tokens {
        text.push_str(&utf8.push(&codec.decode_piece(prev, t)));
        prev = t;
    }
    text.push_str(&utf8.finish());
    text
}

fn check_count(count: usize) -> Result<(), SessionError> {
    if count == 0 || count > MAX_BEAMS {
        return Err(BeamError::BeamCount { count }.into());
    }
    Ok(())
}

fn score(live: &Live, options: &BeamOptions) -> f64 {
    length_penalized(live.logprob, live.tokens.len(), options.length_penalty)
}

fn unfinished(live: Live, options: &BeamOptions) -> Beam {
    Beam {
        score: score(&live, options),
        logprob: live.logprob,
        tokens: live.tokens,
        finished: false,
    }
}

/// One beam-search selection (module docs): from each parent's logits, the next live beams as
/// (parent index, hypothesis); finished hypotheses go to `finished` (the best `b` kept).
fn select(
    parents: &[(Live, Vec<f32>)],
    b: usize,
    alpha: f32,
    is_stop: &dyn Fn(u32) -> bool,
    finished: &mut Vec<Beam>,
) -> Result<Vec<(usize, Live)>, SessionError> {
    let mut candidates = Vec::new();
    for (p, (live, logits)) in parents.iter().enumerate() {
        for (token, lp) in top_logprobs(logits, 2 * b)? {
            candidates.push((p, token, live.logprob + lp));
        }
    }
    candidates.sort_by(|x, y| y.2.total_cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
    let mut next = Vec::new();
    for (rank, (p, token, logprob)) in candidates.into_iter().enumerate() {
        let tokens = &parents[p].0.tokens;
        if is_stop(token) {
            if rank < b {
                finished.push(Beam {
                    tokens: tokens.clone(),
                    logprob,
                    score: length_penalized(logprob, tokens.len() + 1, alpha),
                    finished: true,
                });
            }
            continue;
        }
        let mut tokens = tokens.clone();
        tokens.push(token);
        next.push((p, Live { tokens, logprob }));
        if next.len() == b {
            break;
        }
    }
    finished.sort_by(|x, y| y.score.total_cmp(&x.score));
    finished.truncate(b);
    Ok(next)
}
