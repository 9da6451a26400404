//! The compiled model's data: weights (quantized or float), encodings, graph descriptions.

use graph_io::{IoRole, IoTensor, KvIo, KvTensor, LogitRows, TensorKind};
use model::{LayerTensor, LlamaConfig, Tensor};
use quant::{DataType, Encoding, QuantError, QuantSpec, ScaleOffset, Symmetry};

use crate::gptq::{Factor, RowGrid, round_rows};
use crate::kernels;
use crate::options::CompileOptions;
use crate::parts::Part;
use crate::stored::{FileBytes, Stored};
use crate::types::{Granularity, KLayout};
use rayon::prelude::*;

/// Scale of the u16 attention-mask encoding: `100 / 65535`.
pub const MASK_SCALE: f32 = 100.0 / 65535.0;
/// Offset of the u16 attention-mask encoding: `-65535`, so `q = 65535` is `0.0` (visible) and
/// `q = 0` is `-100.0` (masked).
pub const MASK_OFFSET: i32 = -65535;
/// A (dequantized) mask value at or below this counts as masked: the key is skipped entirely,
/// whatever its bytes hold. Values above it are added to the attention score (an additive
/// mask), so `0.0` means visible.
pub const MASKED_AT_OR_BELOW: f32 = -50.0;

/// The u16 attention-mask encoding (scale [`MASK_SCALE`], offset [`MASK_OFFSET`]).
pub fn mask_encoding() -> ScaleOffset {
    ScaleOffset {
        scale: MASK_SCALE,
        offset: MASK_OFFSET,
    }
}

/// Where an activation is quantized to i16 (the input of a matmul) in i8-weight models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActSite {
    /// RMSNorm output feeding `wq`, `wk`, `wv`.
    AttnIn,
    /// Attention output feeding `wo`.
    AttnOut,
    /// RMSNorm output feeding `w1`, `w3`.
    FfnIn,
    /// `silu(w1 x) * w3 x` feeding `w2`.
    FfnMid,
}

impl ActSite {
    /// The four per-layer sites in storage order.
    pub const ALL: [ActSite; 4] = [
        ActSite::AttnIn,
        ActSite::AttnOut,
        ActSite::FfnIn,
        ActSite::FfnMid,
    ];
    /// Name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            ActSite::AttnIn => "attn_in",
            ActSite::AttnOut => "attn_out",
            ActSite::FfnIn => "ffn_in",
            ActSite::FfnMid => "ffn_mid",
        }
    }
    pub(crate) const fn index(self) -> usize {
        match self {
            ActSite::AttnIn => 0,
            ActSite::AttnOut => 1,
            ActSite::FfnIn => 2,
            ActSite::FfnMid => 3,
        }
    }
}

/// Index of an activation encoding: `layer * 4 + site`, the final-norm (classifier input)
/// encoding at [`classifier_act_index`].
pub(crate) fn act_index(layer: usize, site: ActSite) -> usize {
    layer * ActSite::ALL.len() + site.index()
}

/// The layer and site of activation encoding `i` ([`act_index`]'s inverse); `None` for the
/// classifier input and beyond.
pub(crate) fn act_of(i: usize, n_layers: usize) -> Option<(usize, ActSite)> {
    let per = ActSite::ALL.len();
    (i < n_layers * per).then(|| (i / per, ActSite::ALL[i % per]))
}

/// Index of the classifier input's encoding, after every layer's; also the number of the
/// layers' encodings.
pub(crate) fn classifier_act_index(n_layers: usize) -> usize {
    n_layers * ActSite::ALL.len()
}

/// An i8 weight matrix as the executor holds it: row-major `rows x cols` values `q`, symmetric,
/// one scale per row (output channel), `w[r][c] = q[r][c] * scales[r]`, `q` in `[-127, 127]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct I8Matrix<'a> {
    /// Rows (output channels).
    pub rows: usize,
    /// Columns (input channels).
    pub cols: usize,
    /// Values, row-major.
    pub q: &'a [i8],
    /// One scale per row.
    pub scales: &'a [f32],
}

impl I8Matrix<'_> {
    /// Row `r` dequantized into `out` (`cols` values): `q[r][c] * scales[r]`, the embedding
    /// gather.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let s = self.scales[r];
        let row = &self.q[r * self.cols..(r + 1) * self.cols];
        for (o, &v) in out.iter_mut().zip(row) {
            *o = f32::from(v) * s;
        }
    }
}

pub(crate) fn finite_absmax(b: &[f32]) -> f32 {
    b.iter()
        .filter(|v| v.is_finite())
        .fold(0.0f32, |a, v| a.max(v.abs()))
}

/// The i8 grid of one row: symmetric, the scale `max|w| / 127`, values in `[-127, 127]`.
pub(crate) fn i8_grid(row: &[f32]) -> Result<RowGrid, QuantError> {
    let m = finite_absmax(row);
    let so = ScaleOffset::from_range(-m, m, DataType::I8, Symmetry::Symmetric)?;
    Ok(RowGrid {
        scale: so.scale,
        mult: vec![1.0],
        block: row.len(),
        lo: -127.0,
        hi: 127.0,
    })
}

