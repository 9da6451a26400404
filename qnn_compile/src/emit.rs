//! A thin, shape-tracking layer over [`qnn_ffi::GraphBuilder`]: every value is a named float
//! tensor with a known shape, and each method adds one QNN operation (`qti.aisw` op definitions)
//! and returns its output.

use crate::encoding::Fixed;
use crate::w8a16::W8Matrix;
use qnn_ffi::bindings as b;
use qnn_ffi::{GraphBuilder, NewTensor, Param, QnnError, Quantization, Scalar, TensorKind};

/// A value of the graph: a tensor name and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Val {
    /// Tensor name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<u32>,
}

/// Emits operations into one graph, naming intermediate tensors `{prefix}_{counter}`.
#[derive(Debug)]
pub struct Emitter {
    g: GraphBuilder,
    next: usize,
}

/// A tensor's element type: raw `Qnn_DataType_t` and encoding.
#[derive(Debug, Clone)]
struct Elem {
    dtype: u32,
    quant: Quantization,
}

impl Elem {
    /// A plain (unquantized) element type: float, or integer ids and parameters.
    fn plain(dtype: u32) -> Elem {
        Elem {
            dtype,
            quant: Quantization::None,
        }
    }

    fn fixed(enc: Fixed) -> Elem {
        Elem {
            dtype: enc.dtype,
            quant: enc.quantization(),
        }
    }
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl Emitter {
    /// Emits into `g`.
    pub fn new(g: GraphBuilder) -> Emitter {
        Emitter { g, next: 0 }
    }

    /// The graph, to finalize.
    pub fn into_graph(self) -> GraphBuilder {
        self.g
    }

    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{what}_{}", self.next)
    }

    fn create(
        &mut self,
        name: String,
        kind: TensorKind,
        elem: Elem,
        shape: &[u32],
        data: Option<&[u8]>,
    ) -> Result<Val, QnnError> {
        self.g.tensor(NewTensor {
            name: name.clone(),
            kind,
            dtype: elem.dtype,
            shape: shape.to_vec(),
            quant: elem.quant,
            data,
        })?;
        Ok(Val {
            name,
            shape: shape.to_vec(),
        })
    }

    /// A graph input.
    pub fn input(&mut self, name: &str, dtype: u32, shape: &[u32]) -> Result<Val, QnnError> {
        self.create(
            name.into(),
            TensorKind::Input,
            Elem::plain(dtype),
            shape,
            None,
        )
    }

    /// A fixed-point graph input of `enc`, dequantized (`Dequantize`) into a float value.
    pub fn input_dequantized(
        &mut self,
        name: &str,
        enc: Fixed,
        shape: &[u32],
    ) -> Result<Val, QnnError> {
        let v = self.create(
            name.into(),
            TensorKind::Input,
            Elem::fixed(enc),
            shape,
            None,
        )?;
        self.dequantize(&v)
    }

    /// `a` quantized to `enc` (`Quantize`): a graph output named `out`, or a native tensor.
    pub fn quantize(&mut self, a: &Val, enc: Fixed, out: Option<&str>) -> Result<Val, QnnError> {
        let shape = a.shape.clone();
        self.op_to("Quantize", &[], &[a], (&shape, Elem::fixed(enc)), out)
    }

    /// A fixed-point value read back as float (`Dequantize`).
    pub fn dequantize(&mut self, a: &Val) -> Result<Val, QnnError> {
        self.op("Dequantize", &[], &[a], &a.shape.clone(), None)
    }

    /// A static f32 tensor.
    pub fn constant(&mut self, what: &str, shape: &[u32], v: &[f32]) -> Result<Val, QnnError> {
        let name = self.fresh(what);
        let elem = Elem::plain(b::QNN_DATATYPE_FLOAT_32);
        self.create(name, TensorKind::Static, elem, shape, Some(f32_bytes(v)))
    }

    /// A static parameter tensor of `dtype` holding `v`.
    fn param<T: bytemuck::Pod>(
        &mut self,
        dtype: u32,
        shape: &[u32],
        v: &[T],
    ) -> Result<String, QnnError> {
        let name = self.fresh("param");
        let bytes: &[u8] = bytemuck::cast_slice(v);
        let elem = Elem::plain(dtype);
        self.create(name.clone(), TensorKind::Static, elem, shape, Some(bytes))?;
        Ok(name)
    }

    fn u32_param(&mut self, shape: &[u32], v: &[u32]) -> Result<String, QnnError> {
        self.param(b::QNN_DATATYPE_UINT_32, shape, v)
    }

    fn i32_param(&mut self, shape: &[u32], v: &[i32]) -> Result<String, QnnError> {
        self.param(b::QNN_DATATYPE_INT_32, shape, v)
    }

