//! Prefill on last-row graphs (issue 37): a session on a model compiled with last-row prefill
//! graphs runs them for every prefill chunk that fills its step, and its logits are bit for bit
//! those of the same model compiled with all-row graphs only, under every KV strategy, on
//! stories260K and the toy gemma3 GGUF; decode and speculative verification still run the graphs
//! that return every row.

use std::sync::Arc;

use htpkv::backend::{Backend, BackendError, GraphDesc, InputBuffer, LogitRows, OutputBuffer};
use htpkv::reference::ReferenceBackend;
use htpkv::session::Session;
use kv_manager::{HostAllocator, Strategy};
use model::LlamaConfig;
use quant::DataType;
use ref_backend::{CompileOptions, CompiledModel, WeightType};
use test_support::runtime::STRATEGIES;

const AR: usize = 8;

/// The reference backend, recording which rows each executed graph returned.
struct Recording {
    inner: ReferenceBackend,
    ran: Vec<LogitRows>,
}

impl Backend for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn graphs(&self) -> &[GraphDesc] {
        self.inner.graphs()
    }
    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        let rows = self.inner.graphs()[graph].logit_rows();
        self.ran
            .push(rows.expect("a whole model's graph has logits"));
        // SAFETY: forwarded with the session's guarantees.
        unsafe { self.inner.execute(graph, inputs, outputs) }
    }
}

fn session(model: &Arc<CompiledModel>, strategy: Strategy) -> Option<Session<Recording>> {
    let backend = Recording {
        inner: ReferenceBackend::new(model.clone()),
        ran: Vec::new(),
    };
    match Session::new(backend, strategy, &HostAllocator::default()) {
        Ok(s) => Some(s),
        // smart_mask serves no sliding-window layers (kv_manager refuses them by name).
        Err(e) if strategy == Strategy::SmartMask && e.to_string().contains("window") => None,
        Err(e) => panic!("{strategy:?}: {e}"),
    }
}

fn compile(
    config: &LlamaConfig,
    weights: &dyn model::WeightSource,
    (context, kv): (usize, DataType),
    last_row: bool,
) -> Arc<CompiledModel> {
    let mut o = CompileOptions::new(context, vec![1, AR]);
    (o.kv_dtype, o.weights, o.calibration_tokens) = (kv, WeightType::I8, 24);
    o.last_row = last_row;
    let prompts = test_support::stories::synthetic_prompts(config.vocab_size.min(200));
    let model = ref_backend::compile(config, weights, &prompts, &o, [5; 32], &mut |_| {});
    Arc::new(model.unwrap())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prefills `prompt` (and continues greedily for a few steps) on each strategy with the
/// last-row model and the all-row one: bit-identical logits, the last-row graph ran for every
/// full chunk and only there.
fn check(last: &Arc<CompiledModel>, all: &Arc<CompiledModel>, prompt: &[u32], what: &str) {
    let full = prompt.len() / AR;
    let mut served = 0;
    for strategy in STRATEGIES {
        let (Some(mut a), Some(mut b)) = (session(last, strategy), session(all, strategy)) else {
            continue;
        };
        served += 1;
        let want = bits(b.prefill(prompt).unwrap());
        assert!(
            bits(a.prefill(prompt).unwrap()) == want,
            "{what} {strategy:?}: prefill"
        );
        let ran = &a.backend().ran;
        let last_rows = ran.iter().filter(|&&r| r == LogitRows::Last).count();
        assert_eq!(last_rows, full, "{what} {strategy:?}: {ran:?}");
        assert!(b.backend().ran.iter().all(|&r| r == LogitRows::All));
        for _ in 0..6 {
            let t = model::ops::argmax(b.last_logits()) as u32;
            let want = bits(b.decode(t).unwrap());
            assert!(
                bits(a.decode(t).unwrap()) == want,
                "{what} {strategy:?}: decode"
            );
        }
        let ran = &a.backend().ran;
        assert_eq!(ran.iter().filter(|&&r| r == LogitRows::Last).count(), full);
    }
    assert!(served >= 3, "{what}: {served} strategies served");
}

/// A prompt of `len` tokens inside `vocab`.
fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (i * 37 + 11) % (vocab as u32 - 1))
        .collect()
}

#[test]
fn last_row_prefill_equals_all_row_prefill_on_stories260k() {
    let (ckpt, _) = test_support::stories::stories260k_loaded();
    let c = model::llama2c::llama_config(&ckpt.config);
    let setup = (128, DataType::U8);
    let (last, all) = (
        compile(&c, &ckpt, setup, true),
        compile(&c, &ckpt, setup, false),
    );
    // Full chunks only, then a padded last chunk (which returns every row).
    check(&last, &all, &prompt(3 * AR, c.vocab_size), "stories260K 24");
    check(
        &last,
        &all,
        &prompt(3 * AR + 5, c.vocab_size),
        "stories260K 29",
    );
}

#[test]
fn last_row_prefill_equals_all_row_prefill_on_the_gemma3_toy() {
    let m = test_support::families::toy_model("gemma3").unwrap();
    let c = &m.config;
    let setup = (64, DataType::U16);
    let (last, all) = (
        compile(c, &*m.weights, setup, true),
        compile(c, &*m.weights, setup, false),
    );
    check(&last, &all, &prompt(4 * AR, c.vocab_size), "gemma3 32");
    check(&last, &all, &prompt(2 * AR + 3, c.vocab_size), "gemma3 19");
}

/// Speculative verification consumes every row: on a model with last-row graphs, `verify`
/// runs the all-row graph and returns a row per token, each equal to what decoding gives.
#[test]
fn verification_still_runs_the_all_row_graphs() {
    let (ckpt, _) = test_support::stories::stories260k_loaded();
    let c = model::llama2c::llama_config(&ckpt.config);
    let last = compile(&c, &ckpt, (128, DataType::U8), true);
    let p = prompt(2 * AR, c.vocab_size);
    let mut s = session(&last, Strategy::SHIFT_2X).unwrap();
    s.prefill(&p).unwrap();
    let proposal = prompt(5, c.vocab_size);
    let before = s.backend().ran.len();
    let verified = s.verify(&proposal).unwrap().to_vec();
    assert_eq!(verified.len(), proposal.len() * c.vocab_size);
    assert_eq!(&s.backend().ran[before..], [LogitRows::All]);
    let mut d = session(&last, Strategy::SHIFT_2X).unwrap();
    d.prefill(&p).unwrap();
    for (i, &t) in proposal.iter().enumerate() {
        let row = &verified[i * c.vocab_size..(i + 1) * c.vocab_size];
        assert!(bits(d.decode(t).unwrap()) == bits(row), "row {i}");
    }
}
