//! Beam search and parallel sampling on stories260K through the reference backend, against B
//! independent full caches: B sessions, each decoding its own beam, copied (saved and restored, row
//! for row) on every reorder. The shared cache must give the same beams for every strategy, batched or
//! one beam at a time, with bit-identical scores wherever the arithmetic is the same ([`same_beams`]).

use htpkv::sampler::{Sampler, SamplerOptions, length_penalized, top_logprobs};
use htpkv::session::{BOS, Beam, BeamOptions, EOS, StopReason};
use kv_manager::Strategy;
use model::llama2c::{Checkpoint, Tokenizer};
use ref_backend::CompiledModel;
use std::sync::Arc;
use test_support::files::ScratchDir;
use test_support::runtime::{STRATEGIES, session};

fn model() -> (Arc<Checkpoint>, Tokenizer) {
    let (ckpt, tok) = test_support::stories::stories260k_loaded();
    (Arc::new(ckpt), tok)
}

/// stories260K with u8 K/V and i8 weights at its full context, for the AR variants `ar`.
fn compile(ckpt: &Checkpoint, tok: &Tokenizer, ar: &[usize]) -> Arc<CompiledModel> {
    test_support::compile::compile_u8(ckpt, tok, ckpt.config.seq_len, ar)
}

fn is_stop(t: u32) -> bool {
    t == EOS || t == BOS
}

/// Beam search written out over B independent sessions (the rules of `htpkv::session::beam`, kept
/// separate from its code): each live beam decodes its last token in its own session; on a reorder,
/// every parent is saved and each new beam's session restored from its parent's file (a full copy).
fn independent_beam_search(
    model: &Arc<CompiledModel>,
    prompt: &[u32],
    b: usize,
    alpha: f32,
    max_tokens: usize,
) -> Vec<Beam> {
    // The saved parents, one file each, in a directory of this search's (tests run in parallel).
    let saved = ScratchDir::new("beams");
    let mut sessions: Vec<_> = (0..b)
        .map(|_| session(model, Strategy::SmartMask))
        .collect();
    for s in &mut sessions {
        s.prefill(prompt).unwrap();
    }
    // (parent session, tokens, logprob, logits of the parent's last token)
    let mut parents: Vec<(Vec<u32>, f64, Vec<f32>)> =
        vec![(Vec::new(), 0.0, sessions[0].last_logits().to_vec())];
    let mut finished: Vec<Beam> = Vec::new();
    loop {
        let mut candidates = Vec::new();
        for (p, (_, lp, logits)) in parents.iter().enumerate() {
            for (t, l) in top_logprobs(logits, 2 * b).unwrap() {
                candidates.push((lp + l, p, t));
            }
        }
        candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
        let mut live: Vec<(usize, Vec<u32>, f64)> = Vec::new();
        for (rank, &(lp, p, t)) in candidates.iter().enumerate() {
            let tokens = &parents[p].0;
            if is_stop(t) {
                if rank < b {
                    finished.push(Beam {
                        tokens: tokens.clone(),
                        logprob: lp,
                        score: length_penalized(lp, tokens.len() + 1, alpha),
                        finished: true,
                    });
                }
            } else if live.len() < b {
                live.push((p, [tokens.as_slice(), &[t]].concat(), lp));
            }
        }
        finished.sort_by(|x, y| y.score.total_cmp(&x.score));
        finished.truncate(b);
        let score = |(_, t, lp): &(usize, Vec<u32>, f64)| length_penalized(*lp, t.len(), alpha);
        let Some(best) = live.iter().map(score).reduce(f64::max) else {
            break;
        };
        let worst = finished.iter().map(|f| f.score).reduce(f64::min);
        if finished.len() >= b && worst.is_some_and(|w| best <= w) {
            break;
        }
        if live[0].1.len() >= max_tokens {
            for l in &live {
                finished.push(Beam {
                    tokens: l.1.clone(),
                    logprob: l.2,
                    score: score(l),
                    finished: false,
                });
            }
            break;
        }
        // Copy on reorder: save every parent, restore each new beam from its parent.
        for (p, s) in sessions.iter().enumerate().take(parents.len()) {
            s.save(&saved.join(p.to_string()), &[]).unwrap();
        }
        for (j, (p, _, _)) in live.iter().enumerate() {
            sessions[j].restore(&saved.join(p.to_string())).unwrap();
        }
        parents = live
            .into_iter()
            .enumerate()
            .map(|(j, (_, tokens, lp))| {
                let logits = sessions[j]
                    .decode(*tokens.last().unwrap())
                    .unwrap()
                    .to_vec();
                (tokens, lp, logits)
            })
            .collect();
    }
    finished.sort_by(|x, y| y.score.total_cmp(&x.score));
    finished.truncate(b);
    finished
}

/// The same hypotheses (tokens, finished or not) with the same scores: bit-identical where each beam's
/// rows are read in position order as in a cache of its own (`shift`, `conveyor`: rows are only
/// appended), within 1e-5 where freed rows are reused (`smart_mask`, `naive`): a reused row sits
/// before older rows in the window, so the attention sums the same terms in another order.
fn same_beams(got: &[Beam], want: &[Beam], exact: bool, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((&g.tokens, g.finished), (&w.tokens, w.finished), "{what}");
        if exact {
            assert_eq!((g.logprob, g.score), (w.logprob, w.score), "{what}");
        } else {
            // Reused rows change the attention's summation order (differences of ~1e-7), and
            // on this u8 K/V model such a difference can move one K/V code by a step, which
            // changes a 24-token log-probability by up to ~1e-3 (8.1e-4 measured after the FFN
            // smoothing moved the roundings). The tokens above stay exact.
            let tol = 5e-3;
            assert!(
                (g.logprob - w.logprob).abs() <= tol,
                "{what}: {g:?} vs {w:?}"
            );
            assert!((g.score - w.score).abs() <= tol, "{what}: {g:?} vs {w:?}");
        }
    }
}

