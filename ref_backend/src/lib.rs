//! htpkv's reference backend: a CPU executor that behaves like a QNN HTP graph (int8 weights,
//! int16 activations, fixed-point KV), and the compile step that makes its "context binary".
//!
//! It knows nothing about KV update strategies: a [`Graph`] executes one static AR-n step on
//! raw buffers, exactly like `graphExecute` on HTP.
//!
//! It runs any Llama-family model the `model` crate describes ([`model::LlamaConfig`]: GQA,
//! Q/K/V biases, tied or separate classifier, adjacent or half-split RoPE pairs, Llama 3 RoPE
//! scaling), from any [`model::WeightSource`] (GGUF, HF safetensors, llama2.c). The float oracle
//! ([`model::FloatModel`]), calibration and the executor run one forward pass,
//! [`model::forward::run`]; the executor only supplies its kernels (quantized matrices, the KV
//! codec writing the new-KV outputs, the static window and the mask), so it honours every option
//! of the description exactly as the float model does.
//!
//! # Graphs
//! [`compile`] builds one graph per AR variant n for context S, named `ar{n}_cl{S}`. With L
//! layers, H KV heads, head dim D and vocabulary V:
//!
//! **Inputs**, in order: `input_ids [1, n]` i32; `positions [1, n]` i32 (the RoPE positions);
//! `attention_mask [1, 1, n, S]` (f32 `0`/`-inf` for f16/f32 KV, u16 fixed point with
//! scale `100/65535`, offset `-65535` for u8/u16 KV: `65535` visible, `0` masked); then per
//! layer l and KV head h `past_key_{l}_{h} [1, 1, S-n, D]` (`[1, 1, D, S-n]` with
//! [`KLayout::Transposed`]) and `past_value_{l}_{h} [1, 1, S-n, D]`.
//! **Outputs**: `logits [1, n, V]` f32, then per (l, h) `new_key_{l}_{h}` `[1, 1, n, D]`
//! (transposed `[1, 1, D, n]`) and `new_value_{l}_{h} [1, 1, n, D]`. With
//! [`Granularity::PerLayer`] the KV tensors are `past_key_{l} [H, 1, S-n, D]` etc. with a
//! per-axis encoding (axis 0). Past and new tensors of one (layer, head) share one encoding.
//!
//! **Per-layer attention windows** ([`model::LlamaConfig::layer_windows`]): a layer whose window
//! W is shorter than S slides. Its past tensors hold `W - 1` rows in every AR variant
//! (`past_key_{l}_{h} [1, 1, W-1, D]`, kv_manager's `Geometry::past_rows`) and it reads its own
//! mask `attention_mask_w{W} [1, 1, n, W-1+n]` (same encoding as `attention_mask`; column
//! `j < W-1`: past row j, `W-1+i`: new token i), one per distinct window, after
//! `attention_mask` in ascending W. A window must satisfy kv_manager's rule
//! `max(ar) <= W <= S - max(ar) + 1`; one between that and S is refused by [`compile`] (it would
//! change the float model's answer, yet no cache serves it), one of S or more is a global layer.
//! The file records the windows (format version 4, see [`mod@format`]).
//!
//! **Semantics.** Mask column `j < S-n` addresses row `j` of every past window; column
//! `S-n+i` addresses new token `i` of this step. The mask is additive; a (dequantized) value
//! at or below [`MASKED_AT_OR_BELOW`] (`-50`) skips the key entirely, so masked rows (e.g. the
//! left padding) may hold any bytes. A new token's K/V, as seen by the queries of the same
//! step, is the value read back from its KV encoding, so an AR-n prefill equals n AR-1 steps.
//!
//! **Parts.** [`CompiledModel::split`] cuts the model into N parts of consecutive layers, one
//! file each, with AI Hub's graph and K/V names, the hidden state (f32) between the parts and,
//! optionally, RoPE cos/sin table inputs: see [`Part`].
//!
//! # What is quantized and what is float
//! * **Weights** (`--weights i8`): every matrix (`wq wk wv wo w1 w2 w3` and the token
//!   embedding, which is also the tied classifier) is i8, symmetric, one scale per output
//!   channel (row). Each matmul quantizes its input to **i16** with a static per-tensor
//!   asymmetric encoding fixed by calibration, accumulates `i8 x i16` products in integers
//!   (i32 partial sums over at most 516 products, provably without overflow, summed in i64),
//!   applies the activation offset in i64 and rescales once to f32 (W8A16). The embedding
//!   gather dequantizes the i8 row. With `f16`/`f32` weights the matmuls are f32 (f16 widened).
//!   With i8 weights the FFN is smoothed before quantization ([`FFN_SMOOTHING`]): each channel
//!   of the down projection's input is divided by a factor from calibration (folded into the
//!   rows of `w3` and the columns of `w2`), so its one i16 scale is not spent on a few large
//!   channels; [`smoothed_weights`] gives the f32 weights the i8 ones were quantized from.
//!   Integer layer weights (i8 and i4) are rounded onto those grids by their output error over
//!   calibration ([`Rounding::Gptq`], the default of [`compile`]), not to nearest: the
//!   scales, and so every encoding, are the same as to-nearest rounding gives.
//! * **KV**: new keys (after RoPE) and values are written in the KV dtype (u8/u16: asymmetric
//!   per (layer, KV head, K|V); f16; f32) and read back dequantized.
//! * **Float (f32)**: the residual stream and its additions, RMSNorm, the Q/K/V bias additions,
//!   RoPE (angles from the positions input and the description), attention scores
//!   `q·k/sqrt(D)` with the dequantized keys, the mask addition, softmax, the probability-
//!   weighted sum of the dequantized values, SiLU and the gate product, the matmul outputs
//!   (after the integer accumulation) and the logits.
//!
//! # Compiling
//! [`compile`]`(config, weights, calibration, options, fingerprint, progress)`: the
//! description, the weights, the calibration token sequences, the [`CompileOptions`], the
//! SHA-256 of the model file(s) (stored, see [`CompiledModel::model_sha256`]) and a progress
//! callback (stage, done, total).
//!
//! # Files
//! [`CompiledModel::write`] / [`CompiledModel::read`]; format in [`mod@format`]. Files of an
//! older format version are refused with a "recompile" error.

