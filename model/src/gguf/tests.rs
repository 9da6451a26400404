use std::io::Cursor;

use super::*;
use crate::config::tests::tiny;
use crate::forward::tests::synthetic;
use crate::gguf_file::tests::Writer;
use crate::{Error, WeightSource};

/// A llama GGUF of the tiny description with synthetic f32 weights.
pub(crate) fn tiny_gguf(c: &LlamaConfig, w: &Weights) -> Writer {
    let mut g = Writer::default();
    g.str("general.architecture", "llama")
        .u32("llama.block_count", c.n_layers as u32)
        .u32("llama.embedding_length", c.dim as u32)
        .u32("llama.attention.head_count", c.n_heads as u32)
        .u32("llama.attention.head_count_kv", c.n_kv_heads as u32)
        .u32("llama.feed_forward_length", c.hidden_dim as u32)
        .u32("llama.context_length", c.context_length as u32)
        .f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps)
        .f32("llama.rope.freq_base", c.rope.theta)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2);
    for t in Tensor::required(c) {
        let dims: Vec<u64> = t.shape(c).iter().rev().map(|&d| d as u64).collect();
        g.f32_tensor(&gguf_name(t), &dims, w.tensor(t).unwrap());
    }
    g
}

fn load(g: &Writer) -> Result<(LlamaConfig, Weights), Error> {
    let bytes = g.bytes();
    let file = GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).unwrap();
    let config = llama_config(&file, "test.gguf", &mut Cursor::new(&bytes))?;
    let weights = read_weights(&file, &config, &mut Cursor::new(&bytes), "test.gguf")?;
    Ok((config, weights))
}

#[test]
fn description_and_weights_round_trip() {
    let c = tiny();
    let w = synthetic(&c, 21);
    let (got_c, got_w) = load(&tiny_gguf(&c, &w)).unwrap();
    assert_eq!(got_c, c);
    assert_eq!(got_w, w);
}

#[test]
fn untied_output_and_qwen2_biases_are_detected() {
    let mut c = tiny();
    c.tied_output = false;
    c.block.qkv_bias = true;
    c.rope.pairing = crate::RopePairing::HalfSplit;
    let w = synthetic(&c, 22);
    let mut g = tiny_gguf(&c, &w);
    for kv in &mut g.kv {
        kv.0 = kv.0.replace("llama.", "qwen2.");
        if kv.0 == "general.architecture" {
            kv.2 = crate::gguf_file::tests::gguf_str("qwen2");
        }
    }
    let (got_c, got_w) = load(&g).unwrap();
    assert_eq!(got_c, c);
    assert_eq!(got_w, w);
}

/// A new family is one file and one registry line (`family/toy.rs`, built in tests only): a
/// `toyarch` file with that family's tensor names (a fused gate/up, a post-FFN norm under a name of
/// its own) loads, its description has the family's block, and it runs the one forward.
#[test]
fn a_new_family_is_one_file_and_one_registry_line() {
    use crate::LayerTensor as L;
    let mut c = tiny();
    c.rope.pairing = crate::RopePairing::HalfSplit;
    (c.block.activation, c.block.qk_norm, c.block.post_ffn_norm) =
        (crate::Activation::GeluTanh, true, true);
    let w = synthetic(&c, 28);
    let mut g = tiny_gguf(&c, &w);
    for kv in &mut g.kv {
        kv.0 = kv.0.replace("llama.", "toyarch.");
        if kv.0 == "general.architecture" {
            kv.2 = crate::gguf_file::tests::gguf_str("toyarch");
        }
    }
    let h = c.hidden_dim;
    for l in 0..c.n_layers {
        let (gate, up) = (
            format!("blk.{l}.ffn_gate.weight"),
            format!("blk.{l}.ffn_up.weight"),
        );
        g.tensors.retain(|t| t.0 != gate && t.0 != up);
        let mut fused = w.tensor(Tensor::Layer(l, L::Up)).unwrap().to_vec();
        fused.extend_from_slice(w.tensor(Tensor::Layer(l, L::Gate)).unwrap());
        g.f32_tensor(
            &format!("blk.{l}.ffn_gate_up.weight"),
            &[c.dim as u64, 2 * h as u64],
            &fused,
        );
        for t in &mut g.tensors {
            if t.0 == format!("blk.{l}.post_ffw_norm.weight") {
                t.0 = format!("blk.{l}.ffn_post_norm.weight");
            }
        }
    }
    let (got_c, got_w) = load(&g).unwrap();
    assert_eq!(got_c, c);
    assert_eq!(got_w, w);
    let mut m = crate::FloatModel::new(got_c, std::sync::Arc::new(got_w), 4).unwrap();
    assert!(m.forward(3, 0).unwrap().iter().all(|v| v.is_finite()));
}

