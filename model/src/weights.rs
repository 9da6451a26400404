//! Weight tensors of a Llama-family model: their identities and shapes (one place), the
//! [`WeightSource`] trait the forward reads through, and owned f32 [`Weights`].

use std::fmt;

use crate::{Error, LlamaConfig};

/// A per-layer weight tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    /// RMSNorm weights before attention, `(dim)`.
    AttnNorm,
    /// Query projection, `(q_dim, dim)`.
    Q,
    /// Key projection, `(kv_dim, dim)`.
    K,
    /// Value projection, `(kv_dim, dim)`.
    V,
    /// Query bias, `(q_dim)` (only with `qkv_bias`).
    QBias,
    /// Key bias, `(kv_dim)` (only with `qkv_bias`).
    KBias,
    /// Value bias, `(kv_dim)` (only with `qkv_bias`).
    VBias,
    /// Attention output projection, `(dim, q_dim)`.
    O,
    /// RMSNorm weights before the FFN, `(dim)`.
    FfnNorm,
    /// FFN gate projection (w1), `(hidden_dim, dim)`.
    Gate,
    /// FFN up projection (w3), `(hidden_dim, dim)`.
    Up,
    /// FFN down projection (w2), `(dim, hidden_dim)`.
    Down,
    /// RMSNorm weights of each query head, `(head_dim)` (only with `block.qk_norm`).
    QNorm,
    /// RMSNorm weights of each key head, `(head_dim)` (only with `block.qk_norm`).
    KNorm,
    /// RMSNorm weights of the attention output, `(dim)` (only with `block.post_attention_norm`).
    PostAttnNorm,
    /// RMSNorm weights of the FFN output, `(dim)` (only with `block.post_ffn_norm`).
    PostFfnNorm,
}

impl LayerTensor {
    /// All per-layer tensors, optional ones included.
    pub const ALL: [LayerTensor; 16] = [
        LayerTensor::AttnNorm,
        LayerTensor::Q,
        LayerTensor::K,
        LayerTensor::V,
        LayerTensor::QBias,
        LayerTensor::KBias,
        LayerTensor::VBias,
        LayerTensor::O,
        LayerTensor::FfnNorm,
        LayerTensor::Gate,
        LayerTensor::Up,
        LayerTensor::Down,
        LayerTensor::QNorm,
        LayerTensor::KNorm,
        LayerTensor::PostAttnNorm,
        LayerTensor::PostFfnNorm,
    ];

    /// Whether a layer of `config` has this tensor (the optional ones follow its [`crate::Block`]).
    pub fn present(self, config: &LlamaConfig) -> bool {
        use LayerTensor as L;
        let b = &config.block;
        match self {
            L::QBias | L::KBias | L::VBias => b.qkv_bias,
            L::QNorm | L::KNorm => b.qk_norm,
            L::PostAttnNorm => b.post_attention_norm,
            L::PostFfnNorm => b.post_ffn_norm,
            _ => true,
        }
    }

    /// An RMSNorm weight vector (as opposed to a matrix or a bias).
    pub fn is_norm(self) -> bool {
        use LayerTensor as L;
        matches!(
            self,
            L::AttnNorm | L::FfnNorm | L::QNorm | L::KNorm | L::PostAttnNorm | L::PostFfnNorm
        )
    }

    /// A projection matrix (Q, K, V, O, gate, up, down).
    pub fn is_matrix(self) -> bool {
        use LayerTensor as L;
        matches!(self, L::Q | L::K | L::V | L::O | L::Gate | L::Up | L::Down)
    }
}

/// One weight tensor of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// Token embedding, `(vocab, dim)`.
    TokenEmbedding,
    /// A per-layer tensor of layer `.0`.
    Layer(usize, LayerTensor),
    /// Final RMSNorm weights, `(dim)`.
    OutputNorm,
    /// Classifier, `(vocab, dim)` (absent when tied to the embedding).
    Output,
}

