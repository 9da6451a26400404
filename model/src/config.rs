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

/// Phi-3's LongRoPE (`rope_scaling` type `longrope`): two sets of per-pair frequency divisors,
/// the short ones for contexts up to the pre-training context and the long ones beyond it.
///
/// A static graph's context picks the set, by llama.cpp's rule for its context size: the long
/// factors when the context exceeds `original_context`, else the short ones, for every position
/// of the graph. A loaded description holds the short set in [`RopeConfig::freq_factors`] (the
/// choice of every graph up to `original_context` positions); [`LlamaConfig::for_context`]
/// rebinds it for a given context.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// Divisors for contexts up to `original_context` (`rotated / 2` values).
    pub short: Vec<f32>,
    /// Divisors for longer contexts (`rotated / 2` values).
    pub long: Vec<f32>,
    /// The context the model was pre-trained with (`original_max_position_embeddings`).
    pub original_context: usize,
}

impl LongRope {
    /// The divisors a graph of `context` positions rotates with.
    pub fn factors_for(&self, context: usize) -> &[f32] {
        if context > self.original_context {
            &self.long
        } else {
            &self.short
        }
    }
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base frequency (10000 for llama2.c, 1e5 for SmolLM2, 5e5 for Llama 3); the base of every
    /// global layer.
    pub theta: f32,
    /// Optional frequency scaling (Llama 3's `rope_scaling` from a Hugging Face config).
    pub scaling: Option<Llama3Scaling>,
    /// Pair layout of Q and K.
    pub pairing: RopePairing,
    /// Rotated dimensions per head (even, at most `head_dim`); `None` rotates the whole head.
    /// Phi-4-mini rotates three quarters of each head; the rest passes through unchanged.
    pub rotated: Option<usize>,
    /// Per-pair divisors of the frequencies (`rotated / 2` values): GGUF's `rope_freqs` tensor,
    /// Llama 3.1/3.2's scaling precomputed by the converter, or the set of [`LongRope`] the
    /// description is bound to.
    pub freq_factors: Option<Vec<f32>>,
    /// Phi-3's two sets of divisors; [`RopeConfig::freq_factors`] holds the one in use.
    pub long_rope: Option<LongRope>,
    /// Multiplier of every rotated component of Q and K, so of the rotated part of each
    /// attention score squared (llama.cpp's `rope.scaling.attn_factor`, Hugging Face's LongRoPE
    /// `attention_factor`); `None` for 1. Dimensions a partial rotary leaves alone are not scaled.
    pub attn_factor: Option<f32>,
    /// The base of sliding-window layers when it differs from `theta` (Gemma 3's local layers
    /// rotate with 10,000 and its global ones with 1,000,000).
    pub window_theta: Option<f32>,
}

impl Default for RopeConfig {
    /// llama2.c's RoPE: base 10,000, adjacent pairs, whole heads, no scaling.
    fn default() -> RopeConfig {
        RopeConfig {
            theta: 10000.0,
            scaling: None,
            pairing: RopePairing::Adjacent,
            rotated: None,
            freq_factors: None,
            long_rope: None,
            attn_factor: None,
            window_theta: None,
        }
    }
}

impl RopeConfig {
    /// Rotated dimensions per head of a model whose heads are `head_dim` wide.
    pub fn rotated_dims(&self, head_dim: usize) -> usize {
        self.rotated.unwrap_or(head_dim)
    }

    /// The base of a layer: `window_theta` for a sliding-window layer when the model has one.
    pub fn layer_theta(&self, windowed: bool) -> f32 {
        match self.window_theta {
            Some(t) if windowed => t,
            _ => self.theta,
        }
    }
}

/// The FFN's activation of the gate: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU: Llama, Qwen, Phi, Mistral).
    #[default]
    Silu,
    /// GELU with the tanh approximation (GeGLU: Gemma).
    GeluTanh,
}

impl Activation {
    /// A stable name (the compiled file stores it).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_tanh",
        }
    }

    /// The activation of [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Activation> {
        [Activation::Silu, Activation::GeluTanh]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// What every decoder layer does besides the Llama block (pre-norm attention and SwiGLU FFN):
/// the data the one forward, the reference executor, the compiled file and the HTP lowering
/// read. The default is the Llama block.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Block {
    /// Q, K and V projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalized (weights of `head_dim`) before RoPE (Qwen3,
    /// Gemma 3).
    pub qk_norm: bool,
    /// The attention output is RMS-normalized before the residual add (Gemma 3).
    pub post_attention_norm: bool,
    /// The FFN output is RMS-normalized before the residual add (Gemma 3).
    pub post_ffn_norm: bool,
    /// The FFN's gate activation.
    pub activation: Activation,
    /// The attention scores' scale; `None` is `1 / sqrt(head_dim)`.
    pub attention_scale: Option<f32>,
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
/// `rope-dim` doubled, `partial_rotary_factor` times `head_dim`) against `head_dim`, for paths
/// that rotate whole heads only (a foreign binary's RoPE tables): a count no model can have
/// (zero, odd, above `head_dim`) is invalid, an even one below `head_dim` is partial RoPE. The
/// reason is for an error naming the file and the field.
pub fn full_rope_only(rotated: usize, head_dim: usize) -> Result<(), String> {
    valid_rotated(rotated, head_dim)?;
    if rotated == head_dim {
        return Ok(());
    }
    Err(format!(
        "partial RoPE ({rotated} of the head's {head_dim} dimensions rotated) is not supported \
         here: this path rotates whole heads"
    ))
}