/// A weight matrix, row-major `(rows, cols)`, `y = W x`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Matrix {
    /// i8, symmetric, one scale per row (output channel): `w[r][c] = q[r][c] * scales[r]`.
    I8 {
        rows: usize,
        cols: usize,
        scales: Vec<f32>,
        q: Stored<i8>,
        /// `Σ_c q[r][c]` per row, for the activation offset term.
        row_sums: Vec<i64>,
    },
    /// f32 values.
    Float {
        rows: usize,
        cols: usize,
        w: Vec<f32>,
    },
    /// f16 values, kept as f16 (half the memory of widening them) and widened in the kernel
    /// ([`kernels::matmul_f16`]): the same products as the widened f32 matrix.
    Half {
        rows: usize,
        cols: usize,
        w: Stored<kernels::F16Le>,
    },
}

impl Matrix {
    /// Quantizes `w` (row-major `rows x cols`) to i8 per row, symmetric: the scale of a row
    /// is `max|w| / 127` and values are clamped to `[-127, 127]`. (A per-row MSE-optimal
    /// clipping search was measured on stories260K and did not improve agreement or KL.)
    pub(crate) fn quantize_i8(w: &[f32], rows: usize, cols: usize) -> Result<Matrix, QuantError> {
        let mut scales = Vec::with_capacity(rows);
        let mut q = Vec::with_capacity(rows * cols);
        for row in w.chunks_exact(cols.max(1)).take(rows) {
            let so = ScaleOffset::new(i8_grid(row)?.scale, 0)?;
            scales.push(so.scale);
            q.extend(
                row.iter()
                    .map(|&v| quant::quantize::<i8>(v, so).clamp(-127, 127)),
            );
        }
        Ok(Matrix::from_i8(rows, cols, scales, q))
    }

    /// `w` on the grids to-nearest rounding fixes (`grid` per row: [`i8_grid`] or
    /// [`lpbq_grid`]), its values rounded by the output error over calibration instead
    /// ([`crate::gptq`], the factor `f` of the input's Gram matrix).
    pub(crate) fn quantize_by_error(
        w: &[f32],
        (rows, cols): (usize, usize),
        grid: impl Fn(&[f32]) -> Result<RowGrid, QuantError> + Sync,
        f: &Factor,
    ) -> Result<Matrix, QuantError> {
        assert_eq!(
            f.n(),
            cols,
            "a Gram matrix of another width than the matrix's inputs"
        );
        let grids: Vec<RowGrid> = w
            .par_chunks_exact(cols.max(1))
            .take(rows)
            .map(&grid)
            .collect::<Result<_, _>>()?;
        let q = round_rows(&w[..rows * cols], f, &grids);
        let scales = grids.iter().map(|g| g.scale).collect();
        Ok(Matrix::from_i8(rows, cols, scales, q))
    }

    pub(crate) fn from_i8(
        rows: usize,
        cols: usize,
        scales: Vec<f32>,
        q: impl Into<Stored<i8>>,
    ) -> Matrix {
        let q = q.into();
        let row_sums = q
            .chunks_exact(cols.max(1))
            .map(|r| r.iter().map(|&v| i64::from(v)).sum())
            .collect();
        Matrix::I8 {
            rows,
            cols,
            scales,
            q,
            row_sums,
        }
    }

