//! Tensor descriptions and the small enums of the compile options.

use quant::{DataType, Encoding, QuantSpec};

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

/// What a graph tensor is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// `input_ids [1, n]` i32.
    InputIds,
    /// `positions [1, n]` i32: the RoPE position of each new token.
    Positions,
    /// `attention_mask [1, 1, n, S]`.
    Mask,
    /// A past-key window (input).
    PastKey,
    /// A past-value window (input).
    PastValue,
    /// The new keys of this step (output).
    NewKey,
    /// The new values of this step (output).
    NewValue,
    /// `logits [1, n, V]` f32 (output).
    Logits,
    /// RoPE cosine table `[1, 1, n, head_dim / 2]` f32 (a part graph's input, see [`crate::Part`]).
    RopeCos,
    /// RoPE sine table `[1, 1, n, head_dim / 2]` f32.
    RopeSin,
    /// The hidden state `[1, n, dim]` f32 from the previous part (input).
    HiddenIn,
    /// The hidden state `[1, n, dim]` f32 for the next part (output).
    HiddenOut,
}

impl TensorRole {
    /// Lowercase name (`input_ids`, `past_key`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            TensorRole::InputIds => "input_ids",
            TensorRole::Positions => "positions",
            TensorRole::Mask => "mask",
            TensorRole::PastKey => "past_key",
            TensorRole::PastValue => "past_value",
            TensorRole::NewKey => "new_key",
            TensorRole::NewValue => "new_value",
            TensorRole::Logits => "logits",
            TensorRole::RopeCos => "rope_cos",
            TensorRole::RopeSin => "rope_sin",
            TensorRole::HiddenIn => "hidden_in",
            TensorRole::HiddenOut => "hidden_out",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            TensorRole::InputIds => 0,
            TensorRole::Positions => 1,
            TensorRole::Mask => 2,
            TensorRole::PastKey => 3,
            TensorRole::PastValue => 4,
            TensorRole::NewKey => 5,
            TensorRole::NewValue => 6,
            TensorRole::Logits => 7,
            TensorRole::RopeCos => 8,
            TensorRole::RopeSin => 9,
            TensorRole::HiddenIn => 10,
            TensorRole::HiddenOut => 11,
        }
    }

    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => TensorRole::InputIds,
            1 => TensorRole::Positions,
            2 => TensorRole::Mask,
            3 => TensorRole::PastKey,
            4 => TensorRole::PastValue,
            5 => TensorRole::NewKey,
            6 => TensorRole::NewValue,
            7 => TensorRole::Logits,
            8 => TensorRole::RopeCos,
            9 => TensorRole::RopeSin,
            10 => TensorRole::HiddenIn,
            11 => TensorRole::HiddenOut,
            _ => return None,
        })
    }
}

/// Description of one graph input or output, as a QNN context binary lists it.
///
/// The tensor's bytes are little-endian elements of `dtype` in row-major order of `shape`.
/// `layer`/`head` are set for KV tensors (`head` only with per-head granularity).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    /// Tensor name, e.g. `past_key_3_1`.
    pub name: String,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DataType,
    /// Quantization encoding: [`Encoding::Float`] for float and `i32` tensors, per tensor for
    /// fixed-point tensors, per axis (axis 0, one pair per KV head) for per-layer KV tensors.
    pub encoding: Encoding,
    /// What the tensor is for.
    pub role: TensorRole,
    /// Layer of a KV tensor.
    pub layer: Option<u32>,
    /// KV head of a per-head KV tensor.
    pub head: Option<u32>,
}

impl TensorDesc {
    /// Number of elements (product of the shape).
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of bytes of the tensor's buffer.
    pub fn byte_size(&self) -> usize {
        self.element_count() * self.dtype.size_bytes()
    }

    /// The tensor's quantization spec (`None` for `i32` tensors).
    pub fn quant_spec(&self) -> Option<QuantSpec> {
        self.dtype.is_real().then(|| QuantSpec {
            dtype: self.dtype,
            encoding: self.encoding.clone(),
        })
    }
}

/// Type of the stored weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// Signed 8-bit, symmetric, one scale per output channel (matrix row); matmul inputs are
    /// quantized to i16 with static encodings and accumulated in integers (W8A16).
    I8,
    /// IEEE half, widened to f32 at load; matmuls in f32.
    F16,
    /// IEEE single; matmuls in f32.
    F32,
}

impl WeightType {
    /// Lowercase name (`i8`, `f16`, `f32`).
    pub const fn name(self) -> &'static str {
        match self {
            WeightType::I8 => "i8",
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
            "f16" => Ok(WeightType::F16),
            "f32" => Ok(WeightType::F32),
            _ => Err(format!(
                "unknown weight type `{s}` (expected i8, f16 or f32)"
            )),
        }
    }
}

/// The K layout and the KV tensor granularity are the runtime's ([`kv_manager`]'s): one
/// definition for the compiler, the executor and the KV manager.
pub use kv_manager::{Granularity, KLayout};
