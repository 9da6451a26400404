//! The per-layer window contract end to end on stories260K in f32: the one forward, with an
//! attention that reads K/V only through a `kv_manager` step — each layer's past binding and its
//! mask (`attention_mask`, or `attention_mask_w{W}` for a sliding layer) — and writes the new rows
//! into the plan's output bindings, agrees with the windowed float oracle (`FloatModel`) to 1e-4,
//! and every strategy that serves windows gives bit-identical logits.

use htpkv::kv_manager::{CacheSpec, Geometry, HostAllocator, KvCache, Plan, Strategy, TensorKind};
use llama2c::{Checkpoint, ModelFiles};
use model::forward::{Activations, Input, Kernels, NoTap, Output, Pass, Positions, run};
use model::ops::{Rope, attend, matmul};
use model::{FloatModel, LlamaConfig, Tensor, WeightSource};
use std::sync::Arc;

/// Kernels whose KV cache is a `kv_manager` region (f32 rows) seen through one step's plan.
struct CacheKernels<'a> {
    config: &'a LlamaConfig,
    geometry: &'a Geometry,
    weights: &'a Checkpoint,
    plan: &'a Plan,
    region: &'a mut [u8],
    scores: Vec<f32>,
    logits: Vec<Vec<f32>>,
}

impl CacheKernels<'_> {
    fn tensor(&self, t: Tensor) -> &[f32] {
        self.weights
            .tensor(t)
            .expect("stories260K has every tensor")
    }

    fn row(&self, at: usize) -> Vec<f32> {
        self.region[at..at + 4 * self.config.head_dim]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Writes the n new rows of (layer, head, kind) and returns the past rows then the new ones.
    fn rows(&mut self, layer: usize, head: usize, kind: TensorKind, new: &[f32]) -> Vec<f32> {
        let (hd, kvd) = (self.config.head_dim, self.config.kv_dim());
        let t = self.geometry.buffer_index(layer, head, kind);
        let (past, out) = (self.plan.past(t), self.plan.new_output(t));
        for (i, row) in new.chunks_exact(kvd).enumerate() {
            let at = out.offset + out.element_offset(0, i, 0, 4);
            for (c, v) in row[head * hd..(head + 1) * hd].iter().enumerate() {
                self.region[at + 4 * c..at + 4 * c + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        let past_rows = (0..past.shape[2]).map(|j| past.offset + past.element_offset(0, j, 0, 4));
        let new_rows = (0..self.plan.ar).map(|i| out.offset + out.element_offset(0, i, 0, 4));
        past_rows
            .chain(new_rows)
            .flat_map(|at| self.row(at))
            .collect()
    }
}

impl Kernels for CacheKernels<'_> {
    fn embed(&mut self, token: u32, out: &mut [f32]) {
        let d = out.len();
        let t = token as usize;
        out.copy_from_slice(&self.tensor(Tensor::TokenEmbedding)[t * d..(t + 1) * d]);
    }

    fn linear(&mut self, w: Tensor, x: &[f32], out: &mut [f32]) {
        let shape = w.shape(self.config);
        let m = self.tensor(w).to_vec();
        for (o, xr) in out.chunks_exact_mut(shape[0]).zip(x.chunks_exact(shape[1])) {
            matmul(o, xr, &m);
        }
    }

    fn vector(&self, v: Tensor) -> &[f32] {
        self.tensor(v)
    }

    fn attention(&mut self, layer: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
        let c = self.config;
        let (hd, qd, n) = (c.head_dim, c.q_dim(), self.plan.ar);
        let mask = self
            .plan
            .mask_for(self.geometry.layer_window(layer))
            .expect("a mask per window")
            .to_vec();
        let cols = mask.len() / n;
        for h in 0..c.n_kv_heads {
            let keys = self.rows(layer, h, TensorKind::Key, k);
            let values = self.rows(layer, h, TensorKind::Value, v);
            for qh in h * c.kv_mul()..(h + 1) * c.kv_mul() {
                for i in 0..n {
                    attend(
                        &q[i * qd + qh * hd..i * qd + (qh + 1) * hd],
                        cols,
                        |t| &keys[t * hd..(t + 1) * hd],
                        |t| &values[t * hd..(t + 1) * hd],
                        |t| mask[i * cols + t],
                        &mut self.scores,
                        &mut out[i * qd + qh * hd..i * qd + (qh + 1) * hd],
                    );
                }
            }
        }
    }

    fn logits(&mut self, _row: usize, logits: &[f32]) {
        self.logits.push(logits.to_vec());
    }
}

/// Logits of every position of `tokens` (prefill `prefill` tokens in AR-4 chunks, then AR-1).
fn through_cache(
    config: &LlamaConfig,
    ckpt: &Checkpoint,
    geometry: &Geometry,
    strategy: Strategy,
    tokens: &[u32],
    prefill: usize,
) -> Vec<Vec<f32>> {
    let spec = CacheSpec::for_simulation(geometry.clone(), strategy);
    let mut cache = KvCache::new(spec, &HostAllocator::default()).unwrap();
    let rope = Rope::new(config.head_dim, &config.rope);
    let mut acts = Activations::new(config, 4);
    let mut logits = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        let n = if at < prefill { 4 } else { 1 };
        cache.plan(n).unwrap();
        let (plan, region) = cache.pending_io().unwrap();
        let positions: Vec<usize> = plan.positions.iter().map(|&p| p as usize).collect();
        let mut k = CacheKernels {
            config,
            geometry,
            weights: ckpt,
            plan,
            region,
            scores: vec![0.0; geometry.context],
            logits: Vec::new(),
        };
        let pass = Pass {
            layers: 0..config.n_layers,
            input: Input::Tokens(&tokens[at..at + n]),
            positions: Positions::Ids(&positions),
            output: Output::Logits,
        };
        run(config, &rope, &mut k, &mut acts, &pass, &mut NoTap).unwrap();
        logits.extend(k.logits);
        cache.commit(n).unwrap();
        at += n;
    }
    logits
}

#[test]
fn windowed_layers_through_the_cache_match_the_float_oracle_for_every_strategy() {
    let Ok(files) = ModelFiles::discover(None) else {
        assert!(
            std::env::var("CI").is_err(),
            "stories260K is missing under CI"
        );
        eprintln!("SKIPPED: the stories260K model is absent (set HTPKV_MODEL_DIR)");
        return;
    };
    let ckpt = Checkpoint::load(&files.checkpoint).unwrap();
    // Window 16 on layers 0, 2 and 4 at context 64: 60 tokens, so the windows bite.
    let config = llama2c::llama_config(&ckpt.config).with_layer_windows(&[0, 2, 4], 16);
    let geometry = Geometry::new(
        config.n_layers,
        config.n_kv_heads,
        config.head_dim,
        64,
        &[1, 4],
        quant::DataType::F32,
    )
    .with_windows(&[0, 2, 4], 16);
    let tokens: Vec<u32> = (0..60u32).map(|i| (i * 37 + 1) % 512).collect();
    let ckpt = Arc::new(ckpt);
    let mut oracle = FloatModel::new(config.clone(), Arc::clone(&ckpt), 64).unwrap();
    let want: Vec<Vec<f32>> = (tokens.iter().enumerate())
        .map(|(p, &t)| oracle.forward(t, p).unwrap().to_vec())
        .collect();
    let mut global =
        FloatModel::new(llama2c::llama_config(&ckpt.config), Arc::clone(&ckpt), 64).unwrap();
    let last = tokens.len() - 1;
    for (p, &t) in tokens[..last].iter().enumerate() {
        global.forward(t, p).unwrap();
    }
    let unwindowed = global.forward(tokens[last], last).unwrap().to_vec();
    assert!(
        want[last]
            .iter()
            .zip(&unwindowed)
            .any(|(a, b)| (a - b).abs() > 1e-3),
        "the windows must change the result for the test to mean anything"
    );
    let mut first: Option<Vec<Vec<f32>>> = None;
    for strategy in [Strategy::SHIFT_2X, Strategy::Conveyor, Strategy::Naive] {
        let got = through_cache(&config, &ckpt, &geometry, strategy, &tokens, 12);
        // Prefill chunks yield one row of logits per token too.
        assert_eq!(got.len(), tokens.len());
        for (p, (g, w)) in got.iter().zip(&want).enumerate() {
            let worst = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-4, "{}: position {p}: {worst}", strategy.name());
        }
        match &first {
            None => first = Some(got),
            Some(f) => assert!(*f == got, "{} differs bitwise", strategy.name()),
        }
    }
}
