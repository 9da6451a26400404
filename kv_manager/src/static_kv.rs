//! Static cross-attention K/V: buffers filled once per request and read by every step.
//!
//! An encoder-decoder's decoder attends, in every layer, over the encoder output projected to keys
//! and values. Those rows never grow: they are computed once per request (by the encoder graph) and
//! read by every decoder step. A [`CrossSpec`] declares them on a [`CacheSpec`]:
//!
//! - one buffer per (layer, KV head, K|V), E rows ([`CrossSpec::rows`], the static encoder length)
//!   of D elements, with **their own encodings** (any data type; one type for all of them);
//! - grouped into graph tensors like the self-attention ones ([`Granularity`]): per head
//!   `cross_{key|value}_{l}_{h} [1, 1, E, D]`, per layer `cross_{key|value}_{l} [H, 1, E, D]` (the
//!   names and positions of [`KvTensor`] with [`KvIo::Cross`]); K is always in `rows` layout;
//! - placed in the **same region**, after the self-attention rows (aligned to [`CROSS_ALIGN`]
//!   bytes), counted in [`CacheSpec::region_bytes`];
//! - bound read-only in every step's [`Plan::cross`](crate::Plan::cross) at offsets fixed for the
//!   cache's life: no strategy, commit, rollback, eviction, snapshot import or reset moves or writes
//!   them;
//! - filled once per request with [`KvCache::fill_cross`] (every tensor, in any order, bytes
//!   already in the buffer's encoding: a fill of the wrong size or encoding is refused, never
//!   requantized; a second fill of one tensor needs [`KvCache::clear_cross`] first) and emptied by
//!   [`KvCache::clear_cross`] (a new request). [`KvCache::plan`] refuses to plan a step while any
//!   cross tensor is unfilled ([`KvError::CrossNotFilled`]). [`KvCache::reset`] empties the
//!   self-attention rows only.

use crate::plan::TensorBinding;
use crate::size::MAX_CONTEXT;
use crate::{CacheSpec, Geometry, Granularity, KvCache, KvError, KvIo, KvTensor, Size, TensorKind};
use quant::{DataType, Encoding, QuantSpec};

/// Alignment, in bytes, of the start of the cross-attention buffers in the region.
pub const CROSS_ALIGN: usize = 64;

/// The static cross-attention buffers of a cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossSpec {
    /// E: rows (encoder positions) per buffer.
    pub rows: usize,
    /// How buffers are grouped into graph tensors.
    pub granularity: Granularity,
    /// One encoding per buffer, indexed by [`Geometry::buffer_index`]; all of one data type.
    pub encodings: Vec<QuantSpec>,
}

impl CrossSpec {
    /// A spec whose buffers all share `encoding`.
    pub fn uniform(
        geometry: &Geometry,
        rows: usize,
        granularity: Granularity,
        encoding: QuantSpec,
    ) -> CrossSpec {
        let buffers = if geometry.validate().is_ok() {
            geometry.buffers()
        } else {
            0
        };
        CrossSpec {
            rows,
            granularity,
            encodings: vec![encoding; buffers],
        }
    }

    /// The element type of every cross buffer (`None` without encodings).
    pub fn dtype(&self) -> Option<DataType> {
        self.encodings.first().map(|e| e.dtype)
    }

    /// Checks the spec against the self-attention geometry `g` (which must be valid).
    pub fn validate(&self, g: &Geometry) -> Result<(), KvError> {
        let bad = |reason: String| Err(KvError::InvalidCross { reason });
        if self.rows == 0 || self.rows > MAX_CONTEXT {
            return bad(format!(
                "rows (encoder length) must be in 1..={MAX_CONTEXT}, got {}",
                self.rows
            ));
        }
        if self.encodings.len() != g.buffers() {
            return bad(format!(
                "expected one encoding per (layer, kv-head, K|V) buffer: {}, got {}",
                g.buffers(),
                self.encodings.len()
            ));
        }
        let dtype = self.encodings[0].dtype;
        if let Some(b) = self.encodings.iter().position(|e| e.dtype != dtype) {
            return bad(format!(
                "buffer {b} has data type {}, buffer 0 {dtype}: every cross buffer has one data type",
                self.encodings[b].dtype
            ));
        }
        Ok(())
    }