    /// The i8 form of an i8 matrix (`None` for float weights).
    pub(crate) fn as_i8(&self) -> Option<I8Matrix<'_>> {
        match self {
            Matrix::I8 {
                rows,
                cols,
                scales,
                q,
                ..
            } => Some(I8Matrix {
                rows: *rows,
                cols: *cols,
                q,
                scales,
            }),
            Matrix::Float { .. } | Matrix::Half { .. } => None,
        }
    }

    /// Float weights; with `half` they are rounded to f16.
    pub(crate) fn float(w: &[f32], rows: usize, cols: usize, half: bool) -> Matrix {
        if half {
            let w = w
                .iter()
                .map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect::<Vec<_>>();
            return Matrix::Half {
                rows,
                cols,
                w: w.into(),
            };
        }
        Matrix::Float {
            rows,
            cols,
            w: w.to_vec(),
        }
    }

    /// Row `r` as f32 (dequantized for i8): the embedding gather.
    pub(crate) fn row_into(&self, r: usize, out: &mut [f32]) {
        match self {
            Matrix::I8 {
                rows,
                cols,
                scales,
                q,
                ..
            } => I8Matrix {
                rows: *rows,
                cols: *cols,
                q,
                scales,
            }
            .row_into(r, out),
            Matrix::Float { cols, w, .. } => {
                out.copy_from_slice(&w[r * cols..(r + 1) * cols]);
            }
            Matrix::Half { cols, w, .. } => {
                for (o, &v) in out.iter_mut().zip(&w[r * cols..(r + 1) * cols]) {
                    *o = kernels::widen_f16(v);
                }
            }
        }
    }

    /// `out = W[row0 .. row0 + out.len()] · x` (one token: [`Matrix::matmul`] with `n = 1`).
    ///
    /// Float matrices: f32 dot products (`model::ops::matmul`, the float model's kernel).
    /// i8 matrices: `x` is quantized to i16 with `act` (static encoding; `qbuf` is scratch of
    /// at least `x.len()`), each row is accumulated in integers (i32 partial sums over at most
    /// [`I32_CHUNK`](crate::kernels::I32_CHUNK) products, which cannot overflow, summed in i64; see
    /// [`crate::kernels`]), the activation offset is applied as `offset * Σ q_w` in i64, and
    /// the result is rescaled once:
    /// `out[r] = (acc + offset * rowsum[r]) * act.scale * scales[r]` (the i64 → f32 conversion
    /// and two f32 multiplications are the only rounding after the activation quantization).
    pub(crate) fn matvec(
        &self,
        row0: usize,
        out: &mut [f32],
        x: &[f32],
        act: Option<ScaleOffset>,
        qbuf: &mut [i16],
    ) {
        match self {
            Matrix::Float { cols, w, .. } => {
                let w = &w[row0 * cols..(row0 + out.len()) * cols];
                model::ops::matmul(out, x, w);
            }
            Matrix::Half { cols, w, .. } => {
                let w = &w[row0 * cols..(row0 + out.len()) * cols];
                kernels::matmul_f16(out, x, w, *cols, &mut []);
            }
            Matrix::I8 { .. } => self.matmul_i8(row0, out, x, act, qbuf),
        }
    }

    /// `n` tokens at once: `out[t * m + r] = W[row0 + r] · x[t * cols ..]` for `t < n` and
    /// `r < m = out.len() / n`, exactly as `n` calls of [`Matrix::matvec`] would compute them,
    /// but every weight row is read once for all tokens. `qbuf` is scratch of at least
    /// `x.len()` i16 and `tbuf` of at least `out.len()` f32.
    ///
    /// # Panics
    /// If `n == 0` or `x` / `out` are not `n` rows of the matrix's columns / of `m`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        row0: usize,
        n: usize,
        out: &mut [f32],
        x: &[f32],
        act: Option<ScaleOffset>,
        qbuf: &mut [i16],
        tbuf: &mut [f32],
    ) {
        let cols = self.cols();
        assert!(
            n > 0 && x.len() == n * cols && out.len().is_multiple_of(n),
            "Matrix::matmul: {} inputs / {} outputs are not {n} tokens of {cols} columns",
            x.len(),
            out.len()
        );
        let m = out.len() / n;
        match self {
            Matrix::Float { .. } | Matrix::Half { .. } if n == 1 => {
                self.matvec(row0, out, x, act, qbuf)
            }
            Matrix::Float { cols, w, .. } => {
                let w = &w[row0 * cols..(row0 + m) * cols];
                let t = &mut tbuf[..out.len()];
                model::ops::matmul_rows(out, x, w, *cols, t);
            }
            Matrix::Half { cols, w, .. } => {
                let w = &w[row0 * cols..(row0 + m) * cols];
                kernels::matmul_f16(out, x, w, *cols, tbuf);
            }
            Matrix::I8 { .. } if n == 1 => self.matmul_i8(row0, out, x, act, qbuf),
            Matrix::I8 { .. } => {
                // The kernel writes row-major by weight row; transpose to token-major.
                let t = &mut tbuf[..out.len()];
                self.matmul_i8(row0, t, x, act, qbuf);
                transpose(t, n, out);
            }
        }
    }

    /// Bytes the matrix takes in memory beyond the compiled file's bytes it reads its values
    /// from ([`Matrix::file`]): its own values, row scales and row sums.
    pub(crate) fn own_bytes(&self) -> usize {
        match self {
            Matrix::I8 { q, scales, .. } => q.own_bytes() + scales.len() * (4 + 8),
            Matrix::Float { w, .. } => w.len() * 4,
            Matrix::Half { w, .. } => w.own_bytes(),
        }
    }

    /// The compiled file whose bytes hold the values (`None` for values of its own).
    pub(crate) fn file(&self) -> Option<&FileBytes> {
        match self {
            Matrix::I8 { q, .. } => q.file(),
            Matrix::Half { w, .. } => w.file(),
            Matrix::Float { .. } => None,
        }
    }

    /// Columns (the input width).
    pub(crate) fn cols(&self) -> usize {
        match self {
            Matrix::I8 { cols, .. } | Matrix::Float { cols, .. } | Matrix::Half { cols, .. } => {
                *cols
            }
        }
    }

    /// The i8 path: quantizes the `n = x.len() / cols` tokens of `x` and writes
    /// `out[r * n + t]` (row-major by weight row).
    fn matmul_i8(
        &self,
        row0: usize,
        out: &mut [f32],
        x: &[f32],
        act: Option<ScaleOffset>,
        qbuf: &mut [i16],
    ) {
        let (cols, q) = self.i8_weights();
        let so = act_or_unit(act);
        let qa = quantize_acts(x, so, qbuf);
        let rows = out.len() / (x.len() / cols).max(1);
        let w = &q[row0 * cols..(row0 + rows) * cols];
        let finish = self.i8_finish(row0, so);
        kernels::matmul_i8_i16(w, qa, cols, out, finish);
    }

    /// `n` tokens through several i8 matrices of `cols` columns that share the activation
    /// encoding `act` (a layer's Q/K/V, or its gate/up): `x` is quantized once and all rows
    /// run as one parallel job; `outs[i]` is token-major, exactly as [`Matrix::matmul`] of
    /// `ms[i]` alone. `qbuf` is scratch of at least `x.len()` i16; with `n > 1`, `tbuf` holds
    /// the kernel's row-major products of all matrices (at least the outputs' total length).
    ///
    /// # Panics
    /// If a matrix is not i8, the column counts differ, an output has the wrong length, or
    /// `tbuf` is short.
    pub(crate) fn matmul_i8_many(
        ms: &[&Matrix],
        outs: &mut [&mut [f32]],
        (x, n): (&[f32], usize),
        act: Option<ScaleOffset>,
        qbuf: &mut [i16],
        tbuf: &mut [f32],
    ) {
        let so = act_or_unit(act);
        let qa = quantize_acts(x, so, qbuf);
        if n == 1 {
            let targets = outs.iter_mut().map(|o| &mut **o).collect();
            return Self::run_i8_many(ms, targets, qa, so);
        }
        let mut rest = &mut tbuf[..];
        let mut targets = Vec::with_capacity(outs.len());
        for o in outs.iter() {
            let (t, r) = std::mem::take(&mut rest).split_at_mut(o.len());
            targets.push(t);
            rest = r;
        }
        Self::run_i8_many(ms, targets, qa, so);
        let mut rows = &tbuf[..];
        for o in outs.iter_mut() {
            let (t, r) = rows.split_at(o.len());
            transpose(t, n, o);
            rows = r;
        }
    }

    /// The products of [`Matrix::matmul_i8_many`] as one kernel job, row-major by weight row.
    fn run_i8_many(ms: &[&Matrix], targets: Vec<&mut [f32]>, qa: &[i16], so: ScaleOffset) {
        let cols = ms[0].cols();
        let finishers: Vec<_> = ms.iter().map(|m| m.i8_finish(0, so)).collect();
        let products = ms
            .iter()
            .zip(targets)
            .zip(&finishers)
            .map(|((m, out), finish)| {
                let (c, w) = m.i8_weights();
                assert_eq!(c, cols, "matmul_i8_many: column counts differ");
                kernels::Product { w, out, finish }
            })
            .collect();
        kernels::matmul_i8_i16_many(qa, cols, products);
    }

    /// Columns and weights of an i8 matrix.
    fn i8_weights(&self) -> (usize, &[i8]) {
        match self {
            Matrix::I8 { cols, q, .. } => (*cols, q),
            Matrix::Float { .. } | Matrix::Half { .. } => {
                unreachable!("an i8 path on a float matrix")
            }
        }
    }

    /// How row `row0 + r`'s exact integer sum becomes its output: the activation offset is
    /// applied as `offset * Σ q_w` in i64, then one rescale (see [`Matrix::matvec`]).
    fn i8_finish(
        &self,
        row0: usize,
        so: ScaleOffset,
    ) -> impl Fn(usize, &[i64], &mut [f32]) + Sync + '_ {
        let Matrix::I8 {
            scales, row_sums, ..
        } = self
        else {
            unreachable!("an i8 path on a float matrix")
        };
        let off = i64::from(so.offset);
        move |r, sums, out| {
            let row = row0 + r;
            kernels::rescale(sums, off * row_sums[row], (so.scale, scales[row]), out);
        }
    }

    /// True for an i8 matrix.
    pub(crate) fn is_i8(&self) -> bool {
        matches!(self, Matrix::I8 { .. })
    }
}