fn metadata_key(e: Error) -> String {
    match e {
        Error::Metadata { key, .. } => key,
        other => panic!("expected a metadata error, got {other:?}"),
    }
}

#[test]
fn metadata_problems_name_the_key() {
    let c = tiny();
    let w = synthetic(&c, 23);
    let edit = |f: &dyn Fn(&mut Writer)| {
        let mut g = tiny_gguf(&c, &w);
        f(&mut g);
        load(&g).unwrap_err()
    };
    let drop_key = |k: &'static str| move |g: &mut Writer| g.kv.retain(|kv| kv.0 != k);
    assert_eq!(
        metadata_key(edit(&drop_key("llama.block_count"))),
        "llama.block_count"
    );
    let arch = edit(&|g: &mut Writer| g.kv[0].2 = crate::gguf_file::tests::gguf_str("gpt2"));
    assert_eq!(metadata_key(arch), "general.architecture");
    let wrong_type = edit(&|g: &mut Writer| {
        g.kv.retain(|kv| kv.0 != "llama.embedding_length");
        g.str("llama.embedding_length", "16");
    });
    assert_eq!(metadata_key(wrong_type), "llama.embedding_length");
    let scaled = edit(&|g: &mut Writer| {
        g.str("llama.rope.scaling.type", "yarn");
    });
    assert_eq!(metadata_key(scaled), "llama.rope.scaling.type");
    // Llama 3.1/3.2's `rope_freqs` is read into the description: one divisor per rotated pair.
    let mut g = tiny_gguf(&c, &w);
    g.f32_tensor("rope_freqs.weight", &[2], &[1.0, 4.0]);
    assert_eq!(load(&g).unwrap().0.rope.freq_factors, Some(vec![1.0, 4.0]));
    let freqs = edit(&|g: &mut Writer| {
        g.f32_tensor("rope_freqs.weight", &[3], &[1.0, 1.0, 1.0]);
    });
    let Error::InFile { source, .. } = freqs else {
        panic!("{freqs:?}")
    };
    assert!(matches!(
        *source,
        Error::InvalidConfig {
            field: "rope.freq_factors",
            ..
        }
    ));
    let bad_heads = edit(&|g: &mut Writer| {
        g.kv.retain(|kv| kv.0 != "llama.attention.head_count_kv");
        g.u32("llama.attention.head_count_kv", 3);
    });
    let Error::InFile { origin, source } = bad_heads else {
        panic!("{bad_heads:?}")
    };
    assert_eq!(origin, "test.gguf");
    assert!(matches!(
        *source,
        Error::InvalidConfig {
            field: "n_kv_heads",
            ..
        }
    ));
}

#[test]
fn missing_or_misshapen_tensors_are_errors() {
    let c = tiny();
    let w = synthetic(&c, 24);
    let mut g = tiny_gguf(&c, &w);
    g.tensors.retain(|t| t.0 != "blk.1.ffn_up.weight");
    let err = load(&g).unwrap_err();
    assert!(
        matches!(&err, Error::BadTensor { name, .. } if name == "blk.1.ffn_up.weight"),
        "{err}"
    );
    let mut g = tiny_gguf(&c, &w);
    let t = g
        .tensors
        .iter_mut()
        .find(|t| t.0 == "blk.0.attn_k.weight")
        .unwrap();
    t.1 = vec![8, 16]; // transposed
    let err = load(&g).unwrap_err();
    assert!(
        err.to_string()
            == "test.gguf: tensor blk.0.attn_k.weight has shape [16, 8], the description needs [8, 16]",
        "{err}"
    );
}

