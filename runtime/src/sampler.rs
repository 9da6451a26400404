//! Token sampling: greedy, or temperature then top-k, min-p and top-p (nucleus), in that order,
//! reproducible from a seed.

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerOptions {
    /// 0.0 means greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability adds up to `top_p`
    /// (1.0 or more disables it).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 disables it).
    pub top_k: usize,
    /// Keep the tokens at least `min_p` times as likely as the most likely one (0 disables it).
    pub min_p: f32,
    /// Repetition penalty over the last `penalty_last_n` tokens (1.0 disables it): a positive
    /// logit of a token seen there is divided by it, a negative one multiplied.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the last `penalty_last_n` tokens.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it occurs in the last `penalty_last_n`.
    pub frequency_penalty: f32,
    /// How many of the latest tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Seed of the random number generator.
    pub seed: u64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.0,
            top_p: 0.9,
            top_k: 0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 42,
        }
    }
}

/// Errors of sampler options.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1), got {0}")]
    MinP(f32),
    #[error("repeat_penalty must be a finite number > 0, got {0}")]
    RepeatPenalty(f32),
    #[error("presence_penalty and frequency_penalty must be finite, got {0}")]
    Penalty(f32),
    #[error("penalty_last_n must be at most {max}, got {0}", max = MAX_PENALTY_LAST_N)]
    PenaltyLastN(usize),
    #[error("cannot sample from empty logits")]
    Empty,
}

/// The most tokens the penalties look back over.
pub const MAX_PENALTY_LAST_N: usize = 1 << 20;

/// A sampler with its own random state.
#[derive(Debug, Clone)]
pub struct Sampler {
    options: SamplerOptions,
    state: u64,
    probs: Vec<(f32, u32)>,
    /// The penalized logits (scratch of [`Sampler::sample_after`]).
    penalized: Vec<f32>,
}

impl Sampler {
    /// Validates the options and seeds the generator.
    pub fn new(options: SamplerOptions) -> Result<Sampler, SamplerError> {
        if !(options.temperature.is_finite() && options.temperature >= 0.0) {
            return Err(SamplerError::Temperature(options.temperature));
        }
        if !(options.top_p > 0.0 && options.top_p <= 1.0) {
            return Err(SamplerError::TopP(options.top_p));
        }
        if !(0.0..1.0).contains(&options.min_p) {
            return Err(SamplerError::MinP(options.min_p));
        }
        if !(options.repeat_penalty.is_finite() && options.repeat_penalty > 0.0) {
            return Err(SamplerError::RepeatPenalty(options.repeat_penalty));
        }
        for p in [options.presence_penalty, options.frequency_penalty] {
            if !p.is_finite() {
                return Err(SamplerError::Penalty(p));
            }
        }
        if options.penalty_last_n > MAX_PENALTY_LAST_N {
            return Err(SamplerError::PenaltyLastN(options.penalty_last_n));
        }
        Ok(Sampler {
            options,
            // xorshift must not start at zero
            state: options.seed.max(1),
            probs: Vec::new(),
            penalized: Vec::new(),
        })
    }

    /// The options in use.
    pub fn options(&self) -> &SamplerOptions {
        &self.options
    }

