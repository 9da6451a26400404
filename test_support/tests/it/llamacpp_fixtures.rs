//! Each recorded llama.cpp fixture was made from exactly the toy GGUF that `families` writes now.

use model::llama2c::sha256_hex;
use test_support::families::{FAMILIES, llamacpp_fixture, toy_gguf};

#[test]
fn every_fixture_was_made_from_the_current_toy() {
    for family in FAMILIES {
        let fx = llamacpp_fixture(family);
        let bytes = toy_gguf(family).unwrap();
        assert_eq!(
            fx.gguf_sha256,
            sha256_hex(&bytes),
            "{family}: the toy GGUF changed since its llama.cpp fixture was recorded; \
             regenerate the fixtures (model/tests/fixtures/llamacpp/README.md)"
        );
        assert_eq!(fx.family, family);
    }
}

#[test]
fn every_fixture_is_complete_and_not_flat() {
    for family in FAMILIES {
        let fx = llamacpp_fixture(family);
        assert!(
            fx.tokens.iter().all(|t| (*t as usize) < fx.n_vocab),
            "{family}"
        );
        assert_eq!(fx.logits.len(), fx.positions.len(), "{family}");
        for (row, p) in fx.logits.iter().zip(&fx.positions) {
            assert!(*p < fx.tokens.len(), "{family}: position {p}");
            assert_eq!(row.len(), fx.n_vocab, "{family}: position {p}");
            let mean = row.iter().sum::<f32>() / row.len() as f32;
            let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / row.len() as f32;
            assert!(var.sqrt() > 1.0, "{family}: flat logits at {p}");
        }
        assert!(fx.perplexity.is_finite() && fx.perplexity > 1.0, "{family}");
        assert!(!fx.llama_cpp_commit.is_empty(), "{family}");
    }
}