/// Checks a count of rotated dimensions per head: even, at least 2, at most `head_dim`.
pub fn valid_rotated(rotated: usize, head_dim: usize) -> Result<(), String> {
    if rotated == 0 || rotated % 2 == 1 || rotated > head_dim {
        return Err(format!(
            "{rotated} rotated dimensions per head is invalid: RoPE rotates an even number of \
             dimensions, at least 2 and at most the head's {head_dim}"
        ));
    }
    Ok(())
}

/// The one model description: a decoder of pre-norm attention and gated FFN blocks, with what
/// each family adds as data ([`Block`], [`RopeConfig`], per-layer windows, embedding scale,
/// soft-cap). Every loader fills it through its family ([`crate::family`]); the forward, the
/// reference executor, the compiled file and the HTP lowering read it. Weight shapes follow from
/// it; see [`crate::Tensor::shape`].
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
    /// What each layer does besides the Llama block (norms, biases, activation, scale).
    pub block: Block,
    /// Multiplier of the embedding rows (Gemma: `sqrt(dim)`), `None` for 1.
    pub embed_scale: Option<f32>,
    /// Final logit soft-cap `c`: logits become `c * tanh(logits / c)` (Gemma 2), `None` for none.
    pub final_softcap: Option<f32>,
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

/// Checks one divisor per rotated pair, each finite and positive.
fn pair_factors(field: &'static str, f: &[f32], rotated: usize) -> Result<(), Error> {
    if f.len() != rotated / 2 {
        let why = format!("must hold one factor per rotated pair ({})", rotated / 2);
        return Err(Error::config(field, f.len(), why));
    }
    if let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err(Error::config(
            field,
            bad,
            "every factor must be finite and positive",
        ));
    }
    Ok(())
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

    /// The attention window of `layer` in static graphs of context `context`: the model's window
    /// when it is shorter than the context, `None` otherwise (a longer one never bites: a graph
    /// attends to at most `context` positions). The reference executor and the HTP lowering
    /// both size a sliding layer's K/V by it.
    pub fn graph_window(&self, layer: usize, context: usize) -> Option<usize> {
        self.layer_window(layer).filter(|&w| w < context)
    }

    /// The description as a static graph of `context` positions runs it: with LongRoPE, the
    /// factors of that context ([`LongRope::factors_for`]); otherwise unchanged.
    pub fn for_context(mut self, context: usize) -> LlamaConfig {
        if let Some(l) = &self.rope.long_rope {
            self.rope.freq_factors = Some(l.factors_for(context).to_vec());
        }
        self
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
        self.validate_rope()?;
        self.validate_block()?;
        self.validate_windows()?;
        self.validate_special()
    }

    fn validate_rope(&self) -> Result<(), Error> {
        let r = &self.rope;
        positive_finite("rope.theta", r.theta)?;
        if let Some(t) = r.window_theta {
            positive_finite("rope.window_theta", t)?;
        }
        if let Some(s) = &r.scaling {
            s.validate()?;
        }
        let rotated = r.rotated_dims(self.head_dim);
        valid_rotated(rotated, self.head_dim)
            .map_err(|why| Error::config("rope.rotated", rotated, why))?;
        if let Some(t) = r.attn_factor {
            positive_finite("rope.attn_factor", t)?;
        }
        if let Some(f) = &r.freq_factors {
            pair_factors("rope.freq_factors", f, rotated)?;
        }
        if let Some(l) = &r.long_rope {
            pair_factors("rope.long_rope.short", &l.short, rotated)?;
            pair_factors("rope.long_rope.long", &l.long, rotated)?;
            bounded(
                "rope.long_rope.original_context",
                l.original_context,
                limits::MAX_CONTEXT,
            )?;
        }
        Ok(())
    }

    fn validate_block(&self) -> Result<(), Error> {
        let scales = [
            ("block.attention_scale", self.block.attention_scale),
            ("embed_scale", self.embed_scale),
            ("final_softcap", self.final_softcap),
        ];
        for (field, v) in scales {
            if let Some(v) = v {
                positive_finite(field, v)?;
            }
        }
        Ok(())
    }

    /// The attention scores' scale: the block's, else `1 / sqrt(head_dim)`.
    pub fn attention_scale(&self) -> f32 {
        self.block
            .attention_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
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
            rope: RopeConfig::default(),
            tied_output: true,
            block: Block::default(),
            embed_scale: None,
            final_softcap: None,
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
    fn long_rope_picks_the_long_factors_past_the_original_context_only() {
        let mut c = tiny();
        c.rope.long_rope = Some(LongRope {
            short: vec![1.0, 2.0],
            long: vec![3.0, 4.0],
            original_context: 8,
        });
        c.rope.freq_factors = Some(vec![1.0, 2.0]);
        assert_eq!(
            c.clone().for_context(8).rope.freq_factors,
            Some(vec![1.0, 2.0])
        );
        assert_eq!(
            c.clone().for_context(9).rope.freq_factors,
            Some(vec![3.0, 4.0])
        );
        assert_eq!(tiny().for_context(9), tiny());
        c.rope.long_rope.as_mut().unwrap().long.push(5.0);
        assert_eq!(field_of(&c), "rope.long_rope.long");
        c = tiny();
        c.rope.attn_factor = Some(0.0);
        assert_eq!(field_of(&c), "rope.attn_factor");
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