impl Tensor {
    /// The classifier's matrix: the embedding when the model ties them, else `Output`.
    pub fn classifier(c: &LlamaConfig) -> Tensor {
        if c.tied_output {
            Tensor::TokenEmbedding
        } else {
            Tensor::Output
        }
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tensor::Layer(l, t) => write!(f, "layer {l} {t:?}"),
            other => write!(f, "{other:?}"),
        }
    }
}

impl Tensor {
    /// Every tensor `config` needs: the optional layer tensors its block has
    /// ([`LayerTensor::present`]), `Output` only when untied.
    pub fn required(config: &LlamaConfig) -> Vec<Tensor> {
        let mut v = vec![Tensor::TokenEmbedding];
        for l in 0..config.n_layers {
            let wanted = LayerTensor::ALL.into_iter().filter(|t| t.present(config));
            v.extend(wanted.map(|t| Tensor::Layer(l, t)));
        }
        v.push(Tensor::OutputNorm);
        if !config.tied_output {
            v.push(Tensor::Output);
        }
        v
    }

    /// Shape `(rows, cols)` of a matrix, `(len)` of a vector, outermost dimension first.
    pub fn shape(self, c: &LlamaConfig) -> Vec<usize> {
        use LayerTensor as L;
        match self {
            Tensor::TokenEmbedding | Tensor::Output => vec![c.vocab_size, c.dim],
            Tensor::OutputNorm => vec![c.dim],
            Tensor::Layer(_, t) => match t {
                L::AttnNorm | L::FfnNorm | L::PostAttnNorm | L::PostFfnNorm => vec![c.dim],
                L::QNorm | L::KNorm => vec![c.head_dim],
                L::Q => vec![c.q_dim(), c.dim],
                L::K | L::V => vec![c.kv_dim(), c.dim],
                L::QBias => vec![c.q_dim()],
                L::KBias | L::VBias => vec![c.kv_dim()],
                L::O => vec![c.dim, c.q_dim()],
                L::Gate | L::Up => vec![c.hidden_dim, c.dim],
                L::Down => vec![c.dim, c.hidden_dim],
            },
        }
    }

    /// An RMSNorm weight vector (a layer's norms and the output norm).
    pub fn is_norm(self) -> bool {
        match self {
            Tensor::OutputNorm => true,
            Tensor::Layer(_, lt) => lt.is_norm(),
            _ => false,
        }
    }

    /// Number of elements of [`shape`](Self::shape).
    pub fn len(self, c: &LlamaConfig) -> usize {
        self.shape(c).iter().product()
    }
}

/// Read access to f32 weights, row-major `(out, in)` so that `y = W x`.
pub trait WeightSource: Send + Sync {
    /// The tensor's data, or `None` when the source does not hold it.
    fn tensor(&self, t: Tensor) -> Option<&[f32]>;
}

/// A [`WeightSource`] with some tensors replaced: `replaced`'s where it has them, `base`'s
/// otherwise (the f32 weights a fold or a rounding experiment changed).
pub struct Overlay<'a> {
    base: &'a dyn WeightSource,
    replaced: std::collections::HashMap<Tensor, Vec<f32>>,
}

impl<'a> Overlay<'a> {
    /// `base` with the tensors of `replaced` in place of its own.
    pub fn new(
        base: &'a dyn WeightSource,
        replaced: std::collections::HashMap<Tensor, Vec<f32>>,
    ) -> Overlay<'a> {
        Overlay { base, replaced }
    }
}

impl std::fmt::Debug for Overlay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut replaced: Vec<String> = self.replaced.keys().map(Tensor::to_string).collect();
        replaced.sort();
        f.debug_struct("Overlay")
            .field("replaced", &replaced)
            .finish_non_exhaustive()
    }
}

impl WeightSource for Overlay<'_> {
    fn tensor(&self, t: Tensor) -> Option<&[f32]> {
        match self.replaced.get(&t) {
            Some(v) => Some(v),
            None => self.base.tensor(t),
        }
    }
}

