//! The Llama-family model description: geometry, normalization, RoPE, output and special tokens.
//! Every loader (llama2.c, GGUF, safetensors) fills one [`LlamaConfig`] and validates it here.

use crate::Error;

/// Upper bounds accepted for a description: generous for real models, small enough that size
/// arithmetic cannot overflow and a corrupted file fails before allocating.
pub mod limits {
    /// Max `dim`.
    pub const MAX_DIM: usize = 1 << 16;
    /// Max `hidden_dim`.
    pub const MAX_HIDDEN_DIM: usize = 1 << 18;
    /// Max `n_layers`.
    pub const MAX_LAYERS: usize = 1 << 10;
    /// Max `n_heads` (and `n_kv_heads`).
    pub const MAX_HEADS: usize = 1 << 10;
    /// Max `head_dim`.
    pub const MAX_HEAD_DIM: usize = 1 << 16;
    /// Max `vocab_size`.
    pub const MAX_VOCAB: usize = 1 << 22;
    /// Max `context_length`.
    pub const MAX_CONTEXT: usize = 1 << 24;
}

/// How the two halves of each rotated RoPE pair are laid out within a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopePairing {
    /// Pairs `(2k, 2k+1)`: llama2.c checkpoints and GGUF files (llama.cpp's converter permutes
    /// the Q/K projection rows into this layout).
    Adjacent,
    /// Pairs `(k, k + head_dim/2)`: Hugging Face safetensors (`rotate_half`).
    HalfSplit,
}

/// Llama 3's `llama3` RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// Divisor for low frequencies.
    pub factor: f32,
    /// Wavelengths longer than `original_context / low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f32,
    /// Wavelengths shorter than `original_context / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context length the model was pre-trained with.
    pub original_context: usize,
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// Base frequency (10000 for llama2.c, 1e5 for SmolLM2, 5e5 for Llama 3).
    pub theta: f32,
    /// Optional frequency scaling.
    pub scaling: Option<Llama3Scaling>,
    /// Pair layout of Q and K.
    pub pairing: RopePairing,
}

/// Special token ids (each below `vocab_size` when present).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn (chat models whose turn end differs from `eos`).
    pub eot: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

impl SpecialTokens {
    /// Ids that end generation: `eos` and `eot`, deduplicated.
    pub fn stop_tokens(&self) -> Vec<u32> {
        let mut v: Vec<u32> = [self.eos, self.eot].into_iter().flatten().collect();
        v.dedup();
        v
    }
}

/// Checks a file's count of rotated dimensions per head (`rope.dimension_count`, a bundle's
/// `rope-dim` doubled, `partial_rotary_factor` times `head_dim`) against `head_dim`. htpkv rotates
/// whole heads (the shared forward, the reference executor and the runtime's cos/sin tables all
/// take `head_dim / 2` frequencies), so anything but `head_dim` is refused: a count that no model
/// can have (zero, odd, above `head_dim`) as invalid, an even one below `head_dim` as partial
/// RoPE, which is not supported. The reason is for an error naming the file and the field.
pub fn full_rope_only(rotated: usize, head_dim: usize) -> Result<(), String> {
    if rotated == head_dim {
        return Ok(());
    }
    if rotated == 0 || rotated % 2 == 1 || rotated > head_dim {
        return Err(format!(
            "{rotated} rotated dimensions per head is invalid: RoPE rotates an even number of \
             dimensions, at least 2 and at most the head's {head_dim}"
        ));
    }
    Err(format!(
        "partial RoPE ({rotated} of the head's {head_dim} dimensions rotated) is not supported: \
         htpkv rotates whole heads"
    ))
}

/// The description of one Llama-family decoder (Llama 1–3, SmolLM, TinyLlama, Qwen2 with Q/K/V
/// biases). Weight shapes follow from it; see [`crate::Tensor::shape`].
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Number of transformer layers.
    pub n_layers: usize,
    /// Residual stream width.
    pub dim: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head (usually `dim / n_heads`).
    pub head_dim: usize,
    /// FFN hidden width.
    pub hidden_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Maximum context the model was trained for.
    pub context_length: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// True when the classifier is the token embedding.
    pub tied_output: bool,
    /// True when Q, K and V projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Special token ids.
    pub special: SpecialTokens,
    /// Per-layer attention windows: empty when every layer is global, else one entry per layer,
    /// `None` for a global layer and `Some(W)` for a sliding-window layer whose token at position
    /// `p` attends to positions `p - W + 1 ..= p` only (itself and the `W - 1` before it: Hugging
    /// Face's `sliding_window` and llama.cpp's SWA convention). See [`LlamaConfig::layer_window`].
    pub layer_windows: Vec<Option<usize>>,
}

/// Largest sliding window accepted (the largest context).
const MAX_CONTEXT_WINDOW: usize = limits::MAX_CONTEXT;

fn bounded(field: &'static str, value: usize, max: usize) -> Result<(), Error> {
    if value == 0 {
        Err(Error::config(field, value, "must be positive"))
    } else if value > max {
        Err(Error::config(
            field,
            value,
            format!("must be at most {max}"),
        ))
    } else {
        Ok(())
    }
}

fn positive_finite(field: &'static str, value: f32) -> Result<(), Error> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::config(field, value, "must be finite and positive"))
    }
}

impl LlamaConfig {
    /// Width of all query heads, `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of one position's keys (or values), `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads per KV head.
    pub fn kv_mul(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The attention window of `layer`: `None` for a global layer, `Some(W)` for a sliding one.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }

    /// Sets window `window` on `layers` (the others stay as they are, global by default).
    pub fn with_layer_windows(mut self, layers: &[usize], window: usize) -> LlamaConfig {
        self.layer_windows.resize(self.n_layers, None);
        for &l in layers {
            if let Some(w) = self.layer_windows.get_mut(l) {
                *w = Some(window);
            }
        }
        self
    }

    /// Checks every dimension against [`limits`], divisibility (KV heads divide heads, head_dim
    /// even), finite positive epsilon/theta/scaling and special ids below the vocabulary.
    pub fn validate(&self) -> Result<(), Error> {
        use limits::*;
        bounded("n_layers", self.n_layers, MAX_LAYERS)?;
        bounded("dim", self.dim, MAX_DIM)?;
        bounded("n_heads", self.n_heads, MAX_HEADS)?;
        bounded("n_kv_heads", self.n_kv_heads, MAX_HEADS)?;
        bounded("head_dim", self.head_dim, MAX_HEAD_DIM)?;
        bounded("hidden_dim", self.hidden_dim, MAX_HIDDEN_DIM)?;
        bounded("vocab_size", self.vocab_size, MAX_VOCAB)?;
        bounded("context_length", self.context_length, MAX_CONTEXT)?;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            let why = format!("must divide n_heads = {}", self.n_heads);
            return Err(Error::config("n_kv_heads", self.n_kv_heads, why));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::config(
                "head_dim",
                self.head_dim,
                "must be even for RoPE",
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0 && self.rms_eps < 1.0) {
            return Err(Error::config("rms_eps", self.rms_eps, "must be in (0, 1)"));
        }
        positive_finite("rope.theta", self.rope.theta)?;
        if let Some(s) = &self.rope.scaling {
            s.validate()?;
        }
        self.validate_windows()?;
        self.validate_special()
    }

    fn validate_windows(&self) -> Result<(), Error> {
        let w = &self.layer_windows;
        if !w.is_empty() && w.len() != self.n_layers {
            let why = format!("must list one window per layer ({})", self.n_layers);
            return Err(Error::config("layer_windows", w.len(), why));
        }
        for window in w.iter().flatten() {
            bounded("layer_windows", *window, MAX_CONTEXT_WINDOW)?;
        }
        Ok(())
    }

    fn validate_special(&self) -> Result<(), Error> {
        let s = &self.special;
        let ids = [
            ("bos", s.bos),
            ("eos", s.eos),
            ("eot", s.eot),
            ("pad", s.pad),
        ];
        for (field, id) in ids {
            if let Some(id) = id
                && id as usize >= self.vocab_size
            {
                let why = format!("must be below vocab_size = {}", self.vocab_size);
                return Err(Error::config(field, id, why));
            }
        }
        Ok(())
    }
}

impl Llama3Scaling {
    fn validate(&self) -> Result<(), Error> {
        positive_finite("rope.scaling.factor", self.factor)?;
        positive_finite("rope.scaling.low_freq_factor", self.low_freq_factor)?;
        positive_finite("rope.scaling.high_freq_factor", self.high_freq_factor)?;
        if self.high_freq_factor <= self.low_freq_factor {
            let why = format!("must exceed low_freq_factor = {}", self.low_freq_factor);
            return Err(Error::config(
                "rope.scaling.high_freq_factor",
                self.high_freq_factor,
                why,
            ));
        }
        bounded(
            "rope.scaling.original_context",
            self.original_context,
            limits::MAX_CONTEXT,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn tiny() -> LlamaConfig {
        LlamaConfig {
            n_layers: 2,
            dim: 16,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 4,
            hidden_dim: 24,
            vocab_size: 32,
            context_length: 16,
            rms_eps: 1e-5,
            rope: RopeConfig {
                theta: 10000.0,
                scaling: None,
                pairing: RopePairing::Adjacent,
            },
            tied_output: true,
            qkv_bias: false,
            special: SpecialTokens {
                bos: Some(1),
                eos: Some(2),
                ..SpecialTokens::default()
            },
            layer_windows: Vec::new(),
        }
    }

    fn field_of(c: &LlamaConfig) -> &'static str {
        match c.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn valid_description_passes_and_derives_widths() {
        let c = tiny();
        c.validate().unwrap();
        assert_eq!((c.q_dim(), c.kv_dim(), c.kv_mul()), (16, 8, 2));
        assert_eq!(c.special.stop_tokens(), vec![2]);
    }

    #[test]
    fn each_bad_field_is_named() {
        type Edit = Box<dyn Fn(&mut LlamaConfig)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("n_layers", Box::new(|c| c.n_layers = 0)),
            ("dim", Box::new(|c| c.dim = limits::MAX_DIM + 1)),
            ("n_kv_heads", Box::new(|c| c.n_kv_heads = 3)),
            ("head_dim", Box::new(|c| c.head_dim = 5)),
            ("vocab_size", Box::new(|c| c.vocab_size = usize::MAX)),
            ("rms_eps", Box::new(|c| c.rms_eps = f32::NAN)),
            ("rope.theta", Box::new(|c| c.rope.theta = -1.0)),
            ("eos", Box::new(|c| c.special.eos = Some(32))),
            (
                "layer_windows",
                Box::new(|c| c.layer_windows = vec![Some(4)]),
            ),
            (
                "layer_windows",
                Box::new(|c| c.layer_windows = vec![None, Some(0)]),
            ),
            (
                "rope.scaling.high_freq_factor",
                Box::new(|c| {
                    c.rope.scaling = Some(Llama3Scaling {
                        factor: 8.0,
                        low_freq_factor: 4.0,
                        high_freq_factor: 1.0,
                        original_context: 8192,
                    })
                }),
            ),
        ];
        for (want, edit) in cases {
            let mut c = tiny();
            edit(&mut c);
            assert_eq!(field_of(&c), want);
        }
    }
}