    /// Adds `op` with `inputs` and one f32 output of `shape`, named `out` (a graph output) or
    /// fresh (a native tensor).
    fn op(
        &mut self,
        op: &str,
        params: &[Param<'_>],
        inputs: &[&Val],
        shape: &[u32],
        out: Option<&str>,
    ) -> Result<Val, QnnError> {
        let f32 = Elem::plain(b::QNN_DATATYPE_FLOAT_32);
        self.op_to(op, params, inputs, (shape, f32), out)
    }

    /// [`Self::op`] with an output of any shape and element type.
    fn op_to(
        &mut self,
        op: &str,
        params: &[Param<'_>],
        inputs: &[&Val],
        (shape, elem): (&[u32], Elem),
        out: Option<&str>,
    ) -> Result<Val, QnnError> {
        let (name, kind) = match out {
            Some(n) => (n.to_string(), TensorKind::Output),
            None => (self.fresh(op), TensorKind::Native),
        };
        let v = self.create(name, kind, elem, shape, None)?;
        let node = format!("{}_op", v.name);
        let ins: Vec<&str> = inputs.iter().map(|v| v.name.as_str()).collect();
        self.g.node(&node, op, params, &ins, &[&v.name])?;
        Ok(v)
    }

    /// Numpy-style broadcast shape of two operands (dimensions aligned from the right).
    fn broadcast(a: &[u32], b: &[u32]) -> Vec<u32> {
        let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
        let pad = long.len() - short.len();
        let dim = |i: usize| if i < pad { 1 } else { short[i - pad] };
        long.iter()
            .enumerate()
            .map(|(i, &x)| x.max(dim(i)))
            .collect()
    }

    /// `a + b` (broadcasting).
    pub fn add(&mut self, a: &Val, b: &Val) -> Result<Val, QnnError> {
        let s = Self::broadcast(&a.shape, &b.shape);
        self.op("ElementWiseAdd", &[], &[a, b], &s, None)
    }

    /// `a - b` (broadcasting).
    pub fn sub(&mut self, a: &Val, b: &Val) -> Result<Val, QnnError> {
        let s = Self::broadcast(&a.shape, &b.shape);
        self.op("ElementWiseSubtract", &[], &[a, b], &s, None)
    }

    /// `a * b` (broadcasting).
    pub fn mul(&mut self, a: &Val, b: &Val) -> Result<Val, QnnError> {
        let s = Self::broadcast(&a.shape, &b.shape);
        self.op("ElementWiseMultiply", &[], &[a, b], &s, None)
    }

    /// Logistic sigmoid.
    pub fn sigmoid(&mut self, a: &Val) -> Result<Val, QnnError> {
        self.op("Sigmoid", &[], &[a], &a.shape.clone(), None)
    }

    /// RMSNorm over the last axis with weights `gamma` (`[channels]`): QNN's `RmsNorm`, which
    /// keeps the sum of squares out of fp16's range limit (a composed `mean(x * x)` overflows
    /// at |x| > 256 in fp16, as SmolLM2's residual stream does).
    pub fn rmsnorm(&mut self, x: &Val, gamma: &Val, eps: f32) -> Result<Val, QnnError> {
        let last = x.shape.len() as u32 - 1;
        let axes = self.u32_param(&[1], &[last])?;
        let params = [
            Param::Scalar("epsilon", Scalar::F32(eps)),
            Param::Tensor("axes", axes),
        ];
        self.op("RmsNorm", &params, &[x, gamma], &x.shape.clone(), None)
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, a: &Val) -> Result<Val, QnnError> {
        let axis = a.shape.len() as u32 - 1;
        let params = [Param::Scalar("axis", Scalar::U32(axis))];
        self.op("Softmax", &params, &[a], &a.shape.clone(), None)
    }

    /// `x W^T` for `x [n, in]` and a weight `w [out, in]` (FullyConnected), no bias.
    pub fn fully_connected(&mut self, x: &Val, w: &Val) -> Result<Val, QnnError> {
        let s = [x.shape[0], w.shape[0]];
        self.op("FullyConnected", &[], &[x, w], &s, None)
    }

    /// The W8A16 product `x W^T` (see [`crate::w8a16`]): `x [n, in]` quantized to `w.input`,
    /// `FullyConnected` with `w`'s i8 values as a static tensor (one scale per output channel,
    /// axis 0; with `w.blocks`, QNN's blockwise expansion, which the HTP reads as 4-bit values
    /// in [-8, 7]), output in `w.output`, read back as float `[n, out]`.
    ///
    /// A blockwise-expansion matrix with more rows than columns goes as several products of at
    /// most `cols` rows each, concatenated ([`W8Matrix::row_parts`]).
    pub fn fully_connected_w8(&mut self, x: &Val, w: &W8Matrix) -> Result<Val, QnnError> {
        let xq = self.quantize(x, w.input, None)?;
        let Some(parts) = w.row_parts() else {
            return self.fully_connected_w8_part(&xq, w);
        };
        let ys = parts
            .iter()
            .map(|p| self.fully_connected_w8_part(&xq, p))
            .collect::<Result<Vec<_>, _>>()?;
        self.concat(&ys.iter().collect::<Vec<_>>(), 1)
    }

    /// One `FullyConnected` of the quantized input `xq` with `w`, read back as float.
    fn fully_connected_w8_part(&mut self, xq: &Val, w: &W8Matrix) -> Result<Val, QnnError> {
        let scale_offsets = w.scales.iter().map(|&s| (s, 0)).collect();
        let quant = match &w.blocks {
            None => Quantization::PerAxis {
                axis: 0,
                scale_offsets,
            },
            Some(b) => Quantization::BlockwiseExpansion {
                axis: 0,
                scale_offsets,
                blocks_per_axis: (w.cols / b.size) as u32,
                multiplier_bits: b.bits,
                multipliers: b.m.clone(),
            },
        };
        let name = self.fresh("w8");
        let elem = Elem {
            dtype: b::QNN_DATATYPE_SFIXED_POINT_8,
            quant,
        };
        let shape = [w.rows as u32, w.cols as u32];
        let bytes: &[u8] = bytemuck::cast_slice(&w.q);
        let wv = self.create(name, TensorKind::Static, elem, &shape, Some(bytes))?;
        let s = [xq.shape[0], shape[0]];
        let y = self.op_to(
            "FullyConnected",
            &[],
            &[xq, &wv],
            (&s, Elem::fixed(w.output)),
            None,
        )?;
        self.dequantize(&y)
    }

    /// `a b` (or `a b^T`) for 2-D operands.
    pub fn matmul(&mut self, a: &Val, b: &Val, transpose_b: bool) -> Result<Val, QnnError> {
        let cols = if transpose_b { b.shape[0] } else { b.shape[1] };
        let s = [a.shape[0], cols];
        let params = [
            Param::Scalar("transpose_in0", Scalar::Bool(false)),
            Param::Scalar("transpose_in1", Scalar::Bool(transpose_b)),
        ];
        self.op("MatMul", &params, &[a, b], &s, None)
    }

    /// The same data with another shape; `out` makes it a graph output.
    pub fn reshape(&mut self, a: &Val, shape: &[u32], out: Option<&str>) -> Result<Val, QnnError> {
        self.op("Reshape", &[], &[a], shape, out)
    }

    /// Rows of `table [rows, width]` at the indices `ids [1, n]` (i32), as `[1, n, width]`.
    pub fn gather_rows(&mut self, table: &Val, ids: &Val) -> Result<Val, QnnError> {
        let s = [1, ids.shape[1], table.shape[1]];
        let params = [Param::Scalar("axis", Scalar::I32(0))];
        self.op("Gather", &params, &[table, ids], &s, None)
    }

    /// `a[..., begin..end, ...]` along `axis`.
    pub fn slice(&mut self, a: &Val, axis: usize, begin: u32, end: u32) -> Result<Val, QnnError> {
        self.slice_every(a, axis, begin..end, 1)
    }

    /// Every `step`-th element of `a[..., range, ...]` along `axis` (`step` > 0).
    pub fn slice_every(
        &mut self,
        a: &Val,
        axis: usize,
        range: std::ops::Range<u32>,
        step: u32,
    ) -> Result<Val, QnnError> {
        let mut ranges = Vec::with_capacity(a.shape.len() * 3);
        for (i, &d) in a.shape.iter().enumerate() {
            let (lo, hi, st) = if i == axis {
                (range.start, range.end, step)
            } else {
                (0, d, 1)
            };
            ranges.extend([lo as i32, hi as i32, st as i32]);
        }
        let r = self.i32_param(&[a.shape.len() as u32, 3], &ranges)?;
        let mut s = a.shape.clone();
        s[axis] = range.len().div_ceil(step as usize) as u32;
        self.op(
            "StridedSlice",
            &[Param::Tensor("ranges", r)],
            &[a],
            &s,
            None,
        )
    }

    /// Axes permuted: output axis `i` is input axis `perm[i]`.
    pub fn transpose(&mut self, a: &Val, perm: &[u32]) -> Result<Val, QnnError> {
        let p = self.u32_param(&[perm.len() as u32], perm)?;
        let s: Vec<u32> = perm.iter().map(|&i| a.shape[i as usize]).collect();
        self.op("Transpose", &[Param::Tensor("perm", p)], &[a], &s, None)
    }

    /// Concatenation along `axis`.
    pub fn concat(&mut self, parts: &[&Val], axis: usize) -> Result<Val, QnnError> {
        let mut s = parts[0].shape.clone();
        s[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let params = [Param::Scalar("axis", Scalar::U32(axis as u32))];
        self.op("Concat", &params, parts, &s, None)
    }
}
