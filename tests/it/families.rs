//! Sessions on the toy GGUFs of the families whose RoPE differs from Llama 2's (gemma3: window
//! layers with a base of their own; phi3: partial rotary; llama3: frequency factors): a slide with
//! re-rotated K rows continues as the float model does when its kept tokens' K/V are recomputed
//! at their new positions, under every strategy that serves the model, bit-identically; a Gemma session saved and resumed
//! generates what an uninterrupted one does; greedy prompt lookup gives plain decoding's tokens.

use htpkv::engine::{OpenedModel, calibration_sequences};
use htpkv::reference::ReferenceBackend;
use htpkv::sampler::SamplerOptions;
use htpkv::session::{GenerateOptions, Generation, Overflow, Session, SlidePositions, TextCodec};
use htpkv::speculate::{PromptLookup, Speculation};
use kv_manager::Strategy;
use model::FloatModel;
use model::NoTap;
use model::forward::{Input, Output, Pass, Positions};
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use std::ops::Range;
use std::sync::Arc;
use test_support::files::ScratchDir;
use test_support::harness::max_abs_diff;

/// A toy family GGUF, opened and compiled for the reference executor.
struct Toy {
    opened: OpenedModel,
    compiled: Arc<CompiledModel>,
    _dir: ScratchDir,
}

/// The toy of `family` compiled for `context` and `ar` with `kv` K/V and `weights`.
fn toy(family: &str, context: usize, ar: &[usize], kv: DataType, weights: WeightType) -> Toy {
    let dir = ScratchDir::new(&format!("families-{family}"));
    let path = dir.join(format!("{family}.gguf"));
    std::fs::write(&path, test_support::families::toy_gguf(family).unwrap()).unwrap();
    let opened = OpenedModel::open(Some(&path), None).unwrap_or_else(|e| panic!("{family}: {e}"));
    let mut opts = CompileOptions::new(context, ar.to_vec());
    (opts.kv_dtype, opts.weights, opts.calibration_tokens) = (kv, weights, 24);
    let prompts = calibration_sequences(&*opened.codec, &opened.chat).unwrap();
    let compiled = opened.compile(&opts, &prompts, &mut |_| {}).unwrap();
    Toy {
        opened,
        compiled: Arc::new(compiled),
        _dir: dir,
    }
}

impl Toy {
    /// The strategies that serve this model (`smart_mask` cannot serve sliding windows).
    fn strategies(&self) -> Vec<Strategy> {
        let windowed = self.opened.config.layer_windows.iter().any(Option::is_some);
        (test_support::runtime::STRATEGIES.into_iter())
            .filter(|&s| !(windowed && s == Strategy::SmartMask))
            .collect()
    }

    /// A session that knows the compiled description (for re-rotation).
    fn session(&self, strategy: Strategy, overflow: Overflow) -> Session<ReferenceBackend> {
        let mut s = test_support::runtime::session(&self.compiled, strategy);
        s.set_rope(self.compiled.config()).unwrap();
        s.set_overflow(overflow).unwrap();
        s
    }

    /// The float model of the GGUF, for a context of `context` tokens.
    fn float(&self, context: usize) -> SlidFloat {
        let m = model::load(&self.opened.path).unwrap();
        let layers = m.config.n_layers;
        SlidFloat {
            fm: FloatModel::new(m.config, m.weights, context).unwrap(),
            inputs: Vec::new(),
            layers,
        }
    }
}

/// The float model under slides, by definition: each cached token keeps the inputs its layers
/// had when it ran, and a slide recomputes every kept token's K/V from those inputs at its new
/// position (the forward's own RoPE at absolute positions; no re-rotation arithmetic).
struct SlidFloat {
    fm: FloatModel<model::Weights>,
    /// Per cached token, each layer's input row.
    inputs: Vec<Vec<Vec<f32>>>,
    layers: usize,
}

impl SlidFloat {
    /// Runs `layers` on `rows` (`[n, dim]` hidden states, or `tokens`) at positions `0..n` from
    /// `pos0`, storing their K/V there.
    fn pass(&mut self, pos0: usize, layers: Range<usize>, input: Input<'_>, output: Output) {
        let n = match input {
            Input::Tokens(t) => t.len(),
            Input::Hidden(h) => h.len() / self.fm.config().dim,
        };
        let positions: Vec<usize> = (pos0..pos0 + n).collect();
        let pass = Pass {
            layers,
            input,
            positions: Positions::Ids(&positions),
            output,
        };
        self.fm.run_pass(pos0, &pass, &mut NoTap).unwrap();
    }

