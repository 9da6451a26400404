//! File codes of element types and tensor roles, and the small enums of the compile options.

use graph_io::IoRole;
use model::{LayerTensor, Tensor};
use quant::DataType;

/// The file-format code of `dtype` (stable: compiled-model files written by earlier versions
/// use these codes). Graph tensors use `quant`'s one [`DataType`] enum.
pub(crate) const fn dtype_code(dtype: DataType) -> u8 {
    match dtype {
        DataType::I32 => 0,
        DataType::U8 => 1,
        DataType::U16 => 2,
        DataType::I8 => 3,
        DataType::I16 => 4,
        DataType::F16 => 5,
        DataType::F32 => 6,
    }
}

/// The data type of a file-format code, `None` for an unknown code.
pub(crate) fn dtype_from_code(code: u8) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| dtype_code(d) == code)
}

/// The file-format code of a tensor role (stable: codes 0 to 11 are those of every earlier
/// version; 12 to 15 are the roles no Llama graph has).
pub(crate) const fn role_code(role: IoRole) -> u8 {
    match role {
        IoRole::InputIds => 0,
        IoRole::Positions => 1,
        IoRole::Mask => 2,
        IoRole::PastKey => 3,
        IoRole::PastValue => 4,
        IoRole::NewKey => 5,
        IoRole::NewValue => 6,
        IoRole::Logits => 7,
        IoRole::RopeCos => 8,
        IoRole::RopeSin => 9,
        IoRole::HiddenIn => 10,
        IoRole::HiddenOut => 11,
        IoRole::Embeddings => 12,
        IoRole::SourceIds => 13,
        IoRole::CrossKey => 14,
        IoRole::CrossValue => 15,
    }
}

/// Every role, for [`role_from_code`].
const ROLES: [IoRole; 16] = [
    IoRole::InputIds,
    IoRole::Positions,
    IoRole::Mask,
    IoRole::PastKey,
    IoRole::PastValue,
    IoRole::NewKey,
    IoRole::NewValue,
    IoRole::Logits,
    IoRole::RopeCos,
    IoRole::RopeSin,
    IoRole::HiddenIn,
    IoRole::HiddenOut,
    IoRole::Embeddings,
    IoRole::SourceIds,
    IoRole::CrossKey,
    IoRole::CrossValue,
];

/// The role of a file-format code, `None` for an unknown code.
pub(crate) fn role_from_code(code: u8) -> Option<IoRole> {
    ROLES.into_iter().find(|&r| role_code(r) == code)
}

/// The layer matrices an `i8f16` build keeps in f16: on SmolLM2-135M, V and down (with its
/// input) are the sites whose i8 quantization costs most (README, "Keeping V and down in f16"),
/// as llama.cpp's Q4_K_M keeps the same two at more bits than the rest.
pub const I8F16_KEPT_AT_F16: [LayerTensor; 2] = [LayerTensor::V, LayerTensor::Down];

/// Type of the stored weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// Signed 8-bit, symmetric, one scale per output channel (matrix row); matmul inputs are
    /// quantized to i16 with static encodings and accumulated in integers (W8A16).
    I8,
    /// 4-bit weights with QNN's blockwise-expansion encoding ("LPBQ", W4A16): one scale per output
    /// channel times a 4-bit integer multiplier per block of [`crate::LPBQ_BLOCK`] inputs, values in
    /// `[-8, 7]`. Each value times its block's multiplier is at most 120 in magnitude, so the
    /// executor holds it as that i8 product and runs the i8 kernels unchanged, exactly. The
    /// embedding (the tied classifier), an untied classifier, V and down stay i8
    /// ([`crate::is_lpbq`] says which matrices are 4-bit).
    I4,
    /// i8 as [`WeightType::I8`], but the layer matrices of [`I8F16_KEPT_AT_F16`] (V and down)
    /// stay in IEEE half, their products in f32 with unquantized inputs, as a float build runs
    /// them ([`WeightType::matrix_type`]): the two matrices whose 8 bits cost the model most, and
    /// the down projection's input, whose one i16 encoding per tensor the FFN smoothing exists
    /// for (README, "Keeping V and down in f16"). No FFN smoothing.
    I8F16,
    /// IEEE half, widened to f32 at load; matmuls in f32.
    F16,
    /// IEEE single; matmuls in f32.
    F32,
}