mod bytes;
mod calibrate;
mod compile;
mod compiled;
mod desc;
pub mod encdec;
mod error;
mod exec;
pub mod format;
mod gptq;
pub mod kernels;
mod lpbq;
mod model;
mod options;
mod parts;
mod progress;
mod smooth;
mod stored;
mod types;
mod validate;

pub use ::model::checksum::crc32;
pub use calibrate::Recipe;
pub use calibrate::{U8_KV_PERCENTILE, U16_KV_MARGIN};
pub use compile::{compile, compile_with};
pub use compiled::CompiledModel;
pub use error::{CompileError, ExecError, FormatError};
pub use exec::{Graph, mask_value_bytes};
pub use format::{
    DESC_FORMAT_VERSION, FORMAT_VERSION, LAST_ROW_FORMAT_VERSION, WINDOWS_FORMAT_VERSION,
};
pub use gptq::{GPTQ_DAMPING, Rounding};
/// Graph tensors are described in the IO vocabulary's terms, and a compiled file names its graphs
/// and tensors after one of its conventions.
pub use graph_io::{Convention, IoRole, IoTensor, Packaging, Preset};
pub use lpbq::{I4_KEPT_AT_8_BITS, LPBQ_BLOCK, is_lpbq};

/// The block multipliers of `model`'s matrix `t` on the LPBQ grid
/// ([`CompiledModel::lpbq_multipliers`]).
pub fn lpbq_multipliers(
    model: &CompiledModel,
    t: ::model::Tensor,
    source: &dyn ::model::WeightSource,
) -> Result<Option<Vec<u8>>, CompileError> {
    model.lpbq_multipliers(t, source)
}
pub use model::{
    ActSite, I8Matrix, MASK_OFFSET, MASK_SCALE, MASKED_AT_OR_BELOW, graph_name, mask_encoding,
};
pub use options::{
    CALIBRATION_VERSION, CompileOptions, DEFAULT_CALIBRATION_CHATS, DEFAULT_CALIBRATION_PROMPTS,
    DEFAULT_CALIBRATION_TOKENS, MAX_CALIBRATION_TOKENS,
};
pub use parts::{Part, Split, naming_refusal, parts_naming, takes_rope_tables};
pub use progress::{Progress, Stage};
pub use smooth::{FFN_SMOOTHING, FfnSmoothing, ffn_smoothing_factors, smoothed_weights};
pub use types::{Granularity, I8F16_KEPT_AT_F16, KLayout, WeightType};