/// Checks that `w` holds every tensor `config` needs with the right number of elements.
pub fn check_weights(config: &LlamaConfig, w: &(impl WeightSource + ?Sized)) -> Result<(), Error> {
    for t in Tensor::required(config) {
        let data = w.tensor(t).ok_or_else(|| Error::MissingTensor {
            name: t.to_string(),
        })?;
        if data.len() != t.len(config) {
            return Err(Error::TensorShape {
                name: t.to_string(),
                expected: t.shape(config),
                found: vec![data.len()],
            });
        }
    }
    Ok(())
}

/// A tensor a model file holds, as its header describes it.
#[derive(Debug, Clone)]
pub struct HeldTensor<'a> {
    /// Its name in the file.
    pub name: &'a str,
    /// Its shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// The file holding it (a GGUF file, one safetensors shard).
    pub file: &'a str,
}

/// Checks that every value of tensor `name` read from `origin` is finite (a NaN or an infinity
/// would poison every logit the tensor touches, or be clamped away silently by quantization).
pub fn check_finite(origin: &str, name: &str, data: &[f32]) -> Result<(), Error> {
    match data.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::BadTensor {
            origin: origin.to_owned(),
            name: name.to_owned(),
            reason: format!("holds {} at element {i} (weights must be finite)", data[i]),
        }),
    }
}

/// Weights of one layer (biases empty unless the model has them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerWeights {
    tensors: [Vec<f32>; LayerTensor::ALL.len()],
}

/// Owned f32 weights, filled tensor by tensor by the loaders.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Weights {
    /// `(vocab, dim)`.
    pub token_embedding: Vec<f32>,
    /// Per-layer tensors.
    pub layers: Vec<LayerWeights>,
    /// `(dim)`.
    pub output_norm: Vec<f32>,
    /// `(vocab, dim)`, `None` when tied.
    pub output: Option<Vec<f32>>,
}

fn layer_index(t: LayerTensor) -> usize {
    LayerTensor::ALL.iter().position(|&x| x == t).unwrap_or(0)
}

impl Weights {
    /// Empty weights with `n_layers` layers.
    pub fn with_layers(n_layers: usize) -> Self {
        Weights {
            layers: vec![LayerWeights::default(); n_layers],
            ..Weights::default()
        }
    }

    /// Stores `data` as tensor `t`. Errors with [`Error::TensorShape`] when a layer index is
    /// beyond the layers this value was made with.
    pub fn set(&mut self, t: Tensor, data: Vec<f32>) -> Result<(), Error> {
        match t {
            Tensor::TokenEmbedding => self.token_embedding = data,
            Tensor::OutputNorm => self.output_norm = data,
            Tensor::Output => self.output = Some(data),
            Tensor::Layer(l, lt) => {
                let n = self.layers.len();
                let layer = self.layers.get_mut(l).ok_or(Error::TensorShape {
                    name: t.to_string(),
                    expected: vec![n],
                    found: vec![l],
                })?;
                layer.tensors[layer_index(lt)] = data;
            }
        }
        Ok(())
    }
}

impl WeightSource for Weights {
    fn tensor(&self, t: Tensor) -> Option<&[f32]> {
        let v = match t {
            Tensor::TokenEmbedding => &self.token_embedding,
            Tensor::OutputNorm => &self.output_norm,
            Tensor::Output => self.output.as_ref()?,
            Tensor::Layer(l, lt) => &self.layers.get(l)?.tensors[layer_index(lt)],
        };
        // Every real tensor has at least one element; an empty one was never set.
        (!v.is_empty()).then_some(v.as_slice())
    }
}

/// A borrowed source reads through to the source (so a forward can run on `&dyn WeightSource`).
impl<T: WeightSource + ?Sized> WeightSource for &T {
    fn tensor(&self, t: Tensor) -> Option<&[f32]> {
        (**self).tensor(t)
    }
}
