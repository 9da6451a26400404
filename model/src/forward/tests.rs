use super::*;
use crate::config::tests::tiny;
use crate::{RopePairing, Weights};

/// Deterministic pseudo-random weights for `c` (small values, so logits stay moderate).
pub(crate) fn synthetic(c: &LlamaConfig, seed: u64) -> Weights {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
    };
    let mut w = Weights::with_layers(c.n_layers);
    for t in Tensor::required(c) {
        let data = (0..t.len(c)).map(|_| next()).collect();
        w.set(t, data).unwrap();
    }
    w
}

#[test]
fn rejects_missing_or_missized_weights_and_bad_context() {
    let c = tiny();
    let mut w = synthetic(&c, 1);
    assert!(FloatModel::new(c.clone(), Arc::new(w.clone()), 0).is_err());
    assert!(FloatModel::new(c.clone(), Arc::new(w.clone()), 17).is_err());
    w.set(Tensor::Layer(1, LayerTensor::Up), vec![0.0; 5])
        .unwrap();
    let err = FloatModel::new(c.clone(), Arc::new(w), 8).unwrap_err();
    assert!(matches!(err, Error::TensorShape { .. }), "{err}");
    let mut untied = c.clone();
    untied.tied_output = false;
    let err = FloatModel::new(untied, Arc::new(synthetic(&c, 1)), 8).unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
}

#[test]
fn unallocatable_kv_cache_is_an_error() {
    // Sizes no loaded model reaches (1 << 40 layers overflow, 1 PiB cannot be reserved).
    let mut c = tiny();
    c.context_length = crate::limits::MAX_CONTEXT;
    c.n_layers = 1 << 40;
    c.n_kv_heads = 4;
    assert!(matches!(
        kv_cache(&c, 1 << 24),
        Err(Error::InvalidConfig {
            field: "context",
            ..
        })
    ));
    c.n_layers = 1 << 20;
    assert!(matches!(
        kv_cache(&c, 1 << 24),
        Err(Error::InvalidConfig {
            field: "context",
            ..
        })
    ));
    c.n_layers = 2;
    assert_eq!(kv_cache(&c, 3).unwrap(), vec![0.0; 2 * 3 * 16]);
}

#[test]
fn step_errors_leave_the_cache_alone() {
    let c = tiny();
    let mut m = FloatModel::new(c.clone(), Arc::new(synthetic(&c, 2)), 4).unwrap();
    assert!(matches!(
        m.forward(32, 0),
        Err(Error::TokenOutOfRange { token: 32, .. })
    ));
    assert!(matches!(
        m.forward(1, 1),
        Err(Error::PositionGap { pos: 1, filled: 0 })
    ));
    for p in 0..4 {
        m.forward(3, p).unwrap();
    }
    assert!(matches!(
        m.forward(1, 4),
        Err(Error::PositionOutOfRange { pos: 4, context: 4 })
    ));
    assert_eq!(m.cached_len(), 4);
}

/// Observes every site, checking widths.
struct Recorder(Vec<(usize, Site, usize)>);
impl Tap for Recorder {
    fn observe(&mut self, layer: usize, site: Site, values: &[f32]) {
        self.0.push((layer, site, values.len()));
    }
}

#[test]
fn tap_sees_every_site_with_its_width() {
    let c = tiny();
    let mut m = FloatModel::new(c.clone(), Arc::new(synthetic(&c, 3)), 4).unwrap();
    let mut rec = Recorder(Vec::new());
    let logits = m.forward_tapped(5, 0, &mut rec).unwrap().to_vec();
    assert_eq!(rec.0.len(), c.n_layers * 8 + 2);
    assert_eq!(rec.0[1], (0, Site::Query, c.q_dim()));
    assert_eq!(rec.0[2], (0, Site::Key, c.kv_dim()));
    assert_eq!(rec.0[6], (0, Site::FfnHidden, c.hidden_dim));
    assert_eq!(
        *rec.0.last().unwrap(),
        (c.n_layers, Site::Logits, c.vocab_size)
    );
    // Tapping does not change results.
    m.reset();
    assert_eq!(m.forward(5, 0).unwrap(), &logits[..]);
}