const PROMPT: &str = "Once upon a time, there was a little dog named";

#[test]
fn beam_search_on_the_shared_cache_equals_b_independent_caches() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, &[1, 4]);
    let prompt = tok.encode(PROMPT, true, false);
    for (b, alpha) in [(4, 1.0f32), (3, 0.0), (2, 0.6)] {
        let want = independent_beam_search(&compiled, &prompt, b, alpha, 24);
        assert_eq!(want.len(), b);
        for strategy in STRATEGIES {
            let mut s = session(&compiled, strategy);
            let options = BeamOptions {
                beams: b,
                length_penalty: alpha,
                max_tokens: 24,
            };
            let got = s.beam_search(&prompt, &options, &is_stop).unwrap();
            let reuse = matches!(strategy, Strategy::SmartMask | Strategy::Naive);
            same_beams(
                &got.beams,
                &want,
                !reuse,
                &format!("B {b} alpha {alpha} {strategy:?}"),
            );
            // Batched: one graph run per token, B beams per run; the session is back at the prompt.
            assert!(!got.memory.one_at_a_time);
            assert_eq!(s.len(), prompt.len());
            let m = got.memory;
            assert_eq!(m.counters.rows_copied_by_reorders, 0);
            assert_eq!(m.prompt_rows, prompt.len());
            assert!(m.peak_rows_held < m.peak_rows_independent, "{m:?}");
            assert!(m.peak_rows_held <= m.peak_cache_len, "{m:?}");
            assert!(m.counters.rows_reused <= m.counters.rows_freed, "{m:?}");
            if b == 4 {
                // Four beams on this prompt do reorder away from lineages.
                assert!(m.counters.rows_freed > 0, "{m:?}");
                assert_eq!(m.counters.rows_reused > 0, reuse, "{m:?}");
            }
            if !reuse {
                assert_eq!(m.counters.rows_reused, 0, "{m:?}");
            }
        }
    }
}

#[test]
fn beams_step_one_at_a_time_when_no_variant_has_room() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, &[1, 2]);
    let prompt = tok.encode(PROMPT, true, false);
    let want = independent_beam_search(&compiled, &prompt, 3, 1.0, 12);
    let mut s = session(&compiled, Strategy::Conveyor);
    let options = BeamOptions {
        beams: 3,
        length_penalty: 1.0,
        max_tokens: 12,
    };
    let got = s.beam_search(&prompt, &options, &is_stop).unwrap();
    assert!(got.memory.one_at_a_time);
    same_beams(&got.beams, &want, true, "conveyor, one beam at a time");
}

#[test]
fn n_samples_share_the_prefill_and_each_equals_its_own_generation() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, &[1, 4]);
    let prompt = tok.encode(PROMPT, true, false);
    let options = SamplerOptions {
        temperature: 0.9,
        top_p: 0.95,
        seed: 11,
        ..SamplerOptions::default()
    };
    let max = 40;
    // Sample i alone: a session of its own, sampler seeded 11 + i, as `generate` does.
    let alone: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut s = session(&compiled, Strategy::SHIFT_2X);
            let mut sampler = Sampler::new(SamplerOptions {
                seed: 11 + i,
                ..options
            })
            .unwrap();
            s.prefill(&prompt).unwrap();
            let mut out = Vec::new();
            while out.len() < max {
                let t = s.sample(&mut sampler).unwrap();
                if is_stop(t) {
                    break;
                }
                out.push(t);
                if out.len() < max {
                    s.decode(t).unwrap();
                }
            }
            out
        })
        .collect();
    assert!(
        alone.windows(2).any(|w| w[0] != w[1]),
        "samples should differ"
    );
    for strategy in STRATEGIES {
        let mut s = session(&compiled, strategy);
        let got = s.sample_n(&prompt, 4, max, options, &is_stop).unwrap();
        let tokens: Vec<Vec<u32>> = got.samples.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(tokens, alone, "{}", strategy.name());
        for (t, stop) in &got.samples {
            assert_eq!(
                *stop == StopReason::MaxTokens,
                t.len() == max,
                "{}",
                strategy.name()
            );
        }
        // The prompt's rows are held once; nothing is freed (samples never reorder).
        assert_eq!(got.memory.counters.rows_freed, 0);
        assert_eq!(
            got.memory.peak_rows_independent - got.memory.peak_rows_held,
            3 * prompt.len()
        );
        assert_eq!(s.len(), prompt.len());
    }
}

#[test]
fn bad_beam_options_are_refused() {
    let (ckpt, tok) = model();
    let compiled = compile(&ckpt, &tok, &[1, 4]);
    let prompt = tok.encode(PROMPT, true, false);
    let mut s = session(&compiled, Strategy::SmartMask);
    for (beams, alpha, max) in [(0, 1.0, 8), (257, 1.0, 8), (2, f32::NAN, 8), (2, 1.0, 0)] {
        let options = BeamOptions {
            beams,
            length_penalty: alpha,
            max_tokens: max,
        };
        let err = s.beam_search(&prompt, &options, &is_stop).unwrap_err();
        assert!(!err.to_string().is_empty());
        assert!(s.is_empty(), "a refused search prefilled");
    }
}
