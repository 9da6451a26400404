//! The IO binding plan of one step: where every K/V tensor lives in the region, the mask and the
//! positions.

use crate::{KvError, TensorKind};
use quant::{DataType, Encoding, QuantSpec};

/// One K/V tensor of a graph step, bound to a byte range of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorBinding {
    pub layer: usize,
    /// The kv-head for `per_head` tensors; `None` for a `per_layer` tensor holding every head.
    pub head: Option<usize>,
    pub kind: TensorKind,
    /// Shape as the graph declares it: `[heads, 1, rows, D]`, or `[heads, 1, D, rows]` when
    /// `transposed` (rows = S - n for past inputs, n for new outputs; heads = 1 for per_head).
    pub shape: [usize; 4],
    /// True for a transposed K tensor (`[.., D, rows]`).
    pub transposed: bool,
    /// Byte offset in the region.
    pub offset: usize,
    /// Byte length.
    pub bytes: usize,
}

impl TensorBinding {
    /// Byte offset, inside this tensor, of element (head, row, channel); `row` indexes the window (past)
    /// or the new tokens (new), `head` the head within a per_layer tensor (0 for per_head).
    pub fn element_offset(
        &self,
        head: usize,
        row: usize,
        channel: usize,
        elem_bytes: usize,
    ) -> usize {
        let [_, _, a, b] = self.shape;
        let index = if self.transposed {
            // [heads, 1, D, rows]: a = D, b = rows
            (head * a + channel) * b + row
        } else {
            // [heads, 1, rows, D]: a = rows, b = D
            (head * a + row) * b + channel
        };
        index * elem_bytes
    }
}

/// Which tensor of a step a binding belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorId {
    pub layer: usize,
    /// The kv-head for `per_head` tensors; `None` for a `per_layer` tensor.
    pub head: Option<usize>,
    pub kind: TensorKind,
}

/// The attention mask of the sliding-window layers of one window W (input
/// [`crate::mask_name`]`(Some(W))`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowMask {
    /// The window W.
    pub window: usize,
    /// `[n, W - 1 + n]` row-major, 0.0 visible, `-inf` masked: column `j < W - 1` is row j of the
    /// layer's past tensors, column `W - 1 + i` new token i. New token i sees exactly the cached
    /// tokens at positions `>= len + i + 1 - W` and new tokens `0..=i`: the last W positions.
    pub mask: Vec<f32>,
}

/// What a step on the AR-n graph needs from the cache.
///
/// Bindings are stored compactly (one offset per tensor; every past tensor has the same byte length,
/// and so has every new tensor); [`Plan::past`] and [`Plan::new_output`] expand them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// n: tokens the graph computes this step.
    pub ar: usize,
    /// Tokens already cached (the position of the first new token).
    pub past_len: usize,
    /// Context S: the mask has S columns.
    pub context: usize,
    /// True when valid past rows are right-aligned in the window (left padding); false when they fill
    /// the window from its start (`smart_mask`).
    pub left_padded: bool,
    /// Heads per tensor: 1 for per_head, kv_heads for per_layer.
    pub heads_per_tensor: usize,
    pub head_dim: usize,
    /// Bytes of one element.
    pub elem_bytes: usize,
    /// True when K tensors are transposed (`[.., D, rows]`).
    pub k_transposed: bool,
    /// The tensors, in (layer, head, K|V) order (per_layer: (layer, K|V)).
    pub tensors: Vec<TensorId>,
    /// Region byte offset of each tensor's past window (S - n rows).
    pub past_offsets: Vec<usize>,
    /// Region byte offset of each tensor's new rows (n rows).
    pub new_offsets: Vec<usize>,
    /// Attention mask `[n, S]` row-major: 0.0 visible, `-inf` masked. Columns `j < S - n` address row j
    /// of every past window, column `S - n + i` new token i. Causal among new tokens, so padded tokens of
    /// a partial chunk (the tail of the last prefill chunk) are never seen by real ones.
    pub mask: Vec<f32>,
    /// Position of the first new token: `past_len` plus the cache's position offset (non-zero only
    /// after evictions that kept positions, see [`crate::PositionMode`]).
    pub first_position: usize,
    /// Position of each new token: `first_position + i`.
    pub positions: Vec<i32>,
    /// Per-layer attention windows ([`crate::Geometry::windows`]; empty when all are global).
    pub windows: Vec<Option<usize>>,
    /// One mask per distinct sliding window, ascending by window (empty when all are global).
    pub window_masks: Vec<WindowMask>,
    /// The static cross-attention tensors (read-only inputs of every step, `[heads, 1, E, D]`, in
    /// graph order), empty without them: fixed for the cache's life (see [`crate::static_kv`]).
    pub cross: Vec<TensorBinding>,
}

