use std::collections::HashMap;

use safetensors::tensor::TensorView;
use serde_json::json;
use test_support::files::ScratchDir;

use super::*;
use crate::forward::tests::synthetic;
use crate::{LayerTensor, Tensor, WeightSource};

pub(crate) fn tiny_json() -> Json {
    json!({
        "model_type": "llama", "hidden_size": 16, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 24,
        "vocab_size": 32, "max_position_embeddings": 16, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": [2, 3]
    })
}

#[test]
fn config_json_fills_the_description() {
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    assert_eq!(
        (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim),
        (2, 16, 4, 2, 4)
    );
    assert_eq!((c.hidden_dim, c.vocab_size, c.context_length), (24, 32, 16));
    assert_eq!(
        (c.rms_eps, c.rope.theta, c.rope.pairing),
        (1e-5, 1e5, RopePairing::HalfSplit)
    );
    assert!(c.tied_output && !c.block.qkv_bias && c.rope.scaling.is_none());
    assert_eq!(
        (c.special.bos, c.special.eos, c.special.eot),
        (Some(1), Some(2), Some(3))
    );
    let mut j = tiny_json();
    j["model_type"] = json!("qwen2");
    j["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = config_from_json(&j.to_string(), "t").unwrap();
    assert!(c.block.qkv_bias);
    let s = c.rope.scaling.unwrap();
    assert_eq!(
        (
            s.factor,
            s.low_freq_factor,
            s.high_freq_factor,
            s.original_context
        ),
        (32.0, 1.0, 4.0, 8192)
    );
}

#[test]
fn sliding_windows_come_from_layer_types_or_mistral() {
    let mut j = tiny_json();
    j["sliding_window"] = json!(4);
    let c = config_from_json(&j.to_string(), "t").unwrap();
    assert!(c.layer_windows.is_empty(), "llama ignores sliding_window");
    j["model_type"] = json!("mistral");
    let c = config_from_json(&j.to_string(), "t").unwrap();
    assert_eq!(c.layer_windows, [Some(4), Some(4)]);
    j["layer_types"] = json!(["sliding_attention", "full_attention"]);
    let c = config_from_json(&j.to_string(), "t").unwrap();
    assert_eq!((c.layer_window(0), c.layer_window(1)), (Some(4), None));
    for (types, window, why) in [
        (
            json!(["sliding_attention"]),
            json!(4),
            "one window per layer",
        ),
        (json!(["sliding_attention", "local"]), json!(4), "\"local\""),
        (json!("sliding_attention"), json!(4), "not a list"),
        (
            json!(["sliding_attention", "full_attention"]),
            json!(null),
            "sliding_window is missing",
        ),
    ] {
        j["layer_types"] = types;
        j["sliding_window"] = window;
        let err = config_from_json(&j.to_string(), "t").unwrap_err();
        let err = match err {
            Error::InFile { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn config_json_errors_name_the_field() {
    let cases: [(&str, Json); 5] = [
        ("hidden_size", json!(null)),
        ("model_type", json!("gpt2")),
        ("rope_scaling", json!({"type": "yarn", "factor": 4.0})),
        ("eos_token_id", json!("</s>")),
        ("num_key_value_heads", json!(3)),
    ];
    for (key, value) in cases {
        let mut j = tiny_json();
        j[key] = value;
        let err = config_from_json(&j.to_string(), "cfg.json").unwrap_err();
        let text = format!("{err}");
        let named = text.contains(key)
            || matches!(&err, Error::InFile { origin, source } if origin == "cfg.json"
                && matches!(**source, Error::InvalidConfig { field: "n_kv_heads", .. }));
        assert!(named, "{key}: {text}");
    }
    assert!(matches!(
        config_from_json("{", "x"),
        Err(Error::HfConfig { .. })
    ));
}

fn encode(data: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F16 => data
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::BF16 => data
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes `w` as HF safetensors in two shards (layer 1 in the second), with `dtype_of`
/// choosing each tensor's dtype.
pub(crate) fn write_model(
    dir: &Path,
    c: &LlamaConfig,
    w: &Weights,
    dtype_of: impl Fn(Tensor) -> Dtype,
) {
    type Entry = (String, Dtype, Vec<usize>, Vec<u8>);
    let mut shards: [Vec<Entry>; 2] = Default::default();
    for t in Tensor::required(c) {
        let shard = usize::from(matches!(t, Tensor::Layer(1, _)));
        let dt = dtype_of(t);
        shards[shard].push((hf_name(t), dt, t.shape(c), encode(w.tensor(t).unwrap(), dt)));
    }
    for (i, shard) in shards.iter().enumerate() {
        let views: HashMap<String, TensorView<'_>> = shard
            .iter()
            .map(|(n, dt, shape, b)| (n.clone(), TensorView::new(*dt, shape.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(
            dir.join(format!("model-0000{}-of-00002.safetensors", i + 1)),
            bytes,
        )
        .unwrap();
    }
}

#[test]
fn sharded_safetensors_load_in_f32_f16_bf16() {
    let dir = ScratchDir::new("hf-shards");
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    let w = synthetic(&c, 11);
    let dtype_of = |t: Tensor| match t {
        Tensor::Layer(_, LayerTensor::Q) => Dtype::F16,
        Tensor::Layer(_, LayerTensor::Down) => Dtype::BF16,
        _ => Dtype::F32,
    };
    write_model(&dir, &c, &w, dtype_of);
    let m = HfModel::load(&dir).unwrap();
    assert_eq!(m.config, c);
    for t in Tensor::required(&c) {
        let (got, want) = (m.weights.tensor(t).unwrap(), w.tensor(t).unwrap());
        let tol = match dtype_of(t) {
            Dtype::F16 => 1e-3,
            Dtype::BF16 => 1e-2,
            _ => 0.0,
        };
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol * w.abs().max(1e-2), "{t}: {g} vs {w}");
        }
    }
}

#[test]
fn missing_misshapen_and_unsupported_tensors_are_errors() {
    let dir = ScratchDir::new("hf-bad");
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    assert!(matches!(
        HfModel::load(&dir),
        Err(Error::MissingTensor { .. })
    ));
    let w = synthetic(&c, 12);
    write_model(&dir, &c, &w, |_| Dtype::F32);
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = HfModel::load(&dir).unwrap_err();
    assert!(
        matches!(&err, Error::BadTensor { name, .. } if name.starts_with("model.layers.1.")),
        "{err}"
    );
    // The second shard again, with one tensor of the wrong shape.
    let mut j = tiny_json();
    j["intermediate_size"] = json!(20);
    std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
    write_model(&dir, &c, &w, |_| Dtype::F32);
    assert!(matches!(HfModel::load(&dir), Err(Error::BadTensor { .. })));
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    // Same byte count as f32, but integers.
    write_model(&dir, &c, &w, |t| {
        if t == Tensor::OutputNorm {
            Dtype::I32
        } else {
            Dtype::F32
        }
    });
    let err = HfModel::load(&dir).unwrap_err();
    assert!(matches!(err, Error::Safetensors { .. }), "{err}");
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), b"garbage").unwrap();
    assert!(matches!(
        HfModel::load(&dir),
        Err(Error::Safetensors { .. })
    ));
}

/// Fuzzing of the safetensors path (issue 14): a valid shard with random byte edits and
/// truncations, through the header parser and the tensor conversion. Each must end in `Ok` or a
/// typed error, never a panic.
mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    fn shard() -> (LlamaConfig, Vec<u8>) {
        let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
        let dir = ScratchDir::new("hf-fuzz-shard");
        write_model(&dir, &c, &synthetic(&c, 3), |_| Dtype::F16);
        let bytes = std::fs::read(dir.join("model-00001-of-00002.safetensors")).unwrap();
        (c, bytes)
    }

    fn check(c: &LlamaConfig, bytes: &[u8]) {
        let Ok(st) = SafeTensors::deserialize(bytes) else {
            return;
        };
        let mut weights = Weights::with_layers(c.n_layers);
        let fam = crate::family::by_hf_type("llama").unwrap();
        let mut wanted = crate::family::layout(fam.hf_tensor, c);
        let _ = take_tensors(&st, fam, &mut wanted, &mut weights, Path::new("fuzz"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn edited_and_truncated_shards(
            edits in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..8),
            header_edits in proptest::collection::vec((any::<Index>(), any::<u8>()), 0..4),
            cut in any::<Index>(),
        ) {
            let (c, mut bytes) = shard();
            for (at, value) in edits {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            // The JSON header sits in the first few hundred bytes: edit it more often.
            let header = bytes.len().min(512);
            for (at, value) in header_edits {
                bytes[at.index(header)] = value;
            }
            check(&c, &bytes);
            check(&c, &bytes[..cut.index(bytes.len() + 1)]);
        }
    }
}

/// Writes one extra shard `name` holding `tensors` (f32).
fn write_shard(dir: &Path, name: &str, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| encode(&t.2, Dtype::F32)).collect();
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            let view = TensorView::new(Dtype::F32, t.1.clone(), b).unwrap();
            (t.0.clone(), view)
        })
        .collect();
    std::fs::write(dir.join(name), safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn a_layer_count_below_the_shards_layers_is_refused_naming_shard_and_tensor() {
    let dir = ScratchDir::new("hf-fewer-layers");
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    write_model(&dir, &c, &synthetic(&c, 41), |_| Dtype::F32);
    let mut j = tiny_json();
    j["num_hidden_layers"] = json!(1);
    std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
    let shard = dir.join("model-00002-of-00002.safetensors");
    for err in [
        HfModel::load(&dir).unwrap_err(),
        crate::load::describe(&dir).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(msg.starts_with(&shard.display().to_string()), "{msg}");
        assert!(
            msg.contains("tensor model.layers.1.") && msg.contains("not part"),
            "{msg}"
        );
    }
    // An unknown extra tensor is refused the same way.
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    write_shard(
        &dir,
        "extra.safetensors",
        &[("model.mystery".into(), vec![2], vec![0.0; 2])],
    );
    let msg = HfModel::load(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("extra.safetensors: tensor model.mystery is not part"),
        "{msg}"
    );
}

#[test]
fn a_tensor_in_two_shards_is_refused_naming_both() {
    let dir = ScratchDir::new("hf-repeated");
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    let w = synthetic(&c, 42);
    write_model(&dir, &c, &w, |_| Dtype::F32);
    let norm = w.tensor(Tensor::OutputNorm).unwrap().to_vec();
    write_shard(
        &dir,
        "model-00003-of-00003.safetensors",
        &[("model.norm.weight".into(), vec![16], norm)],
    );
    let msg = HfModel::load(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("model-00001-of-00002.safetensors: tensor model.norm.weight"),
        "{msg}"
    );
    assert!(
        msg.contains("is also in ") && msg.contains("model-00003-of-00003"),
        "{msg}"
    );
}

#[test]
fn a_nan_weight_is_refused_when_read_naming_shard_and_tensor() {
    let dir = ScratchDir::new("hf-nan");
    std::fs::write(dir.join("config.json"), tiny_json().to_string()).unwrap();
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    let mut w = synthetic(&c, 43);
    let mut up = w
        .tensor(Tensor::Layer(1, LayerTensor::Up))
        .unwrap()
        .to_vec();
    up[5] = f32::NAN;
    w.set(Tensor::Layer(1, LayerTensor::Up), up).unwrap();
    write_model(&dir, &c, &w, |_| Dtype::BF16);
    let msg = HfModel::load(&dir).unwrap_err().to_string();
    assert!(msg.contains("model-00002-of-00002.safetensors: tensor model.layers.1.mlp.up_proj.weight holds NaN at element 5"), "{msg}");
}

/// Issue 21, finding 10, and issue 37: a `partial_rotary_factor` no head can have is refused,
/// naming the field; a fraction of the head is read as partial rotary.
#[test]
fn a_partial_rotary_factor_is_read_or_refused_naming_the_field() {
    let mut j = tiny_json();
    j["partial_rotary_factor"] = json!(1.0);
    assert_eq!(
        config_from_json(&j.to_string(), "cfg.json")
            .unwrap()
            .rope
            .rotated,
        None
    );
    j["partial_rotary_factor"] = json!(0.5);
    let c = config_from_json(&j.to_string(), "cfg.json").unwrap();
    assert_eq!(c.rope.rotated, Some(c.head_dim / 2));
    for (factor, says) in [(0.0, "invalid"), (2.0, "invalid")] {
        j["partial_rotary_factor"] = json!(factor);
        let msg = config_from_json(&j.to_string(), "cfg.json")
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("bad model config cfg.json: partial_rotary_factor = "),
            "{msg}"
        );
        assert!(msg.contains(says), "{msg}");
    }
}

#[test]
fn a_shard_that_is_no_regular_file_is_refused_by_the_capped_reader() {
    let dir = ScratchDir::new("hf-dir-shard");
    let shard = dir.join("model.safetensors");
    std::fs::create_dir(&shard).unwrap();
    let c = config_from_json(&tiny_json().to_string(), "t").unwrap();
    let err = check_folder(&dir, &c).unwrap_err();
    assert!(
        matches!(err, Error::File(crate::fsio::FileError::IsDirectory { .. })),
        "{err:?}"
    );
}

#[test]
fn gemma3_and_longrope_configs_are_read_or_refused_naming_the_field() {
    let mut j = tiny_json();
    j["model_type"] = json!("phi3");
    j["max_position_embeddings"] = json!(64);
    j["original_max_position_embeddings"] = json!(16);
    j["rope_scaling"] = json!({"type": "longrope", "short_factor": [1.0, 1.5],
        "long_factor": [2.0, 3.0]});
    let c = config_from_json(&j.to_string(), "t").unwrap();
    let l = c.rope.long_rope.as_ref().unwrap();
    assert_eq!(
        (l.short.as_slice(), l.long.as_slice()),
        (&[1.0, 1.5][..], &[2.0, 3.0][..])
    );
    assert_eq!(c.rope.freq_factors, Some(vec![1.0, 1.5]));
    let want = (1.0 + 4f64.ln() / 16f64.ln()).sqrt() as f32;
    assert_eq!(c.rope.attn_factor, Some(want));
    j["rope_scaling"]["short_factor"] = json!("no");
    let err = config_from_json(&j.to_string(), "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("rope_scaling.short_factor"), "{err}");

    let mut j = tiny_json();
    j["model_type"] = json!("gemma3_text");
    j["sliding_window"] = json!(4);
    let c = config_from_json(&j.to_string(), "t").unwrap();
    assert_eq!(
        c.layer_windows,
        [Some(4), Some(4)],
        "every sixth layer is global"
    );
    assert_eq!(c.embed_scale, Some(4.0));
    j["hidden_activation"] = json!("relu");
    let err = config_from_json(&j.to_string(), "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("hidden_activation relu"), "{err}");
}