/// An i8 model always carries activation encodings (compile and the file reader guarantee
/// it); the fallback is the unit encoding.
fn act_or_unit(act: Option<ScaleOffset>) -> ScaleOffset {
    act.unwrap_or(ScaleOffset {
        scale: 1.0,
        offset: 0,
    })
}

/// Activations quantized per task of [`quantize_acts`] (a prefill's worth is split over the
/// pool; a decode step's few hundred stay on the calling thread).
const QUANTIZE_CHUNK: usize = 4096;

/// `x` quantized to i16 with `so` into the front of `qbuf`, in parallel over chunks when `x`
/// is long (each value is quantized alone, so the split changes nothing).
fn quantize_acts<'a>(x: &[f32], so: ScaleOffset, qbuf: &'a mut [i16]) -> &'a [i16] {
    let qa = &mut qbuf[..x.len()];
    qa.par_chunks_mut(QUANTIZE_CHUNK)
        .zip(x.par_chunks(QUANTIZE_CHUNK))
        .with_min_len(kernels::min_len_for(x.len(), 4 * QUANTIZE_CHUNK))
        .for_each(|(q, x)| kernels::quantize_i16(x, so, q));
    qa
}

/// Where an activation is quantized for the matmul `t`: its [`ActSite`] (`None` for the
/// classifier, whose input encoding is the final one).
pub(crate) fn act_site(t: LayerTensor) -> Option<ActSite> {
    use LayerTensor as L;
    match t {
        L::Q | L::K | L::V => Some(ActSite::AttnIn),
        L::O => Some(ActSite::AttnOut),
        L::Gate | L::Up => Some(ActSite::FfnIn),
        L::Down => Some(ActSite::FfnMid),
        _ => None,
    }
}

/// One layer's weights: its seven matrices in [`LayerData::MATRICES`] order and its f32
/// vectors in [`LayerData::VECTORS`] order (biases empty unless the model has them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerData {
    pub(crate) matrices: Vec<Matrix>,
    pub(crate) vectors: Vec<Vec<f32>>,
}

impl LayerData {
    /// The matrices of a layer, in storage order.
    pub(crate) const MATRICES: [LayerTensor; 7] = [
        LayerTensor::Q,
        LayerTensor::K,
        LayerTensor::V,
        LayerTensor::O,
        LayerTensor::Gate,
        LayerTensor::Up,
        LayerTensor::Down,
    ];
    /// The f32 vectors of a layer, in storage order: the first five in every file (empty when
    /// the model has none), the rest ([`LayerData::stored`]) only where the block has them.
    pub(crate) const VECTORS: [LayerTensor; 9] = [
        LayerTensor::AttnNorm,
        LayerTensor::FfnNorm,
        LayerTensor::QBias,
        LayerTensor::KBias,
        LayerTensor::VBias,
        LayerTensor::QNorm,
        LayerTensor::KNorm,
        LayerTensor::PostAttnNorm,
        LayerTensor::PostFfnNorm,
    ];