impl Plan {
    fn binding(&self, index: usize, rows: usize, offset: usize) -> TensorBinding {
        let id = self.tensors[index];
        let transposed = self.k_transposed && id.kind == TensorKind::Key;
        let h = self.heads_per_tensor;
        let shape = if transposed {
            [h, 1, self.head_dim, rows]
        } else {
            [h, 1, rows, self.head_dim]
        };
        TensorBinding {
            layer: id.layer,
            head: id.head,
            kind: id.kind,
            shape,
            transposed,
            offset,
            bytes: h * rows * self.head_dim * self.elem_bytes,
        }
    }

    /// Number of K/V tensors (past inputs; the same number of new outputs).
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// The past-window input binding of tensor `index` ([`Plan::past_rows`] rows).
    pub fn past(&self, index: usize) -> TensorBinding {
        let rows = self.past_rows(self.tensors[index].layer);
        self.binding(index, rows, self.past_offsets[index])
    }

    /// Past rows of `layer`'s tensors: S - n, or W - 1 for a sliding layer of window W.
    pub fn past_rows(&self, layer: usize) -> usize {
        self.windows
            .get(layer)
            .copied()
            .flatten()
            .map_or(self.window(), |w| w - 1)
    }

    /// The mask of the layers of window `window` (`None`: the global `[n, S]` mask).
    pub fn mask_for(&self, window: Option<usize>) -> Option<&[f32]> {
        match window {
            None => Some(&self.mask),
            Some(w) => self
                .window_masks
                .iter()
                .find(|m| m.window == w)
                .map(|m| m.mask.as_slice()),
        }
    }

    /// The new-rows output binding of tensor `index`.
    pub fn new_output(&self, index: usize) -> TensorBinding {
        self.binding(index, self.ar, self.new_offsets[index])
    }

    /// Byte length of every past tensor of a global layer.
    pub fn past_bytes(&self) -> usize {
        self.heads_per_tensor * self.window() * self.head_dim * self.elem_bytes
    }

    /// Byte length of every new tensor.
    pub fn new_bytes(&self) -> usize {
        self.heads_per_tensor * self.ar * self.head_dim * self.elem_bytes
    }

    /// The past window W = S - n.
    pub fn window(&self) -> usize {
        self.context - self.ar
    }

    /// Whether past window row `j` holds a valid (visible) row.
    pub fn past_row_visible(&self, j: usize) -> bool {
        let w = self.window();
        if self.left_padded {
            j >= w - self.past_len && j < w
        } else {
            j < self.past_len
        }
    }

    pub(crate) fn fill_mask_and_positions(&mut self) {
        let (n, s, w) = (self.ar, self.context, self.window());
        self.mask.clear();
        self.mask.resize(n * s, f32::NEG_INFINITY);
        let (lo, hi) = if self.left_padded {
            (w - self.past_len, w)
        } else {
            (0, self.past_len)
        };
        for (i, row) in self.mask.chunks_exact_mut(s).enumerate() {
            row[lo..hi].fill(0.0);
            row[w..=w + i].fill(0.0);
        }
        self.positions.clear();
        self.positions
            .extend((0..n).map(|i| (self.first_position + i) as i32));
        self.fill_window_masks();
    }

