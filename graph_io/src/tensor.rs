//! The one tensor and graph description: what a backend reports and the runtime binds.

use quant::{DataType, QuantSpec};
use serde::Deserialize;

use crate::role::IoRole;

/// One input or output tensor of a graph.
///
/// The tensor's bytes are little-endian elements of `dtype` in row-major order of `shape`.
#[derive(Debug, Clone, PartialEq)]
pub struct IoTensor {
    /// Tensor name, e.g. `past_key_3_1`.
    pub name: String,
    /// What the tensor is for.
    pub role: IoRole,
    /// Layer of a K/V tensor.
    pub layer: Option<usize>,
    /// KV head of a per-head K/V tensor (`None` for per-layer tensors and non-K/V tensors).
    pub head: Option<usize>,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DataType,
    /// Encoding of quantized/float tensors (`None` for i32 tensors).
    pub quant: Option<QuantSpec>,
}

impl IoTensor {
    /// Number of elements (product of the shape).
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Byte size of the whole tensor.
    pub fn byte_size(&self) -> usize {
        self.element_count() * self.dtype.size_bytes()
    }

    /// The tensor's encoding: [`quant::Encoding::Float`] for float and `i32` tensors.
    pub fn encoding(&self) -> quant::Encoding {
        self.quant
            .as_ref()
            .map_or(quant::Encoding::Float, |q| q.encoding.clone())
    }
}

/// How the attention mask's values are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskEncoding {
    /// Added to the attention scores: 0 where a token is visible, a large negative value where it is
    /// masked (the encoding's zero point and its lowest integer for fixed-point tensors; htpkv and
    /// AI Hub, whose float mask is 0 / −50 before quantization).
    #[default]
    Additive,
    /// A multiplicative 0/1 mask stored as the type's extremes: the highest integer (65535 for u16)
    /// where visible, 0 where masked (ExecuTorch's Qualcomm llama).
    AttendMax,
}

/// One static graph: an AR-n variant of the model, or one part of it.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphDesc {
    pub name: String,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
    /// Which part of a split model this graph runs (`0 of 1` for a whole model).
    pub part: PartOf,
    /// How the graph's mask input encodes visible and masked (from its IO convention).
    pub mask: MaskEncoding,
}

/// Which rows of a step a graph's logits output holds: every row (`[1, n, vocab]`), or only the
/// last one (`[1, 1, vocab]`: a prefill graph, where no row but the last is consumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogitRows {
    All,
    Last,
}

impl LogitRows {
    /// Rows of the logits output of an AR-`n` graph.
    pub fn count(self, n: usize) -> usize {
        match self {
            LogitRows::All => n,
            LogitRows::Last => 1,
        }
    }

    /// Short name for messages (`all`, `last`).
    pub fn name(self) -> &'static str {
        match self {
            LogitRows::All => "all",
            LogitRows::Last => "last",
        }
    }

    /// The name of the graph returning these rows, from its all-row graph's `name` (a last-row
    /// graph's is `{name}_last`; the runtime reads the rows from the shapes, never the name).
    pub fn graph_name(self, name: String) -> String {
        match self {
            LogitRows::All => name,
            LogitRows::Last => format!("{name}_last"),
        }
    }
}

/// The graphs of a model with AR variants `ar`, in order: one returning every row's logits per
/// variant, then, with `last_row`, one returning only the last row's per variant n > 1 (a
/// prefill graph: plain prefill consumes no other row; AR-1's one row is its last already).
/// The one rule the compilers (the reference executor's and the HTP lowering) and the budget
/// read.
pub fn graph_set(ar: &[usize], last_row: bool) -> Vec<(usize, LogitRows)> {
    let all = ar.iter().map(|&n| (n, LogitRows::All));
    let last = ar.iter().filter(|&&n| last_row && n > 1);
    all.chain(last.map(|&n| (n, LogitRows::Last))).collect()
}

/// Part `index` (0-based) of a model split into `count` parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartOf {
    pub index: usize,
    pub count: usize,
}

impl Default for PartOf {
    fn default() -> Self {
        PartOf { index: 0, count: 1 }
    }
}

impl GraphDesc {
    /// n: tokens per step (the last dimension of `input_ids`; else the rows of the embeddings or
    /// of the mask, which every part of a split model takes).
    pub fn ar(&self) -> Option<usize> {
        let find = |role| self.inputs.iter().find(|t| t.role == role);
        if let Some(ids) = find(IoRole::InputIds) {
            return ids.shape.last().copied();
        }
        let rows = |t: &IoTensor| t.shape.len().checked_sub(2).map(|i| t.shape[i]);
        find(IoRole::Embeddings)
            .or_else(|| find(IoRole::Mask))
            .and_then(rows)
    }

    /// The rows its logits output holds, read from the output's shape (`[.., rows, vocab]`):
    /// [`LogitRows::Last`] when an AR-n graph (n > 1) returns one row; `None` without logits
    /// (a part before the last) or without a token count.
    pub fn logit_rows(&self) -> Option<LogitRows> {
        let logits = self.outputs.iter().find(|t| t.role == IoRole::Logits)?;
        let rows = logits.shape.len().checked_sub(2).map(|i| logits.shape[i])?;
        let n = self.ar()?;
        Some(if n > 1 && rows == 1 {
            LogitRows::Last
        } else {
            LogitRows::All
        })
    }

    /// True for an encoder graph: it writes cross-attention K/V.
    pub fn is_encoder(&self) -> bool {
        self.outputs
            .iter()
            .any(|t| matches!(t.role, IoRole::CrossKey | IoRole::CrossValue))
    }

    /// S: the context length (the mask's last dimension).
    pub fn context(&self) -> Option<usize> {
        self.inputs
            .iter()
            .find(|t| t.role == IoRole::Mask)
            .and_then(|t| t.shape.last().copied())
    }
}