    /// Whether the file holds vector `t` of a layer of `c`: the first five always (format
    /// versions 3 to 5 wrote them, empty when absent), a block's norms where it has them.
    pub(crate) fn stored(t: LayerTensor, c: &LlamaConfig) -> bool {
        Self::VECTORS[..5].contains(&t) || t.present(c)
    }

    pub(crate) fn matrix(&self, t: LayerTensor) -> Option<&Matrix> {
        let i = Self::MATRICES.iter().position(|&m| m == t)?;
        self.matrices.get(i)
    }

    fn vector(&self, t: LayerTensor) -> Option<&[f32]> {
        let i = Self::VECTORS.iter().position(|&v| v == t)?;
        self.vectors.get(i).map(Vec::as_slice)
    }
}

/// Everything a graph needs to run, shared by all graphs of a compiled model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelData {
    pub(crate) config: LlamaConfig,
    pub(crate) options: CompileOptions,
    /// SHA-256 of the model file(s) this was compiled from (the caller's fingerprint).
    pub(crate) model_sha256: [u8; 32],
    /// The token sequences calibration started from.
    pub(crate) calibration: Vec<Vec<u32>>,
    /// `(vocab, dim)`; also the classifier when `classifier` is `None` (tied). Held by the
    /// whole model and by the parts [`Part::holds_embedding`] names.
    pub(crate) embedding: Option<Matrix>,
    /// The layer `layers[0]` is (0 for the whole model; a part holds only its own layers).
    pub(crate) first_layer: usize,
    pub(crate) layers: Vec<LayerData>,
    /// Empty unless the last part (or the whole model): the final norm and the LM head.
    pub(crate) output_norm: Vec<f32>,
    pub(crate) classifier: Option<Matrix>,
    /// i16 activation encodings (`n_layers * 4 + 1`, see [`act_index`]); empty for float
    /// weights.
    pub(crate) act: Vec<ScaleOffset>,
    /// KV specs, indexed by buffer ([`KvTensor::position`] of the per-head tensor).
    pub(crate) kv: Vec<QuantSpec>,
}

impl ModelData {
    /// The weights `part` runs: its layers, the embedding where [`Part::holds_embedding`], the
    /// final norm and the LM head in the last part (everything else dropped). `self` holds at
    /// least those (the whole model, or this part already).
    pub(crate) fn for_part(&self, part: &Part) -> ModelData {
        let layers = part
            .layers
            .clone()
            .filter_map(|l| self.layer(l).cloned())
            .collect();
        let last = part.is_last();
        ModelData {
            embedding: self
                .embedding
                .clone()
                .filter(|_| part.holds_embedding(self.config.tied_output)),
            first_layer: part.layers.start,
            layers,
            output_norm: if last {
                self.output_norm.clone()
            } else {
                Vec::new()
            },
            classifier: self.classifier.clone().filter(|_| last),
            ..self.clone_without_weights()
        }
    }

    /// Everything but the weights (which are left empty).
    fn clone_without_weights(&self) -> ModelData {
        ModelData {
            config: self.config.clone(),
            options: self.options.clone(),
            model_sha256: self.model_sha256,
            calibration: self.calibration.clone(),
            embedding: None,
            first_layer: 0,
            layers: Vec::new(),
            output_norm: Vec::new(),
            classifier: None,
            act: self.act.clone(),
            kv: self.kv.clone(),
        }
    }

    /// Layer `l`'s weights, if this model (part) holds them.
    pub(crate) fn layer(&self, l: usize) -> Option<&LayerData> {
        self.layers.get(l.checked_sub(self.first_layer)?)
    }

    /// The embedding matrix (the token lookup of the first part).
    ///
    /// # Panics
    /// In a part that does not hold it (a programming error: only the first part embeds, and
    /// [`ModelData`] is validated when built or read).
    pub(crate) fn embedding(&self) -> &Matrix {
        self.embedding
            .as_ref()
            .unwrap_or_else(|| panic!("this part holds no embedding"))
    }

    pub(crate) fn classifier(&self) -> &Matrix {
        self.classifier.as_ref().unwrap_or_else(|| self.embedding())
    }

    pub(crate) fn act(&self, layer: usize, site: ActSite) -> Option<ScaleOffset> {
        self.act.get(act_index(layer, site)).copied()
    }

    pub(crate) fn act_final(&self) -> Option<ScaleOffset> {
        self.act
            .get(classifier_act_index(self.config.n_layers))
            .copied()
    }

    /// The matrix `t` (a layer matrix or the classifier) and the static encoding of its input.
    ///
    /// # Panics
    /// For a tensor that is not a matrix of this model (a programming error: the forward only
    /// asks for those, and [`ModelData`] is validated when built or read).
    pub(crate) fn linear(&self, t: Tensor) -> (&Matrix, Option<ScaleOffset>) {
        let m = match t {
            Tensor::Layer(l, lt) => self
                .layer(l)
                .and_then(|d| d.matrix(lt))
                .filter(|_| act_site(lt).is_some())
                .unwrap_or_else(|| panic!("{t} is not a matrix")),
            Tensor::TokenEmbedding | Tensor::Output => self.classifier(),
            Tensor::OutputNorm => panic!("{t} is not a matrix"),
        };
        (m, self.input_encoding(t))
    }