    /// Runs `token` at the next position, layer by layer; its logits.
    fn step(&mut self, token: u32) -> Vec<f32> {
        let p = self.inputs.len();
        self.pass(p, 0..0, Input::Tokens(&[token]), Output::Hidden);
        let mut inputs = Vec::with_capacity(self.layers);
        for l in 0..self.layers {
            inputs.push(self.fm.hidden().to_vec());
            let last = l + 1 == self.layers;
            let output = if last { Output::Logits } else { Output::Hidden };
            self.pass(p, l..l + 1, Input::Hidden(&inputs[l].clone()), output);
        }
        self.inputs.push(inputs);
        self.fm.logits().to_vec()
    }

    /// Drops `drop` tokens after the first `keep` and recomputes the K/V of every kept token at
    /// its new position from its layers' inputs.
    fn slide(&mut self, keep: usize, drop: usize) {
        self.inputs.drain(keep..keep + drop);
        for l in 0..self.layers {
            let rows: Vec<f32> = self.inputs.iter().flat_map(|t| t[l].clone()).collect();
            self.pass(0, l..l + 1, Input::Hidden(&rows), Output::Hidden);
        }
    }
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

const SLIDE: Overflow = Overflow::Slide {
    n_keep: 2,
    chunk: 5,
    positions: SlidePositions::Rerotate,
};

/// Prefills 10 tokens and decodes 40 more at context 24 (slides of at least 5 tokens after the
/// first 2): the logits of every step, the slides, and (`check`) the worst |logit diff| of the
/// steps after the first slide, relative to the largest |logit|, against the float model under
/// the same slides ([`SlidFloat`]).
fn slide_run(toy: &Toy, strategy: Strategy, check: bool) -> (Vec<Vec<u32>>, usize, f32) {
    let vocab = toy.compiled.config().vocab_size as u32;
    let stream: Vec<u32> = (0..50u32)
        .map(|i| 4 + (i * 37 + 11) % (vocab - 4))
        .collect();
    let mut s = toy.session(strategy, SLIDE);
    let mut out = vec![bits(s.prefill(&stream[..10]).unwrap())];
    let mut float = check.then(|| toy.float(24));
    for &t in &stream[..10] {
        float.as_mut().map(|f| f.step(t));
    }
    let mut worst = 0.0f32;
    for &t in &stream[10..] {
        let before = s.slides().len();
        out.push(bits(s.decode(t).unwrap()));
        let Some(f) = float.as_mut() else { continue };
        if let Some(e) = s.slides().get(before) {
            f.slide(2, e.dropped);
        }
        let want = f.step(t);
        if !s.slides().is_empty() {
            let scale = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
            worst = worst.max(max_abs_diff(s.last_logits(), &want) / scale);
        }
    }
    (out, s.slides().len(), worst)
}

/// After a re-rotating slide the logits follow the float model whose kept tokens' K/V are
/// recomputed at their new positions (f32 K/V and weights: the only error left is rounding),
/// on every family whose RoPE is not Llama 2's, and every strategy gives the same bits.
#[test]
fn slides_rerotate_each_layer_with_its_own_rope() {
    for family in ["gemma3", "phi3", "llama3"] {
        let toy = toy(family, 24, &[1, 4], DataType::F32, WeightType::F32);
        let strategies = toy.strategies();
        let (want, slides, worst) = slide_run(&toy, strategies[0], true);
        eprintln!("{family}: {slides} slides, worst relative |logit diff| {worst:e}");
        assert!(slides >= 4, "{family}: {slides} slides");
        assert!(worst < 1e-4, "{family}: {worst:e} after a slide");
        for &strategy in &strategies[1..] {
            let (got, _, _) = slide_run(&toy, strategy, false);
            assert!(got == want, "{family}: {} differs", strategy.name());
        }
    }
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: SamplerOptions::default(),
        ..GenerateOptions::default()
    }
}