    /// The sliding windows' masks. A sliding layer's past tensors are the last W - 1 rows of its
    /// window (left-padded: valid rows right-aligned), so column j holds token `len - (W - 1) + j`.
    fn fill_window_masks(&mut self) {
        let mut windows: Vec<usize> = self.windows.iter().flatten().copied().collect();
        windows.sort_unstable();
        windows.dedup();
        let (n, len) = (self.ar, self.past_len);
        self.window_masks
            .resize_with(windows.len(), WindowMask::default);
        for (m, w) in self.window_masks.iter_mut().zip(windows) {
            let p = w - 1;
            m.window = w;
            m.mask.clear();
            m.mask.resize(n * (p + n), f32::NEG_INFINITY);
            for (i, row) in m.mask.chunks_exact_mut(p + n).enumerate() {
                // Cached tokens t with len + i + 1 - W <= t < len, i.e. columns j >= i.
                let first_valid = p.saturating_sub(len);
                row[first_valid.max(i).min(p)..p].fill(0.0);
                row[p..=p + i].fill(0.0);
            }
        }
    }

    /// Writes the mask in the fixed-point form a quantized graph takes (`u8`/`u16`/`i8`/`i16`, little
    /// endian): visible = the integer that dequantizes to exactly 0.0, masked = the type's smallest
    /// integer (the most negative value it can hold). Float specs write f32 or f16 0/-inf.
    pub fn mask_quantized(&self, spec: &QuantSpec, out: &mut [u8]) -> Result<(), KvError> {
        quantize_mask(&self.mask, spec, out)
    }

    /// [`Plan::mask_quantized`] for the mask of the layers of window `window` ([`Plan::mask_for`]).
    pub fn mask_quantized_for(
        &self,
        window: Option<usize>,
        spec: &QuantSpec,
        out: &mut [u8],
    ) -> Result<(), KvError> {
        let mask = self
            .mask_for(window)
            .ok_or_else(|| KvError::InvalidGeometry {
                field: "windows",
                reason: format!("no layer has attention window {window:?}"),
            })?;
        quantize_mask(mask, spec, out)
    }
}

/// Writes `mask` in the form [`Plan::mask_quantized`] describes.
fn quantize_mask(mask: &[f32], spec: &QuantSpec, out: &mut [u8]) -> Result<(), KvError> {
    let size = spec.dtype.size_bytes();
    let expected = mask.len() * size;
    if out.len() != expected {
        return Err(KvError::BufferSize {
            what: "quantized mask buffer",
            expected,
            found: out.len(),
        });
    }
    let (visible, masked): (i64, i64) = match (&spec.encoding, spec.dtype.integer_range()) {
        (Encoding::PerTensor(so), Some((qmin, qmax))) => {
            let zero = -(so.offset as i64);
            let err = |reason| KvError::MaskEncoding {
                dtype: spec.dtype,
                scale: so.scale,
                offset: so.offset,
                reason,
            };
            if zero < qmin as i64 || zero > qmax as i64 {
                return Err(err(
                    "0.0 is not representable (zero point outside the type's range)",
                ));
            }
            if zero == qmin as i64 {
                return Err(err(
                    "no integer below the zero point is left to mean `masked`",
                ));
            }
            (zero, qmin as i64)
        }
        (Encoding::Float, None) => {
            for (v, chunk) in mask.iter().zip(out.chunks_exact_mut(size)) {
                if spec.dtype == DataType::F32 {
                    chunk.copy_from_slice(&v.to_le_bytes());
                } else {
                    chunk.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            }
            return Ok(());
        }
        _ => {
            return Err(KvError::MaskEncoding {
                dtype: spec.dtype,
                scale: 0.0,
                offset: 0,
                reason: "a mask needs a per-tensor encoding of a fixed-point type, or a float type",
            });
        }
    };
    for (v, chunk) in mask.iter().zip(out.chunks_exact_mut(size)) {
        let q = if *v == 0.0 { visible } else { masked };
        match size {
            1 => chunk[0] = q as u8,
            _ => chunk.copy_from_slice(&(q as u16).to_le_bytes()),
        }
    }
    Ok(())
}