    /// The static encoding of the input of matrix `t` (`None` for float weights or a tensor that
    /// is not a matrix): its layer's [`ActSite`], or the final one for the classifier.
    pub(crate) fn input_encoding(&self, t: Tensor) -> Option<ScaleOffset> {
        match t {
            Tensor::Layer(l, lt) => act_site(lt).and_then(|s| self.act(l, s)),
            Tensor::TokenEmbedding | Tensor::Output => self.act_final(),
            Tensor::OutputNorm => None,
        }
    }

    /// The f32 vector `t` (a norm weight or a bias).
    ///
    /// # Panics
    /// For a tensor that is not a vector of this model (see [`ModelData::linear`]).
    pub(crate) fn vector(&self, t: Tensor) -> &[f32] {
        let v = match t {
            Tensor::OutputNorm => Some(self.output_norm.as_slice()),
            Tensor::Layer(l, lt) => self.layer(l).and_then(|d| d.vector(lt)),
            _ => None,
        };
        v.unwrap_or_else(|| panic!("{t} is not a vector"))
    }

    pub(crate) fn kv_spec(&self, layer: usize, head: usize, value: bool) -> &QuantSpec {
        let kind = if value {
            TensorKind::Value
        } else {
            TensorKind::Key
        };
        &self.kv[graph_io::buffer_index(layer, head, kind, self.config.n_kv_heads)]
    }

    /// The encoding of layer `layer`'s K (or V, `value`) tensor: of one head's buffer, or per
    /// layer (`head == None`) one scale/offset per KV head along axis 0.
    fn kv_encoding(&self, layer: usize, head: Option<usize>, value: bool) -> Encoding {
        if let Some(h) = head {
            return self.kv_spec(layer, h, value).encoding.clone();
        }
        if !self.options.kv_dtype.is_fixed_point() {
            return Encoding::Float;
        }
        Encoding::PerAxis {
            axis: 0,
            params: (0..self.config.n_kv_heads)
                .map(|h| match self.kv_spec(layer, h, value).encoding {
                    Encoding::PerTensor(so) => so,
                    _ => ScaleOffset {
                        scale: 1.0,
                        offset: 0,
                    },
                })
                .collect(),
        }
    }

    /// The attention window of `layer` in the graphs: `Some(W)` for a sliding layer whose window
    /// is shorter than the context, `None` for a global layer (a window the context never
    /// reaches attends exactly as a global layer).
    pub(crate) fn graph_window(&self, layer: usize) -> Option<usize> {
        self.config.graph_window(layer, self.options.context)
    }

    /// Rows of `layer`'s past tensors in the AR-`n` graph: `S - n`, or `W - 1` for a sliding
    /// layer of window W (kv_manager's `Geometry::past_rows`).
    pub(crate) fn past_rows(&self, layer: usize, n: usize) -> usize {
        self.graph_window(layer)
            .map_or(self.options.context - n, |w| w - 1)
    }