/// Generates `turns` in order on `s` (with `spec` when given).
fn turns(
    s: &mut Session<ReferenceBackend>,
    codec: &dyn TextCodec,
    turns: &[(&str, usize)],
    mut spec: Option<&mut Speculation>,
) -> Vec<Generation> {
    let mut out = Vec::new();
    for &(prompt, max) in turns {
        let options = greedy(max);
        let g = match spec.as_deref_mut() {
            Some(spec) => spec
                .generate(s, codec, prompt, &options, &mut |_| true)
                .map_err(|e| e.to_string()),
            None => (s.generate(codec, prompt, &options, &mut |_| true)).map_err(|e| e.to_string()),
        };
        out.push(g.expect("generates"));
    }
    out
}

const TURNS: [(&str, usize); 2] = [("The cat sat on the mat. The cat", 30), (" and then", 30)];

/// A Gemma session (u16 K/V, i8 weights, window layers; slides on the way) saved after the first
/// turn and resumed in a fresh session of each strategy generates the second turn as the
/// uninterrupted session does, to the last logits' bits.
#[test]
fn a_saved_gemma_session_resumes_as_if_uninterrupted() {
    let toy = toy("gemma3", 48, &[1, 4], DataType::U16, WeightType::I8);
    let codec = &*toy.opened.codec;
    let dir = ScratchDir::new("families-persist");
    let path = dir.join("gemma.session");
    let mut whole = toy.session(Strategy::SHIFT_2X, SLIDE);
    let want = turns(&mut whole, codec, &TURNS, None);
    assert!(!whole.slides().is_empty(), "the run must slide");
    for strategy in toy.strategies() {
        let mut first = toy.session(Strategy::SHIFT_2X, SLIDE);
        turns(&mut first, codec, &TURNS[..1], None);
        first.save(&path, &[]).unwrap();
        let mut resumed = toy.session(strategy, SLIDE);
        resumed.restore(&path).unwrap();
        let got = turns(&mut resumed, codec, &TURNS[1..], None);
        let name = strategy.name();
        assert_eq!(got[0].tokens, want[1].tokens, "{name}");
        assert_eq!(resumed.tokens(), whole.tokens(), "{name}");
        assert_eq!(
            bits(resumed.last_logits()),
            bits(whole.last_logits()),
            "{name}"
        );
    }
}

/// Greedy prompt lookup on the toy Gemma gives plain decoding's tokens under every strategy that
/// serves it, and some proposals are accepted.
#[test]
fn greedy_prompt_lookup_on_gemma_gives_plain_tokens() {
    let toy = toy("gemma3", 48, &[1, 5], DataType::U16, WeightType::I8);
    let codec = &*toy.opened.codec;
    for strategy in toy.strategies() {
        let plain = turns(&mut toy.session(strategy, SLIDE), codec, &TURNS, None);
        let mut spec = Speculation::new(Box::new(PromptLookup::new(4))).verifying_all();
        let mut s = toy.session(strategy, SLIDE);
        let fast = turns(&mut s, codec, &TURNS, Some(&mut spec));
        let name = strategy.name();
        for (p, f) in plain.iter().zip(&fast) {
            assert_eq!((&p.tokens, p.stop), (&f.tokens, f.stop), "{name}");
        }
        let st = spec.stats();
        assert!(st.verify_calls > 0 && st.accepted > 0, "{name}: {st:?}");
    }
}

/// A prompt sharing a prefix with a Gemma session whose window layers have moved past that prefix
/// (a repeated chat question after its answer) is prefilled again, as a cold run, instead of
/// failing on the rows those layers no longer hold; one they still hold is reused.
#[test]
fn a_gemma_prompt_reuses_what_the_window_layers_still_hold() {
    let toy = toy("gemma3", 48, &[1, 4], DataType::U16, WeightType::I8);
    let prompt: Vec<u32> = (0..12u32).map(|i| 4 + i * 5).collect();
    for strategy in toy.strategies() {
        let mut cold = toy.session(strategy, Overflow::Stop);
        let want = bits(cold.prefill(&prompt).unwrap());
        let mut warm = toy.session(strategy, Overflow::Stop);
        warm.prefill(&prompt).unwrap();
        for t in 30..50 {
            warm.decode(t).unwrap();
        }
        assert_eq!(
            bits(warm.prefill_reusing(&prompt).unwrap()),
            want,
            "{}",
            strategy.name()
        );
        assert_eq!(warm.stats().reused_tokens, 0);
        let longer = [&prompt[..], &[7, 8]].concat();
        let want = bits(cold.prefill(&[7, 8]).unwrap());
        assert_eq!(bits(warm.prefill_reusing(&longer).unwrap()), want);
        assert_eq!(warm.stats().reused_tokens, prompt.len());
    }
}