    /// Heads in one graph tensor: 1 per head, kv_heads per layer.
    fn heads_per_tensor(&self, g: &Geometry) -> usize {
        match self.granularity {
            Granularity::PerHead => 1,
            Granularity::PerLayer => g.kv_heads,
        }
    }

    /// The cross tensors in graph order (their [`KvTensor::position`]s are 0, 1, ...).
    pub fn tensors(&self, g: &Geometry) -> Vec<KvTensor> {
        let heads: Vec<Option<usize>> = match self.granularity {
            Granularity::PerHead => (0..g.kv_heads).map(Some).collect(),
            Granularity::PerLayer => vec![None],
        };
        let mut out = Vec::new();
        for layer in 0..g.layers {
            for &head in &heads {
                for kind in [TensorKind::Key, TensorKind::Value] {
                    out.push(KvTensor {
                        io: KvIo::Cross,
                        kind,
                        layer,
                        head,
                    });
                }
            }
        }
        out
    }

    /// Bytes of one cross tensor: heads x E x D x element size.
    pub fn tensor_bytes(&self, g: &Geometry) -> Result<usize, KvError> {
        let e = self.dtype().map_or(0, |d| d.size_bytes());
        Size::new("cross tensor bytes", self.heads_per_tensor(g))
            .times(self.rows)
            .times(g.head_dim)
            .times(e)
            .get()
    }

    /// Bytes of every cross buffer together (the static K/V of one request).
    pub fn region_bytes(&self, g: &Geometry) -> Result<usize, KvError> {
        let tensors = g.buffers() / self.heads_per_tensor(g);
        Size::new("cross bytes", self.tensor_bytes(g)?)
            .times(tensors)
            .get()
    }

    /// The encoding a graph declares for cross tensor `t` (its position): the buffer's own per
    /// head; per layer, the heads' common encoding, or per-axis (axis 0) when they differ.
    pub fn tensor_encoding(&self, g: &Geometry, t: &KvTensor) -> QuantSpec {
        let first = g.buffer_index(t.layer, t.head.unwrap_or(0), t.kind);
        if t.head.is_some() {
            return self.encodings[first].clone();
        }
        let heads: Vec<&QuantSpec> = (0..g.kv_heads)
            .map(|h| &self.encodings[g.buffer_index(t.layer, h, t.kind)])
            .collect();
        let params: Option<Vec<_>> = heads
            .iter()
            .map(|q| match q.encoding {
                Encoding::PerTensor(so) => Some(so),
                _ => None,
            })
            .collect();
        match params {
            Some(params) if heads.iter().any(|q| *q != heads[0]) => QuantSpec {
                dtype: heads[0].dtype,
                encoding: Encoding::PerAxis { axis: 0, params },
            },
            _ => heads[0].clone(),
        }
    }
}

/// Where the region ends: after the self-attention bytes, plus the cross buffers if any.
pub(crate) fn region_end(spec: &CacheSpec, self_bytes: usize) -> Result<usize, KvError> {
    match &spec.cross {
        None => Ok(self_bytes),
        Some(cross) => {
            cross.validate(&spec.geometry)?;
            Size::new("region bytes", cross_base(self_bytes)?)
                .plus(cross.region_bytes(&spec.geometry)?)
                .get()
        }
    }
}

fn cross_base(self_bytes: usize) -> Result<usize, KvError> {
    Ok(Size::new("region bytes", self_bytes)
        .plus(CROSS_ALIGN - 1)
        .get()?
        / CROSS_ALIGN
        * CROSS_ALIGN)
}

/// The read-only bindings of every cross tensor, in graph order (none without cross buffers).
pub(crate) fn bindings(spec: &CacheSpec, self_bytes: usize) -> Result<Vec<TensorBinding>, KvError> {
    let Some(cross) = &spec.cross else {
        return Ok(Vec::new());
    };
    let g = &spec.geometry;
    let base = cross_base(self_bytes)?;
    let bytes = cross.tensor_bytes(g)?;
    let heads = cross.heads_per_tensor(g);
    Ok(cross
        .tensors(g)
        .iter()
        .enumerate()
        .map(|(i, t)| TensorBinding {
            layer: t.layer,
            head: t.head,
            kind: t.kind,
            shape: [heads, 1, cross.rows, g.head_dim],
            transposed: false,
            offset: base + i * bytes,
            bytes,
        })
        .collect())
}