    /// The distinct sliding windows of `part`'s layers, ascending: one mask input each, after the
    /// global `attention_mask`.
    pub(crate) fn part_windows(&self, part: &Part) -> Vec<usize> {
        let mut w: Vec<usize> = part
            .layers
            .clone()
            .filter_map(|l| self.graph_window(l))
            .collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// The input and output descriptions of the AR-`n` graph of `part` whose logits hold `rows`.
    pub(crate) fn describe(
        &self,
        n: usize,
        rows: LogitRows,
        part: &Part,
    ) -> (Vec<IoTensor>, Vec<IoTensor>) {
        let c = &self.config;
        let o = &self.options;
        let d = c.head_dim;
        let hk = c.n_kv_heads;
        let (mut inputs, mut outputs) = self.describe_leading(n, rows, part);
        let dtype = o.kv_dtype;
        let kshape = |rows: usize, lead: usize| match o.k_layout {
            KLayout::Rows => vec![lead, 1, rows, d],
            KLayout::Transposed => vec![lead, 1, d, rows],
        };
        for l in part.layers.clone() {
            let w = self.past_rows(l, n);
            let heads: Vec<Option<usize>> = match o.granularity {
                Granularity::PerHead => (0..hk).map(Some).collect(),
                Granularity::PerLayer => vec![None],
            };
            for head in heads {
                let lead = if head.is_some() { 1 } else { hk };
                for (io, rows) in [(KvIo::Past, w), (KvIo::New, n)] {
                    for kind in [TensorKind::Key, TensorKind::Value] {
                        let t = KvTensor {
                            io,
                            kind,
                            layer: l,
                            head,
                        };
                        let encoding = self.kv_encoding(l, head, kind == TensorKind::Value);
                        let desc = IoTensor {
                            name: part.naming.kv_name(&t),
                            shape: match kind {
                                TensorKind::Key => kshape(rows, lead),
                                TensorKind::Value => vec![lead, 1, rows, d],
                            },
                            dtype,
                            quant: Some(QuantSpec { dtype, encoding }),
                            role: IoRole::kv(io, kind),
                            layer: Some(l),
                            head,
                        };
                        match io {
                            KvIo::Past | KvIo::Cross => inputs.push(desc),
                            KvIo::New => outputs.push(desc),
                        }
                    }
                }
            }
        }
        (inputs, outputs)
    }
    /// The tensors before the K/V ones: token ids or the hidden state, positions or RoPE
    /// tables, the mask; logits or the hidden state.
    fn describe_leading(
        &self,
        n: usize,
        rows: LogitRows,
        part: &Part,
    ) -> (Vec<IoTensor>, Vec<IoTensor>) {
        let c = &self.config;
        let s = self.options.context;
        let hidden = |name: &str, role| plain(name, vec![1, n, c.dim], DataType::F32, role);
        let mut inputs = vec![if part.is_first() {
            plain("input_ids", vec![1, n], DataType::I32, IoRole::InputIds)
        } else {
            hidden(&part.hidden_in_name(), IoRole::HiddenIn)
        }];
        if part.embeds_only() {
            // AI Hub's part 1: the token lookup only.
            return (
                inputs,
                vec![hidden(&part.hidden_out_name(), IoRole::HiddenOut)],
            );
        }
        if part.rope_tables {
            let table = vec![1, 1, n, c.head_dim / 2];
            inputs.push(plain(
                "position_ids_cos",
                table.clone(),
                DataType::F32,
                IoRole::RopeCos,
            ));
            inputs.push(plain(
                "position_ids_sin",
                table,
                DataType::F32,
                IoRole::RopeSin,
            ));
        } else {
            inputs.push(plain(
                "positions",
                vec![1, n],
                DataType::I32,
                IoRole::Positions,
            ));
        }
        // The global mask, then one per distinct sliding window W: `[n, W - 1 + n]`.
        let windows = self.part_windows(part).into_iter().map(Some);
        for window in std::iter::once(None).chain(windows) {
            let cols = window.map_or(s, |w| w - 1 + n);
            let (dtype, encoding) = if self.options.kv_dtype.is_fixed_point() {
                (DataType::U16, Encoding::PerTensor(mask_encoding()))
            } else {
                (DataType::F32, Encoding::Float)
            };
            inputs.push(IoTensor {
                quant: Some(QuantSpec { dtype, encoding }),
                ..plain(
                    &graph_io::mask_name(window),
                    vec![1, 1, n, cols],
                    dtype,
                    IoRole::Mask,
                )
            });
        }
        let output = if part.is_last() {
            plain(
                "logits",
                vec![1, rows.count(n), c.vocab_size],
                DataType::F32,
                IoRole::Logits,
            )
        } else {
            hidden(&part.hidden_out_name(), IoRole::HiddenOut)
        };
        (inputs, vec![output])
    }
}

fn plain(name: &str, shape: Vec<usize>, dtype: DataType, role: IoRole) -> IoTensor {
    IoTensor {
        name: name.into(),
        quant: dtype.is_real().then_some(QuantSpec {
            dtype,
            encoding: Encoding::Float,
        }),
        shape,
        dtype,
        role,
        layer: None,
        head: None,
    }
}

/// The name of the AR-`n` graph for context `s`: `ar{n}_cl{s}`.
pub fn graph_name(n: usize, s: usize) -> String {
    format!("ar{n}_cl{s}")
}

/// Tokens per task of [`transpose`]: a 64-byte line of the source holds this many f32.
const TRANSPOSE_TOKENS: usize = 16;

/// `out[i * m + r] = t[r * n + i]`: the kernel's row-major-by-weight-row products as
/// token-major rows (`m = t.len() / n`). In parallel over groups of [`TRANSPOSE_TOKENS`]
/// tokens, each reading one cache line of `t` per weight row and writing that many rows of
/// `out` in order (the classifier's products of a 128-token prefill are 25 MB).
fn transpose(t: &[f32], n: usize, out: &mut [f32]) {
    let m = t.len() / n;
    if m == 0 {
        return;
    }
    out.par_chunks_mut(TRANSPOSE_TOKENS * m)
        .enumerate()
        .with_min_len(kernels::min_len_for(t.len(), kernels::PARALLEL_MIN_MACS))
        .for_each(|(g, block)| transpose_block(t, n, g * TRANSPOSE_TOKENS, block));
}

/// The tokens `i0..` of `t` (row-major by weight row, `n` tokens per row) into `block`
/// (token-major, `m` values per token), through 16 x 16 tiles in L1: a tile is filled from
/// one cache line of 16 source rows, then written as 16 contiguous runs, so no store is
/// scattered over 16 output lines.
fn transpose_block(t: &[f32], n: usize, i0: usize, block: &mut [f32]) {
    const TILE: usize = TRANSPOSE_TOKENS;
    let m = t.len() / n;
    let kn = block.len() / m;
    let mut tile = [[0.0f32; TILE]; TILE];
    for r0 in (0..m).step_by(TILE) {
        let rn = TILE.min(m - r0);
        for (j, src) in t[r0 * n..].chunks_exact(n).take(rn).enumerate() {
            for (k, &v) in src[i0..i0 + kn].iter().enumerate() {
                tile[k][j] = v;
            }
        }
        for (k, row) in tile.iter().take(kn).enumerate() {
            block[k * m + r0..k * m + r0 + rn].copy_from_slice(&row[..rn]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_matvec_matches_dequantized_float_math() {
        // 3 x 600 (longer than one i32 chunk), asymmetric i16 activations.
        let (rows, cols) = (3, 600);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 13 % 29) as f32) / 7.0 - 1.0)
            .collect();
        let m = Matrix::quantize_i8(&w, rows, cols).unwrap();
        let so = ScaleOffset::from_range(-1.0, 3.0, DataType::I16, Symmetry::Asymmetric).unwrap();
        let mut out = vec![0.0; rows];
        let mut qbuf = vec![0i16; cols];
        m.matvec(0, &mut out, &x, Some(so), &mut qbuf);
        let Matrix::I8 { scales, q, .. } = &m else {
            panic!("not i8")
        };
        for r in 0..rows {
            // Bit-exact: the scalar definition, summed in i64, rescaled once.
            let wr = &q[r * cols..(r + 1) * cols];
            let exact: i64 = wr
                .iter()
                .zip(&x)
                .map(|(&wq, &xv)| i64::from(wq) * i64::from(quant::quantize::<i16>(xv, so)))
                .sum::<i64>()
                + i64::from(so.offset) * wr.iter().map(|&v| i64::from(v)).sum::<i64>();
            assert_eq!(
                out[r].to_bits(),
                (exact as f32 * so.scale * scales[r]).to_bits()
            );
            // Oracle: f64 sum of dequantized weights times dequantized activations.
            let mut want = 0.0f64;
            for c in 0..cols {
                let wq = f64::from(q[r * cols + c]) * f64::from(scales[r]);
                let aq = f64::from(quant::dequantize(quant::quantize::<i16>(x[c], so), so));
                want += wq * aq;
            }
            assert!(
                (f64::from(out[r]) - want).abs() < 1e-4 * want.abs().max(1.0),
                "row {r}: {} vs {want}",
                out[r]
            );
            // And close to the float product.
            let f: f64 = (0..cols)
                .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
                .sum();
            assert!(
                (f - want).abs() < 0.05 * f.abs().max(1.0),
                "row {r}: {f} vs {want}"
            );
        }
    }

    #[test]
    fn fused_matmuls_equal_one_matmul_per_matrix() {
        // Q/K/V-like shapes over one input; large enough to split over threads. 40 tokens of
        // 600 are also enough to quantize the activations in parallel.
        let cols = 600;
        let shapes = [(96, 0.37f32), (32, -0.5), (32, 1.25)];
        let ms: Vec<Matrix> = shapes
            .iter()
            .map(|&(rows, k)| {
                let w: Vec<f32> = (0..rows * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0 * k)
                    .collect();
                Matrix::quantize_i8(&w, rows, cols).unwrap()
            })
            .collect();
        let refs: Vec<&Matrix> = ms.iter().collect();
        let so = ScaleOffset::from_range(-1.0, 3.0, DataType::I16, Symmetry::Asymmetric).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for n in [1, 5, 40] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 13 % 29) as f32) / 7.0 - 1.0 + (i / cols) as f32 * 0.01)
                .collect();
            let mut qbuf = vec![0i16; n * cols];
            let mut tbuf = vec![0.0; n * 160];
            let mut fused: Vec<Vec<f32>> = shapes.iter().map(|&(r, _)| vec![0.0; r * n]).collect();
            let mut outs: Vec<&mut [f32]> = fused.iter_mut().map(|v| v.as_mut_slice()).collect();
            pool.install(|| {
                Matrix::matmul_i8_many(&refs, &mut outs, (&x, n), Some(so), &mut qbuf, &mut tbuf)
            });
            for (m, got) in ms.iter().zip(&fused) {
                let mut want = vec![0.0; got.len()];
                let mut t = vec![0.0; got.len()];
                m.matmul(0, n, &mut want, &x, Some(so), &mut qbuf, &mut t);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "{n} tokens");
            }
        }
    }

    #[test]
    fn transpose_equals_the_plain_definition() {
        for (m, n) in [(1, 1), (37, 40), (16, 16), (5, 33), (100, 17)] {
            let t: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut out = vec![f32::NAN; m * n];
            transpose(&t, n, &mut out);
            for i in 0..n {
                for r in 0..m {
                    assert_eq!(out[i * m + r], t[r * n + i], "m {m} n {n}");
                }
            }
        }
    }

    #[test]
    fn batched_matmul_equals_one_matvec_per_token() {
        let (rows, cols, n) = (37, 600, 5);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 13 % 29) as f32) / 7.0 - 1.0)
            .collect();
        let so = ScaleOffset::from_range(-1.0, 3.0, DataType::I16, Symmetry::Asymmetric).unwrap();
        let (row0, m) = (3, 30);
        for mat in [
            Matrix::quantize_i8(&w, rows, cols).unwrap(),
            Matrix::float(&w, rows, cols, false),
        ] {
            let mut qbuf = vec![0i16; n * cols];
            let mut want = vec![0.0f32; n * m];
            for (o, xt) in want.chunks_exact_mut(m).zip(x.chunks_exact(cols)) {
                mat.matvec(row0, o, xt, Some(so), &mut qbuf);
            }
            let mut got = vec![f32::NAN; n * m];
            let mut tbuf = vec![0.0f32; n * m];
            mat.matmul(row0, n, &mut got, &x, Some(so), &mut qbuf, &mut tbuf);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn i32_chunk_cannot_overflow() {
        use crate::kernels::I32_CHUNK;
        let worst = I32_CHUNK as i64 * 127 * 32768;
        assert!(worst <= i64::from(i32::MAX));
        assert!((I32_CHUNK as i64 + 1) * 127 * 32768 > i64::from(i32::MAX));
    }
}