/// Plain f64 forward over the whole sequence without a cache: explicit per-pair RoPE (either
/// layout, partial, frequency factors, the window layers' own base), GQA, biases, q/k norms,
/// post norms, GELU-tanh, embedding scale, attention scale, soft-cap, untied classifier,
/// per-layer sliding windows. Returns the logits of every position.
fn reference(c: &LlamaConfig, w: &Weights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let g =
        |t: Tensor| -> Vec<f64> { w.tensor(t).unwrap().iter().map(|&v| f64::from(v)).collect() };
    let lt = |l, t| g(Tensor::Layer(l, t));
    let mv = |m: &[f64], x: &[f64]| -> Vec<f64> {
        m.chunks(x.len())
            .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let norm = |x: &[f64], gw: &[f64]| -> Vec<f64> {
        let r =
            (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + f64::from(c.rms_eps)).sqrt();
        x.iter().zip(gw).map(|(v, g)| v / r * g).collect()
    };
    let hd = c.head_dim;
    let rot = c.rope.rotated.unwrap_or(hd);
    let rope = |v: &mut [f64], pos: usize, l: usize| {
        let theta = match (c.rope.window_theta, c.layer_window(l)) {
            (Some(t), Some(_)) => t,
            _ => c.rope.theta,
        };
        for head in v.chunks_mut(hd) {
            for k in 0..rot / 2 {
                let (i, j) = match c.rope.pairing {
                    RopePairing::Adjacent => (2 * k, 2 * k + 1),
                    RopePairing::HalfSplit => (k, k + rot / 2),
                };
                let div = c
                    .rope
                    .freq_factors
                    .as_ref()
                    .map_or(1.0, |d| f64::from(d[k]));
                let f = f64::from(theta).powf(-(2.0 * k as f64) / rot as f64) / div;
                let (sn, cs) = (pos as f64 * f).sin_cos();
                let (a, b) = (head[i], head[j]);
                head[i] = a * cs - b * sn;
                head[j] = a * sn + b * cs;
            }
        }
    };
    let with_bias = |mut y: Vec<f64>, l, t| {
        if c.block.qkv_bias {
            y.iter_mut().zip(lt(l, t)).for_each(|(a, b)| *a += b);
        }
        y
    };
    let head_norm = |v: &mut Vec<f64>, l, t| {
        if c.block.qk_norm {
            let gw = lt(l, t);
            *v = v.chunks(hd).flat_map(|h| norm(h, &gw)).collect();
        }
    };
    let post = |v: Vec<f64>, l, t, on: bool| if on { norm(&v, &lt(l, t)) } else { v };
    let act = |x: f64| match c.block.activation {
        crate::Activation::Silu => x / (1.0 + (-x).exp()),
        crate::Activation::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
    };
    let scale = c
        .block
        .attention_scale
        .map_or(1.0 / (hd as f64).sqrt(), f64::from);
    let es = c.embed_scale.map_or(1.0, f64::from);
    let emb = g(Tensor::TokenEmbedding);
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            emb[t as usize * c.dim..(t as usize + 1) * c.dim]
                .iter()
                .map(|v| v * es)
                .collect()
        })
        .collect();
    use LayerTensor as L;
    for l in 0..c.n_layers {
        let hs: Vec<Vec<f64>> = xs.iter().map(|x| norm(x, &lt(l, L::AttnNorm))).collect();
        let mut qs: Vec<_> = hs
            .iter()
            .map(|h| with_bias(mv(&lt(l, L::Q), h), l, L::QBias))
            .collect();
        let mut ks: Vec<_> = hs
            .iter()
            .map(|h| with_bias(mv(&lt(l, L::K), h), l, L::KBias))
            .collect();
        let vs: Vec<_> = hs
            .iter()
            .map(|h| with_bias(mv(&lt(l, L::V), h), l, L::VBias))
            .collect();
        for p in 0..tokens.len() {
            head_norm(&mut qs[p], l, L::QNorm);
            head_norm(&mut ks[p], l, L::KNorm);
            rope(&mut qs[p], p, l);
            rope(&mut ks[p], p, l);
        }
        for p in 0..tokens.len() {
            let mut o = vec![0.0; c.q_dim()];
            for h in 0..c.n_heads {
                let kvh = h / c.kv_mul();
                let q = &qs[p][h * hd..(h + 1) * hd];
                // A sliding-window layer sees the last W positions only.
                let first = c.layer_window(l).map_or(0, |w| (p + 1).saturating_sub(w));
                let sc: Vec<f64> = (first..=p)
                    .map(|t| {
                        let k = &ks[t][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (t, et) in (first..).zip(&e) {
                    for i in 0..hd {
                        o[h * hd + i] += et / z * vs[t][kvh * hd + i];
                    }
                }
            }
            let att = post(
                mv(&lt(l, L::O), &o),
                l,
                L::PostAttnNorm,
                c.block.post_attention_norm,
            );
            xs[p].iter_mut().zip(att).for_each(|(a, b)| *a += b);
            let h2 = norm(&xs[p], &lt(l, L::FfnNorm));
            let a = mv(&lt(l, L::Gate), &h2);
            let b = mv(&lt(l, L::Up), &h2);
            let gated: Vec<f64> = a.iter().zip(&b).map(|(x, y)| act(*x) * y).collect();
            let down = post(
                mv(&lt(l, L::Down), &gated),
                l,
                L::PostFfnNorm,
                c.block.post_ffn_norm,
            );
            xs[p].iter_mut().zip(down).for_each(|(a, b)| *a += b);
        }
    }
    let cls = g(if c.tied_output {
        Tensor::TokenEmbedding
    } else {
        Tensor::Output
    });
    let fin = g(Tensor::OutputNorm);
    let cap = |v: f64| {
        c.final_softcap
            .map_or(v, |s| f64::from(s) * (v / f64::from(s)).tanh())
    };
    xs.iter()
        .map(|x| mv(&cls, &norm(x, &fin)).into_iter().map(cap).collect())
        .collect()
}

fn assert_matches_reference(c: LlamaConfig, seed: u64) {
    let w = synthetic(&c, seed);
    let tokens: Vec<u32> = (0..10)
        .map(|i| (i * 13 + 5) % c.vocab_size as u32)
        .collect();
    let want = reference(&c, &w, &tokens);
    let mut m = FloatModel::new(c, Arc::new(w), 12).unwrap();
    for (p, &t) in tokens.iter().enumerate() {
        let got = m.forward(t, p).unwrap();
        for (g, w) in got.iter().zip(&want[p]) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-4 * (1.0 + w.abs()),
                "pos {p}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn forward_matches_f64_reference_for_each_option() {
    let base = tiny();
    assert_matches_reference(base.clone(), 7);
    let mut c = base.clone();
    c.rope.pairing = RopePairing::HalfSplit;
    c.rope.theta = 1e5;
    c.rms_eps = 1e-6;
    assert_matches_reference(c, 8);
    let mut c = base.clone();
    c.block.qkv_bias = true;
    c.tied_output = false;
    c.head_dim = 8; // q_dim 32 != dim 16
    c.n_kv_heads = 1;
    assert_matches_reference(c, 9);
}

/// Each property a family adds to the Llama block, alone and all together (Gemma 3's mix), on
/// the f64 reference; a test model with the property differs from one without (the property
/// takes effect).
#[test]
fn every_block_property_matches_the_reference_and_takes_effect() {
    type Edit = fn(&mut LlamaConfig);
    let edits: [(&str, Edit); 9] = [
        ("qk_norm", |c| c.block.qk_norm = true),
        ("post_attention_norm", |c| {
            c.block.post_attention_norm = true
        }),
        ("post_ffn_norm", |c| c.block.post_ffn_norm = true),
        ("gelu", |c| c.block.activation = crate::Activation::GeluTanh),
        ("attention_scale", |c| c.block.attention_scale = Some(0.9)),
        ("embed_scale", |c| c.embed_scale = Some(4.0)),
        ("softcap", |c| c.final_softcap = Some(0.5)),
        ("partial rotary", |c| {
            c.head_dim = 8;
            c.rope.rotated = Some(4);
            c.rope.pairing = RopePairing::HalfSplit;
        }),
        ("freq factors", |c| {
            c.rope.freq_factors = Some(vec![1.0, 8.0])
        }),
    ];
    let tokens = [3, 9, 4, 17, 8, 2, 30, 6];
    for (i, (name, edit)) in edits.iter().enumerate() {
        let mut c = tiny();
        edit(&mut c);
        assert_matches_reference(c.clone(), 30 + i as u64);
        let mut plain = tiny();
        plain.head_dim = c.head_dim;
        let w = Arc::new(synthetic(&c, 30));
        if plain.validate().is_ok() && crate::check_weights(&plain, &*w).is_ok() {
            let (a, b) = (stepwise(&c, &w, &tokens).0, stepwise(&plain, &w, &tokens).0);
            assert_ne!(a, b, "{name} changed nothing");
        }
    }
    // Gemma 3's mix: every property, window layers rotating with a base of their own.
    let mut c = tiny().with_layer_windows(&[0], 3);
    for (_, edit) in edits.iter().take(7) {
        edit(&mut c);
    }
    c.rope.pairing = RopePairing::HalfSplit;
    c.rope.theta = 1e6;
    c.rope.window_theta = Some(10.0);
    assert_matches_reference(c, 50);
}

#[test]
fn sliding_window_layers_match_the_reference_and_change_the_result() {
    // Window 3 on layer 0, window 5 on layer 1: with 10 tokens both bite.
    let mut c = tiny().with_layer_windows(&[0], 3);
    c.layer_windows[1] = Some(5);
    assert_matches_reference(c.clone(), 11);
    // A window as long as the sequence is the global layer.
    let w = Arc::new(synthetic(&c, 11));
    let tokens = [3, 9, 4, 17, 8, 2, 30, 6];
    let last = |c: &LlamaConfig| stepwise(c, &w, &tokens).0;
    let global = last(&tiny());
    assert_eq!(
        last(&tiny().with_layer_windows(&[0, 1], tokens.len())),
        global
    );
    assert_ne!(last(&c), global);
}

#[test]
fn greedy_stops_on_stop_token_and_limits() {
    let c = tiny();
    let mut m = FloatModel::new(c.clone(), Arc::new(synthetic(&c, 4)), 8).unwrap();
    let free = m.generate_greedy(&[1, 2, 3], 100, &[]).unwrap();
    // Context 8: the forwards at positions 2..=7 each produce one token (the last one unfed).
    assert_eq!(free.len(), 6);
    let first = free[0];
    assert!(
        m.generate_greedy(&[1, 2, 3], 100, &[first])
            .unwrap()
            .is_empty()
    );
    assert_eq!(m.generate_greedy(&[1, 2, 3], 2, &[]).unwrap(), free[..2]);
    assert!(m.generate_greedy(&[], 4, &[]).unwrap().is_empty());
}

/// Logits of `tokens` fed one at a time from position 0.
fn stepwise(c: &LlamaConfig, w: &Arc<Weights>, tokens: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut m = FloatModel::new(c.clone(), Arc::clone(w), 8).unwrap();
    for (p, &t) in tokens.iter().enumerate() {
        m.forward(t, p).unwrap();
    }
    let pass = Pass {
        layers: 0..c.n_layers,
        input: Input::Tokens(&tokens[tokens.len() - 1..]),
        positions: Positions::Ids(&[tokens.len() - 1]),
        output: Output::Hidden,
    };
    m.run_pass(tokens.len() - 1, &pass, &mut NoTap).unwrap();
    (m.logits().to_vec(), m.hidden().to_vec())
}

#[test]
fn a_multi_row_pass_equals_single_steps_bit_for_bit() {
    for pairing in [RopePairing::Adjacent, RopePairing::HalfSplit] {
        let mut c = tiny();
        c.rope.pairing = pairing;
        let w = Arc::new(synthetic(&c, 3));
        let tokens = [1u32, 5, 9, 2];
        let (want, _) = stepwise(&c, &w, &tokens);
        let mut m = FloatModel::new(c.clone(), Arc::clone(&w), 8).unwrap();
        let pass = Pass {
            layers: 0..c.n_layers,
            input: Input::Tokens(&tokens),
            positions: Positions::Ids(&[0, 1, 2, 3]),
            output: Output::Logits,
        };
        m.run_pass(0, &pass, &mut NoTap).unwrap();
        assert_eq!(m.logits(), &want[..], "{pairing:?}");
    }
}

#[test]
fn layer_ranges_and_cos_sin_tables_compose_to_the_full_pass() {
    let c = tiny();
    let w = Arc::new(synthetic(&c, 4));
    let tokens = [3u32, 7, 1];
    let (want_logits, want_hidden) = stepwise(&c, &w, &tokens);
    let rope = Rope::new(c.head_dim, &c.rope);
    let half = c.head_dim / 2;
    let (mut cos, mut sin) = (vec![0.0; 3 * half], vec![0.0; 3 * half]);
    for p in 0..3 {
        let r = p * half..(p + 1) * half;
        rope.cos_sin(p, &mut cos[r.clone()], &mut sin[r]);
    }
    let positions = Positions::Table {
        cos: &cos,
        sin: &sin,
    };
    let split = c.n_layers / 2;
    let mut m = FloatModel::new(c.clone(), Arc::clone(&w), 8).unwrap();
    let first = Pass {
        layers: 0..split,
        input: Input::Tokens(&tokens),
        positions,
        output: Output::Hidden,
    };
    m.run_pass(0, &first, &mut NoTap).unwrap();
    let mid = m.hidden().to_vec();
    let second = Pass {
        layers: split..c.n_layers,
        input: Input::Hidden(&mid),
        positions,
        output: Output::Logits,
    };
    m.run_pass(0, &second, &mut NoTap).unwrap();
    assert_eq!(m.logits(), &want_logits[..]);
    assert_eq!(&m.hidden()[2 * c.dim..], &want_hidden[..]);
}

#[test]
fn inconsistent_passes_are_errors() {
    let c = tiny();
    let mut m = FloatModel::new(c.clone(), Arc::new(synthetic(&c, 5)), 8).unwrap();
    let ok = Pass {
        layers: 0..c.n_layers,
        input: Input::Tokens(&[1, 2]),
        positions: Positions::Ids(&[0, 1]),
        output: Output::Logits,
    };
    let cases = [
        Pass {
            positions: Positions::Ids(&[0]),
            ..ok.clone()
        },
        Pass {
            layers: 0..c.n_layers + 1,
            ..ok.clone()
        },
        Pass {
            input: Input::Hidden(&[0.0; 3]),
            ..ok.clone()
        },
        Pass {
            positions: Positions::Table {
                cos: &[1.0],
                sin: &[0.0],
            },
            ..ok.clone()
        },
    ];
    for p in &cases {
        let err = m.run_pass(0, p, &mut NoTap).unwrap_err();
        assert!(matches!(err, Error::InvalidPass { .. }), "{err}");
    }
    let bad_token = Pass {
        input: Input::Tokens(&[1, 1 << 20]),
        ..ok.clone()
    };
    let err = m.run_pass(0, &bad_token, &mut NoTap).unwrap_err();
    assert!(matches!(err, Error::TokenOutOfRange { .. }), "{err}");
    let err = m.run_pass(7, &ok, &mut NoTap).unwrap_err();
    assert!(matches!(err, Error::PositionOutOfRange { .. }), "{err}");
    m.run_pass(6, &ok, &mut NoTap).unwrap();
}