    fn next_f32(&mut self) -> f32 {
        // xorshift64*: 24 random bits mapped to [0, 1)
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 40) as f32 / (1u64 << 24) as f32
    }

    /// How many of the latest tokens [`Sampler::sample_after`] reads: `penalty_last_n`, or 0 when
    /// no penalty is set. A caller assembling a history needs no more ([`recent`]).
    pub fn history_len(&self) -> usize {
        let o = &self.options;
        let off =
            o.repeat_penalty == 1.0 && o.presence_penalty == 0.0 && o.frequency_penalty == 0.0;
        if off { 0 } else { o.penalty_last_n }
    }

    /// Chooses the token that follows `history` (every token before it): the penalties apply to
    /// the last `penalty_last_n` of them, then [`Sampler::sample`]. Without penalties it is
    /// `sample`.
    pub fn sample_after(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplerError> {
        let o = self.options;
        if self.history_len() == 0 {
            return self.sample(logits);
        }
        let mut penalized = std::mem::take(&mut self.penalized);
        penalized.clear();
        penalized.extend_from_slice(logits);
        let recent = &history[history.len().saturating_sub(o.penalty_last_n)..];
        penalize(&mut penalized, recent, &o);
        let token = self.sample(&penalized);
        self.penalized = penalized;
        token
    }

    /// Chooses the next token. Greedy picks the first maximum; NaN logits are never chosen.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::Empty);
        }
        if self.options.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        let t = self.options.temperature;
        let max = logits
            .iter()
            .copied()
            .filter(|x| !x.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        let mut sum = 0.0f32;
        for (i, &l) in logits.iter().enumerate() {
            let p = if l.is_nan() {
                0.0
            } else {
                ((l - max) / t).exp()
            };
            sum += p;
            self.probs.push((p, i as u32));
        }
        if sum.is_nan() || sum <= 0.0 {
            return Ok(argmax(logits));
        }
        for p in &mut self.probs {
            p.0 /= sum;
        }
        let r = self.next_f32();
        let o = self.options;
        if o.top_p >= 1.0 && o.top_k == 0 && o.min_p == 0.0 {
            return Ok(pick(&self.probs, r));
        }
        let kept = truncate(&mut self.probs, o.top_k, o.min_p, o.top_p);
        let total: f32 = kept.iter().map(|p| p.0).sum();
        Ok(pick(kept, r * total))
    }
}

/// The last `n` tokens of `parts` joined (a history kept in pieces: the cached tokens, then the
/// ones generated since).
pub fn recent(parts: &[&[u32]], n: usize) -> Vec<u32> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut skip = total - n.min(total);
    let mut out = Vec::with_capacity(total - skip);
    for part in parts {
        let from = skip.min(part.len());
        skip -= from;
        out.extend_from_slice(&part[from..]);
    }
    out
}

/// Applies the repetition, presence and frequency penalties of `o` for the tokens of `recent` to
/// `logits` (ids beyond the logits are ignored).
pub fn penalize(logits: &mut [f32], recent: &[u32], o: &SamplerOptions) {
    let mut seen: Vec<u32> = recent
        .iter()
        .copied()
        .filter(|&t| (t as usize) < logits.len())
        .collect();
    seen.sort_unstable();
    for run in seen.chunk_by(|a, b| a == b) {
        let l = &mut logits[run[0] as usize];
        *l = if *l > 0.0 {
            *l / o.repeat_penalty
        } else {
            *l * o.repeat_penalty
        };
        *l -= o.presence_penalty + o.frequency_penalty * run.len() as f32;
    }
}

/// The tokens `probs` keeps, most likely first (ties to the lower id): the `top_k` most likely
/// (0: all), of those the ones at least `min_p` times the most likely, of those the smallest run
/// whose probability adds up to `top_p`.
pub fn truncate(probs: &mut [(f32, u32)], top_k: usize, min_p: f32, top_p: f32) -> &[(f32, u32)] {
    probs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut last = probs.len();
    if top_k > 0 {
        last = last.min(top_k);
    }
    let floor = probs.first().map_or(0.0, |p| p.0) * min_p;
    last = probs[..last]
        .iter()
        .take_while(|p| p.0 >= floor)
        .count()
        .max(1);
    if top_p < 1.0 {
        let mut cumulative = 0.0;
        for (i, p) in probs[..last].iter().enumerate() {
            cumulative += p.0;
            if cumulative >= top_p {
                last = i + 1;
                break;
            }
        }
    }
    &probs[..last]
}

/// The `k` most likely tokens with their log-probabilities (a log-softmax in f64), most likely first;
/// ties go to the lower id, NaN logits are never chosen. Beam search ranks its candidates with it.
pub fn top_logprobs(logits: &[f32], k: usize) -> Result<Vec<(u32, f64)>, SamplerError> {
    if logits.is_empty() {
        return Err(SamplerError::Empty);
    }
    let max = logits
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    let log_z = max + sum.ln();
    let mut ranked: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| (i as u32, l as f64 - log_z))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(k);
    Ok(ranked)
}

