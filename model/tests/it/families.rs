//! Every family against llama.cpp: each toy GGUF of `test_support::families` (written the way
//! llama.cpp's converter writes that architecture) is loaded by htpkv's GGUF reader through its
//! family, run by the one f32 forward, and its logits compared with llama.cpp's recorded on the
//! same file and tokens (`model/tests/fixtures/llamacpp/`, made by
//! `scripts/llamacpp-reference.py toys` at the commit each fixture names), with the perplexity
//! over every position. The float model's context is llama.cpp's, so that LongRoPE picks the same
//! factors (`phi3-long`: long, `phi3-short`: short).

use std::sync::Arc;

use model::FloatModel;
use model::gguf::GgufModel;
use test_support::families::{FAMILIES, llamacpp_fixture, toy_gguf};
use test_support::files::ScratchDir;

/// Tolerance relative to the largest |logit|: f32 against llama.cpp's f32 CPU path; gemma3's
/// GELU goes through llama.cpp's f16 table (measured 9.8e-5 of the largest logit by an
/// independent f64 forward), so it gets 3e-4.
fn tolerance(family: &str) -> f32 {
    if family == "gemma3" { 3e-4 } else { 2e-5 }
}

/// Asserts that `got` is within `tolerance` times `want`'s largest |logit| of `want` everywhere.
fn assert_close(got: &[f32], want: &[f32], tolerance: f32, (family, p): (&str, usize)) {
    let scale = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    let diff = (got.iter().zip(want))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        diff <= tolerance * scale,
        "{family} position {p}: max |logit diff| {diff} of max |logit| {scale}"
    );
}

/// The log-softmax of `logits` at `token`.
fn log_prob(logits: &[f32], token: u32) -> f64 {
    let m = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
    logits[token as usize] as f64 - m - z.ln()
}

#[test]
fn every_family_matches_llama_cpp_on_its_toy() {
    let dir = ScratchDir::new("families");
    for family in FAMILIES {
        let fx = llamacpp_fixture(family);
        let path = dir.join(format!("{family}.gguf"));
        std::fs::write(&path, toy_gguf(family).expect("a toy of every family")).unwrap();
        let m = GgufModel::load(&path).unwrap_or_else(|e| panic!("{family}: {e}"));
        let n = fx.tokens.len();
        let mut fm = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), fx.context).unwrap();
        let (mut nll, mut checked) = (0.0, 0);
        for (p, &t) in fx.tokens.iter().enumerate() {
            let logits = fm.forward(t, p).unwrap().to_vec();
            if let Some(i) = fx.positions.iter().position(|&q| q == p) {
                assert_close(&logits, &fx.logits[i], tolerance(family), (family, p));
                checked += 1;
            }
            if p + 1 < n {
                nll -= log_prob(&logits, fx.tokens[p + 1]);
            }
        }
        assert_eq!(checked, fx.positions.len(), "{family}");
        let ln_ppl = nll / (n - 1) as f64;
        let want = fx.perplexity.ln();
        assert!(
            (ln_ppl - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{family}: ln perplexity {ln_ppl} against llama.cpp's {want}"
        );
    }
}

#[test]
fn phi3_long_rope_is_read_into_the_description_and_a_lone_factor_set_is_refused() {
    use test_support::families::{long_rope_attn_factor, long_rope_factors, toy_spec, toy_writer};
    let dir = ScratchDir::new("longrope");
    let path = dir.join("phi3-long.gguf");
    std::fs::write(&path, toy_gguf("phi3-long").unwrap()).unwrap();
    let c = GgufModel::describe(&path).unwrap().0;
    let (short, long) = long_rope_factors(24);
    let l = c.rope.long_rope.as_ref().unwrap();
    assert_eq!((&l.short, &l.long, l.original_context), (&short, &long, 64));
    assert_eq!(
        c.rope.freq_factors.as_ref(),
        Some(&short),
        "loaded for short contexts"
    );
    assert_eq!(c.rope.attn_factor, Some(long_rope_attn_factor(256, 64)));
    assert_eq!(c.clone().for_context(65).rope.freq_factors, Some(long));

    let mut w = toy_writer(&toy_spec("phi3").unwrap());
    w.tensor_f32("rope_factors_long.weight", &[12], &[1.0; 12]);
    std::fs::write(&path, w.to_bytes()).unwrap();
    let err = GgufModel::describe(&path).unwrap_err().to_string();
    assert!(
        err.contains("rope_factors_short.weight") && err.contains("phi3-long.gguf"),
        "{err}"
    );
}

/// The logits of `tokens` at every position, with a context of `context`.
fn logits_of(m: &model::LoadedModel, tokens: &[u32], context: usize) -> Vec<Vec<f32>> {
    let mut fm = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), context).unwrap();
    (tokens.iter().enumerate())
        .map(|(p, &t)| fm.forward(t, p).unwrap().to_vec())
        .collect()
}

#[test]
fn a_hugging_face_folder_gives_the_logits_of_the_same_weights_in_gguf() {
    for family in ["gemma3", "phi3", "phi3-long", "phi3-short"] {
        let fx = llamacpp_fixture(family);
        let dir = ScratchDir::new("hf-folder");
        let gguf = dir.join("model.gguf");
        std::fs::write(&gguf, toy_gguf(family).unwrap()).unwrap();
        let folder = dir.join("hf");
        std::fs::create_dir(&folder).unwrap();
        test_support::hf::write_toy_hf_folder(family, &folder).unwrap();
        let (g, h) = (model::load(&gguf).unwrap(), model::load(&folder).unwrap());
        assert_eq!(g.config.rope, h.config.rope, "{family}");
        assert_eq!(g.config.layer_windows, h.config.layer_windows, "{family}");
        assert_eq!(
            g.weights, h.weights,
            "{family}: the same weights after folding"
        );
        let text = "the capital of France is Paris";
        assert_eq!(
            g.tokenizer.encode(text, true).unwrap(),
            h.tokenizer.encode(text, true).unwrap()
        );
        let (a, b) = (
            logits_of(&g, &fx.tokens, fx.context),
            logits_of(&h, &fx.tokens, fx.context),
        );
        for (p, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_close(y, x, 1e-6, (family, p));
        }
    }
}
