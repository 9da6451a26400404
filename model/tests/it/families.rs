//! Every family against llama.cpp: each toy GGUF of `test_support::families` (written the way
//! llama.cpp's converter writes that architecture) is loaded by htpkv's GGUF reader through its
//! family, run by the one f32 forward, and its logits compared with llama.cpp's recorded on the
//! same file and tokens (`model/tests/fixtures/llamacpp/`, made by
//! `scripts/llamacpp-reference.py toys` at the commit each fixture names), with the perplexity
//! over every position.

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
        let mut fm = FloatModel::new(m.config.clone(), Arc::clone(&m.weights), n).unwrap();
        let (mut nll, mut checked) = (0.0, 0);
        for (p, &t) in fx.tokens.iter().enumerate() {
            let logits = fm.forward(t, p).unwrap().to_vec();
            if let Some(i) = fx.positions.iter().position(|&q| q == p) {
                let want = &fx.logits[i];
                let scale = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
                let diff = logits
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    diff <= tolerance(family) * scale,
                    "{family} position {p}: max |logit diff| {diff} of max |logit| {scale}"
                );
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
