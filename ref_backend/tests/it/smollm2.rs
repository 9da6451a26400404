//! SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to f32; GQA 3:1, 30 layers, tied output) on
//! the executor: with f32 weights and f32 KV its AR-1 graph reproduces the float model.
//!
//! The model comes from `scripts/fetch-smollm2.sh`. When it is absent this test fails if the
//! environment variable `CI` is set, and otherwise prints how to fetch it and passes.

use std::sync::Arc;
use std::time::Instant;

use model::gguf::GgufModel;
use model::ops::argmax;
use model::{ChatTemplate, FloatModel, HfTokenizer, Message};
use quant::DataType;
use ref_backend::{CompileOptions, WeightType, compile};
use test_support::harness::{Harness, max_abs_diff};

fn smollm2(test: &str) -> Option<(GgufModel, [u8; 32])> {
    let path = test_support::fetched::smollm2_gguf(test)?;
    let sha = model::llama2c::sha256(&std::fs::read(&path).expect("model file reads"));
    Some((GgufModel::load(&path).expect("SmolLM2 loads"), sha))
}

/// The chat prompt "What is the capital of France?" through the model's ChatML template.
fn chat_prompt(m: &GgufModel) -> Vec<u32> {
    let tok = HfTokenizer::from_gguf(&m.file).expect("tokenizer");
    let text = ChatTemplate::from_gguf(&m.file)
        .expect("template")
        .render_chat(
            &[Message::new("user", "What is the capital of France?")],
            true,
        )
        .expect("renders");
    tok.encode(&text, true).expect("encodes")
}

/// f32 weights + f32 KV: 64 greedy tokens after the chat prompt equal the float model's, every
/// logit within 1e-4, and the answer is the float model's "The capital of France is Paris."
#[test]
fn f32_graph_answers_the_chat_question_like_the_float_model() {
    let Some((m, sha)) = smollm2("f32_graph_answers_the_chat_question") else {
        return;
    };
    let t0 = Instant::now();
    let prompt = chat_prompt(&m);
    let context = 128;
    assert!(
        prompt.len() + 64 <= context,
        "{} prompt tokens",
        prompt.len()
    );
    let mut o = CompileOptions::new(context, vec![1]);
    o.kv_dtype = DataType::F32;
    o.weights = WeightType::F32;
    let model = compile(&m.config, &*m.weights, &[], &o, sha, &mut |_| {}).expect("compiles");
    assert_eq!(model.model_sha256(), sha);
    let g = model.graph_for_ar(1).expect("AR-1");
    let mut h = Harness::for_model(&model);
    let mut float = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), context).unwrap();
    let (mut worst, mut generated) = (0.0f32, Vec::new());
    let mut token = prompt[0];
    for pos in 0..prompt.len() + 63 {
        let want = float.forward(token, pos).unwrap();
        let got = h.step(g, &[token]);
        worst = worst.max(max_abs_diff(want, &got));
        let next = argmax(want) as u32;
        assert_eq!(argmax(&got) as u32, next, "greedy token at position {pos}");
        token = match prompt.get(pos + 1) {
            Some(&t) => t,
            None => {
                generated.push(next);
                next
            }
        };
    }
    assert_eq!(generated.len(), 64);
    assert!(worst <= 1e-4, "max |logit difference| {worst}");
    let stop = m.config.special.stop_tokens();
    let end = generated.iter().position(|t| stop.contains(t));
    let tok = HfTokenizer::from_gguf(&m.file).unwrap();
    let answer = tok.decode(&generated[..end.unwrap_or(64)], true).unwrap();
    assert_eq!(answer, "The capital of France is Paris.");
    eprintln!(
        "64 tokens equal, max |logit difference| {worst:e}, {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