impl KvCache {
    /// The cross tensors' bindings, in graph order (empty without cross buffers); the same in every
    /// step's [`Plan::cross`](crate::Plan::cross).
    pub fn cross_bindings(&self) -> &[TensorBinding] {
        &self.plan_ref().cross
    }

    /// True when the cache has cross buffers and every one is filled for the current request.
    pub fn cross_filled(&self) -> bool {
        !self.cross_filled.is_empty() && self.cross_filled.iter().all(|&f| f)
    }

    /// Fills cross tensor `tensor` (`io` [`KvIo::Cross`], the spec's granularity) with `data`,
    /// which must be encoded exactly as [`CrossSpec::tensor_encoding`] says and hold
    /// [`CrossSpec::tensor_bytes`] bytes (`[heads, 1, E, D]` row-major). Bytes are copied, never
    /// requantized. Each tensor is filled once per request: clear with [`KvCache::clear_cross`].
    pub fn fill_cross(
        &mut self,
        tensor: &KvTensor,
        encoding: &QuantSpec,
        data: &[u8],
    ) -> Result<(), KvError> {
        let name = tensor.name();
        let fail = |reason: String| KvError::CrossTensor {
            tensor: name.clone(),
            reason,
        };
        let Some(cross) = &self.spec().cross else {
            return Err(fail("the cache has no cross-attention buffers".into()));
        };
        let g = &self.spec().geometry;
        let index = self
            .cross_bindings()
            .iter()
            .position(|b| {
                tensor.io == KvIo::Cross
                    && (b.layer, b.head, b.kind) == (tensor.layer, tensor.head, tensor.kind)
            })
            .ok_or_else(|| {
                fail(format!(
                    "not one of this cache's {} cross tensors ({} layers, {} KV heads, {:?})",
                    self.cross_bindings().len(),
                    g.layers,
                    g.kv_heads,
                    cross.granularity
                ))
            })?;
        let expected = cross.tensor_encoding(g, tensor);
        if *encoding != expected {
            return Err(KvError::CrossEncoding {
                tensor: name,
                expected: format!("{expected:?}"),
                found: format!("{encoding:?}"),
            });
        }
        let binding = self.cross_bindings()[index];
        if data.len() != binding.bytes {
            return Err(KvError::CrossSize {
                tensor: name,
                expected: binding.bytes,
                found: data.len(),
            });
        }
        if self.cross_filled[index] {
            return Err(fail(
                "already filled for this request (clear_cross starts a new one)".into(),
            ));
        }
        self.region_mut()[binding.offset..binding.offset + binding.bytes].copy_from_slice(data);
        self.cross_filled[index] = true;
        Ok(())
    }

    /// Empties every cross tensor (zeroes its bytes) for a new request.
    pub fn clear_cross(&mut self) {
        let spans: Vec<(usize, usize)> = self
            .cross_bindings()
            .iter()
            .map(|b| (b.offset, b.bytes))
            .collect();
        for (offset, bytes) in spans {
            self.region_mut()[offset..offset + bytes].fill(0);
        }
        self.cross_filled.fill(false);
    }

    /// The bytes of cross tensor `index` (graph order), as filled.
    pub fn cross_bytes(&self, index: usize) -> Option<&[u8]> {
        let b = self.cross_bindings().get(index)?;
        Some(&self.region().as_slice()[b.offset..b.offset + b.bytes])
    }

    /// Refuses a step while a declared cross tensor is unfilled.
    pub(crate) fn check_cross_ready(&self) -> Result<(), KvError> {
        let missing: Vec<String> = self
            .cross_bindings()
            .iter()
            .zip(&self.cross_filled)
            .filter(|(_, f)| !**f)
            .map(|(b, _)| {
                KvTensor {
                    io: KvIo::Cross,
                    kind: b.kind,
                    layer: b.layer,
                    head: b.head,
                }
                .name()
            })
            .collect();
        match missing.first() {
            None => Ok(()),
            Some(first) => Err(KvError::CrossNotFilled {
                missing: missing.len(),
                first: first.clone(),
            }),
        }
    }
}