#[test]
fn a_block_count_that_disagrees_with_the_tensors_is_refused_naming_file_and_tensor() {
    let c = tiny();
    let w = synthetic(&c, 25);
    let with_blocks = |n: u32| {
        let mut g = tiny_gguf(&c, &w);
        for kv in &mut g.kv {
            if kv.0 == "llama.block_count" {
                kv.2 = n.to_le_bytes().to_vec();
            }
        }
        let bytes = g.bytes();
        let file = GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).unwrap();
        llama_config(&file, "test.gguf", &mut Cursor::new(&bytes))
    };
    // Fewer layers than the file holds: the description (what budgets see) is refused already.
    let err = with_blocks(c.n_layers as u32 - 1).unwrap_err();
    let last = c.n_layers - 1;
    assert!(
        err.to_string()
            .starts_with(&format!("test.gguf: tensor blk.{last}.")),
        "{err}"
    );
    assert!(
        err.to_string().contains("is not part of the model"),
        "{err}"
    );
    // More layers than it holds.
    let err = with_blocks(1000).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("test.gguf: tensor blk.{}.", c.n_layers)),
        "{msg}"
    );
    assert!(msg.ends_with("is missing"), "{msg}");
    // An unknown tensor.
    let mut g = tiny_gguf(&c, &w);
    g.f32_tensor("blk.0.mystery.weight", &[2], &[0.0, 0.0]);
    let msg = load(&g).unwrap_err().to_string();
    assert!(
        msg.starts_with("test.gguf: tensor blk.0.mystery.weight is not part"),
        "{msg}"
    );
}

#[test]
fn a_nan_weight_is_refused_when_read_naming_file_and_tensor() {
    let c = tiny();
    let mut w = synthetic(&c, 26);
    let t = Tensor::Layer(0, crate::LayerTensor::Down);
    let mut down = w.tensor(t).unwrap().to_vec();
    down[3] = f32::INFINITY;
    w.set(t, down).unwrap();
    let msg = load(&tiny_gguf(&c, &w)).unwrap_err().to_string();
    assert_eq!(
        msg,
        "test.gguf: tensor blk.0.ffn_down.weight holds inf at element 3 (weights must be finite)"
    );
}

/// Issue 21, finding 10, and issue 37: a `rope.dimension_count` no model can have is refused,
/// naming the file and the key; an even count below the head width is partial RoPE, read into
/// the description.
#[test]
fn a_rope_dimension_count_is_checked_and_partial_rotary_is_read() {
    let c = tiny();
    let w = synthetic(&c, 27);
    let with_count = |n: u32| {
        let mut g = tiny_gguf(&c, &w);
        g.u32("llama.rope.dimension_count", n);
        let bytes = g.bytes();
        let file = GgufFile::read(Cursor::new(&bytes), bytes.len() as u64).unwrap();
        llama_config(&file, "test.gguf", &mut Cursor::new(&bytes))
    };
    assert_eq!(with_count(c.head_dim as u32).unwrap(), c);
    let hd = c.head_dim as u32;
    for (n, says) in [
        (0, "invalid"),
        (3, "invalid"),
        (hd - 1, "invalid"),
        (hd + 2, "invalid"),
        (1 << 30, "invalid"),
    ] {
        let err = with_count(n).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("test.gguf: metadata llama.rope.dimension_count: "),
            "{n}: {msg}"
        );
        assert!(msg.contains(says), "{n}: {msg}");
    }
    let partial = with_count(hd - 2).unwrap();
    assert_eq!(partial.rope.rotated, Some(c.head_dim - 2));
}