/// A hypothesis' score under a length penalty: `logprob / len^alpha` (alpha 0: the plain sum; larger
/// alphas favour longer hypotheses, since log-probabilities are negative).
pub fn length_penalized(logprob: f64, len: usize, alpha: f32) -> f64 {
    logprob / (len.max(1) as f64).powf(alpha as f64)
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

fn pick(probs: &[(f32, u32)], target: f32) -> u32 {
    let mut cumulative = 0.0;
    for p in probs {
        cumulative += p.0;
        if target < cumulative {
            return p.1;
        }
    }
    probs.last().map_or(0, |p| p.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_skips_nan() {
        let mut s = Sampler::new(SamplerOptions::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NAN, 0.5, 0.2]).unwrap(), 1);
        assert_eq!(s.sample(&[]), Err(SamplerError::Empty));
    }

    #[test]
    fn sampling_is_reproducible_and_follows_the_distribution() {
        let opts = SamplerOptions {
            temperature: 1.0,
            top_p: 1.0,
            seed: 7,
            ..Default::default()
        };
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draw = |opts| {
            let mut s = Sampler::new(opts).unwrap();
            (0..4000)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        let a = draw(opts);
        assert_eq!(a, draw(opts));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "token 1 drawn {ones}");
        assert!(!a.contains(&2), "a -inf logit was drawn");
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // Probabilities 0.6, 0.3, 0.1: top_p 0.8 keeps only the first two.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let mut s = Sampler::new(SamplerOptions {
            temperature: 1.0,
            top_p: 0.8,
            seed: 3,
            ..Default::default()
        })
        .unwrap();
        let draws: Vec<u32> = (0..3000).map(|_| s.sample(&logits).unwrap()).collect();
        assert!(!draws.contains(&2));
        assert!(draws.contains(&1));
    }

    #[test]
    fn bad_options_are_refused() {
        let bad_t = SamplerOptions {
            temperature: -1.0,
            ..Default::default()
        };
        assert_eq!(
            Sampler::new(bad_t).unwrap_err(),
            SamplerError::Temperature(-1.0)
        );
        let bad_p = SamplerOptions {
            top_p: 0.0,
            ..Default::default()
        };
        assert_eq!(Sampler::new(bad_p).unwrap_err(), SamplerError::TopP(0.0));
        for min_p in [1.0, -0.1, f32::NAN] {
            let bad = SamplerOptions {
                min_p,
                ..Default::default()
            };
            assert!(
                matches!(Sampler::new(bad), Err(SamplerError::MinP(_))),
                "{min_p}"
            );
        }
    }

    /// Each stage against its direct computation on fixed probabilities 0.4, 0.3, 0.2, 0.06, 0.04.
    #[test]
    fn top_k_min_p_and_top_p_keep_what_their_definitions_keep() {
        let probs = [(0.2, 2), (0.4, 0), (0.04, 4), (0.3, 1), (0.06, 3)];
        let kept = |k, min_p, top_p| {
            let mut p = probs.to_vec();
            truncate(&mut p, k, min_p, top_p)
                .iter()
                .map(|p| p.1)
                .collect::<Vec<u32>>()
        };
        assert_eq!(kept(0, 0.0, 1.0), vec![0, 1, 2, 3, 4]);
        assert_eq!(kept(2, 0.0, 1.0), vec![0, 1]);
        assert_eq!(kept(1, 0.0, 1.0), vec![0]);
        // min_p 0.5: at least 0.2 (half of 0.4) stays.
        assert_eq!(kept(0, 0.5, 1.0), vec![0, 1, 2]);
        assert_eq!(kept(0, 0.76, 1.0), vec![0]);
        // top_p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.2 joins.
        assert_eq!(kept(0, 0.0, 0.75), vec![0, 1, 2]);
        // The stages compose: top-k 4, then min-p 0.1 (>= 0.04: drops id 4), then top-p 0.95.
        assert_eq!(kept(4, 0.1, 0.95), vec![0, 1, 2, 3]);
        assert_eq!(kept(4, 0.2, 0.95), vec![0, 1, 2]);
    }

    #[test]
    fn recent_keeps_the_last_n_tokens_of_the_pieces() {
        assert_eq!(recent(&[&[1, 2, 3], &[4, 5]], 3), vec![3, 4, 5]);
        assert_eq!(recent(&[&[1, 2, 3], &[4, 5]], 1), vec![5]);
        assert_eq!(recent(&[&[1, 2], &[3]], 9), vec![1, 2, 3]);
        assert_eq!(recent(&[&[1, 2], &[3]], 0), Vec::<u32>::new());
    }

    /// The penalties against their definitions on fixed logits.
    #[test]
    fn penalties_follow_their_definitions() {
        let o = SamplerOptions {
            repeat_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut logits = [4.0f32, -1.0, 3.0, 1.0];
        // Token 0 twice (4 / 2, less 0.5 once and 0.25 twice), token 1 once (-1 x 2, less 0.5
        // and 0.25), token 9 (out of range) ignored; 2 and 3 unseen.
        penalize(&mut logits, &[0, 1, 0, 9], &o);
        assert_eq!(logits, [4.0 / 2.0 - 0.5 - 0.5, -2.0 - 0.5 - 0.25, 3.0, 1.0]);
        // Greedy after the history: 0 would win (4.0), but its penalty leaves 2 the largest.
        let mut s = Sampler::new(o).unwrap();
        assert_eq!(s.sample(&[4.0, -1.0, 3.0, 1.0]).unwrap(), 0);
        assert_eq!(
            s.sample_after(&[4.0, -1.0, 3.0, 1.0], &[0, 1, 0]).unwrap(),
            2
        );
        // Only the last `penalty_last_n` tokens count.
        let mut s = Sampler::new(SamplerOptions {
            penalty_last_n: 1,
            ..o
        })
        .unwrap();
        assert_eq!(
            s.sample_after(&[4.0, -1.0, 3.0, 1.0], &[0, 0, 1]).unwrap(),
            0
        );
        let bad = SamplerOptions {
            repeat_penalty: 0.0,
            ..Default::default()
        };
        assert_eq!(
            Sampler::new(bad).unwrap_err(),
            SamplerError::RepeatPenalty(0.0)
        );
    }

    /// Sampling with top-k draws only the kept tokens, in proportion to their probabilities.
    #[test]
    fn top_k_sampling_follows_the_renormalized_distribution() {
        let logits = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let mut s = Sampler::new(SamplerOptions {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 2,
            seed: 11,
            ..Default::default()
        })
        .unwrap();
        let draws: Vec<u32> = (0..6000).map(|_| s.sample(&logits).unwrap()).collect();
        assert!(draws.iter().all(|&t| t < 2), "a token outside the top 2");
        let zeros = draws.iter().filter(|&&t| t == 0).count() as f64 / draws.len() as f64;
        assert!((zeros - 4.0 / 7.0).abs() < 0.03, "token 0 drawn {zeros}");
        let greedy_like = SamplerOptions {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        let mut one = Sampler::new(greedy_like).unwrap();
        assert!((0..100).all(|_| one.sample(&logits).unwrap() == 0));
    }

    #[test]
    fn top_logprobs_rank_a_log_softmax_and_the_penalty_divides_by_len_to_the_alpha() {
        let logits = [0.0f32, 3.0f32.ln(), f32::NAN, 3.0f32.ln()];
        let top = top_logprobs(&logits, 3).unwrap();
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 0]);
        assert!((top[0].1 - (3.0f64 / 7.0).ln()).abs() < 1e-6, "{top:?}");
        assert!((top[2].1 - (1.0f64 / 7.0).ln()).abs() < 1e-6, "{top:?}");
        assert_eq!(top_logprobs(&[], 2), Err(SamplerError::Empty));
        assert_eq!(length_penalized(-6.0, 4, 0.0), -6.0);
        assert_eq!(length_penalized(-6.0, 4, 1.0), -1.5);
        assert_eq!(length_penalized(-6.0, 4, 0.5), -3.0);
    }
}