impl WeightType {
    /// The weights a user's build gets when none is asked for: the one place the engine
    /// (`generate`, `chat`, `eval`, `serve`, the Java API) and `htpkv compile` read it
    /// ([`crate::CompileOptions::new`] is the library's plain i8 constructor). Chosen by
    /// measurement beside llama.cpp's Q8_0 on the same held-out text and positions
    /// (docs/measurements/quality-and-speed-2026-11-28.md): on SmolLM2-135M `i8f16` is the only
    /// type as near the f32 model as Q8_0 (mean KL and top-1), and it keeps the float answers to
    /// the sky questions that `i8` changes; on Gemma 3 270M it is nearer than `i8` (both behind
    /// Q8_0 there). Its file is 1.14x Q8_0's on SmolLM2, 1.02x on Gemma 3.
    pub const DEFAULT: WeightType = WeightType::I8F16;

    /// True for the integer weights (i8, i4, i8f16), whose integer matmuls take i16 inputs with
    /// static encodings.
    pub const fn is_integer(self) -> bool {
        matches!(self, WeightType::I8 | WeightType::I4 | WeightType::I8F16)
    }

    /// The type matrix `t` of a build with these weights is stored in: f16 for
    /// [`I8F16_KEPT_AT_F16`] in an `i8f16` build, i8 for its other matrices, the build's own type
    /// otherwise (an i4 build holds every matrix as i8 values; [`crate::is_lpbq`] says which are
    /// on the 4-bit grid).
    pub fn matrix_type(self, t: Tensor) -> WeightType {
        match (self, t) {
            (WeightType::I8F16, Tensor::Layer(_, l)) if I8F16_KEPT_AT_F16.contains(&l) => {
                WeightType::F16
            }
            (WeightType::I8F16, _) => WeightType::I8,
            (wt, _) => wt,
        }
    }

    /// Lowercase name (`i8`, `i4`, `i8f16`, `f16`, `f32`).
    pub const fn name(self) -> &'static str {
        match self {
            WeightType::I8 => "i8",
            WeightType::I4 => "i4",
            WeightType::I8F16 => "i8f16",
            WeightType::F16 => "f16",
            WeightType::F32 => "f32",
        }
    }
}

impl std::str::FromStr for WeightType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "i8" => Ok(WeightType::I8),
            "i4" => Ok(WeightType::I4),
            "i8f16" => Ok(WeightType::I8F16),
            "f16" => Ok(WeightType::F16),
            "f32" => Ok(WeightType::F32),
            _ => Err(format!(
                "unknown weight type `{s}` (expected i8, i4, i8f16, f16 or f32)"
            )),
        }
    }
}

/// The K layout and the KV tensor granularity are the runtime's ([`kv_manager`]'s): one
/// definition for the compiler, the executor and the KV manager.
pub use kv_manager::{Granularity, KLayout};

// The compiled file's versions: recorded in options' fingerprint too, so they live below both.
/// The format version this build writes for a model without per-layer windows.
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format version this build still reads.
pub const OLDEST_FORMAT_VERSION: u32 = 3;
/// The format version of a model with per-layer attention windows: version 4 with a `WNDS`
/// section after `CONF`. This build reads both; a build that does not know windows refuses it
/// by its version rather than mis-reading it.
pub const WINDOWS_FORMAT_VERSION: u32 = 5;
/// The format version of a model whose description holds more than the Llama block (a family's
/// norms, activation, RoPE bases or factors, scales): the whole description as key–value
/// metadata in a `DESC` section in place of `CONF` and `WNDS` ([`crate::desc`]).
pub const DESC_FORMAT_VERSION: u32 = 6;
/// The format version of a model whose graph set holds last-row prefill graphs
/// ([`crate::CompileOptions::last_row`]): version 6 whose `OPTS` section ends with the flag
/// byte 1 (its `GRPH` section then lists those graphs, `logits [1, 1, vocab]`). Only such files
/// carry it, so every other file keeps versions 4 to 6; a build that does not know last-row
/// graphs refuses it by its version rather than mis-reading it.
pub const LAST_ROW_FORMAT_VERSION: u32 = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_has_its_own_code() {
        for (code, role) in ROLES.into_iter().enumerate() {
            assert_eq!(usize::from(role_code(role)), code);
            assert_eq!(role_from_code(code as u8), Some(role));
        }
        assert_eq!(role_from_code(16), None);
    }
}
