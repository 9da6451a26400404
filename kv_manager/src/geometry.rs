//! What a cache holds (geometry), how it is updated (strategy), and the exact region it needs.

use crate::size::{MAX_AR_VARIANTS, MAX_BUFFERS, MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS};
use crate::{KvError, Size, Strategy};
use quant::{DataType, QuantSpec};

// The K/V graph tensors' names, positions and mask names are the IO vocabulary's (`graph_io`):
// one rule for every backend, the session and the KV manager.
pub use graph_io::{Granularity, KLayout, KvIo, KvTensor, TensorKind, mask_name, parse_mask_name};

/// The shape of a model's KV cache and of its static graphs.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Context length S: the mask of every graph is `[n, S]`.
    pub context: usize,
    /// The AR variants n (tokens per step) of the graphs that share this cache, e.g. `[1, 32]`.
    pub ar_variants: Vec<usize>,
    /// Element type of every K/V buffer.
    pub dtype: DataType,
    pub k_layout: KLayout,
    pub granularity: Granularity,
    /// Per-layer attention windows: empty when every layer is global, else one entry per layer,
    /// `None` for a global layer and `Some(W)` for a sliding-window layer, whose new token at
    /// position p sees positions `p - W + 1 ..= p` only. Such a layer's past tensors hold
    /// `W - 1` rows in every AR variant ([`Geometry::past_rows`]) and its mask is
    /// [`mask_name`]`(Some(W))`. `max(ar) <= W <= S - max(ar) + 1`.
    pub windows: Vec<Option<usize>>,
}

impl Geometry {
    /// A per-head, rows-layout geometry (the seed layout).
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        context: usize,
        ar_variants: &[usize],
        dtype: DataType,
    ) -> Geometry {
        Geometry {
            layers,
            kv_heads,
            head_dim,
            context,
            ar_variants: ar_variants.to_vec(),
            dtype,
            k_layout: KLayout::Rows,
            granularity: Granularity::PerHead,
            windows: Vec::new(),
        }
    }

    /// The same geometry with window `window` on `layers` (others unchanged, global by default).
    pub fn with_windows(mut self, layers: &[usize], window: usize) -> Geometry {
        self.windows.resize(self.layers, None);
        for &l in layers {
            if let Some(w) = self.windows.get_mut(l) {
                *w = Some(window);
            }
        }
        self
    }

    /// The attention window of `layer`: `None` when global.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    /// True when some layer has a sliding window.
    pub fn has_windows(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// The distinct sliding windows, ascending (one mask input each besides the global one).
    pub fn distinct_windows(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.windows.iter().flatten().copied().collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// Rows of `layer`'s past tensors in the AR-`ar` graph: S - n for a global layer, W - 1 for
    /// a sliding layer of window W (its new token i sees the last W - 1 - i past rows and new
    /// tokens 0..=i, so every token sees exactly the last W positions).
    pub fn past_rows(&self, layer: usize, ar: usize) -> usize {
        self.layer_window(layer).map_or(self.window(ar), |w| w - 1)
    }

    /// Tokens whose rows a sliding layer keeps: the last `K = min(W - 1 + max(ar), capacity)`
    /// (its window's W - 1 rows plus one largest step, so that a rollback of up to max(ar) tokens
    /// still finds the rows its window needs); `None` for a global layer, which keeps every token.
    pub fn kept_rows(&self, layer: usize) -> Option<usize> {
        self.layer_window(layer)
            .map(|w| (w - 1 + self.max_ar()).min(self.capacity()))
    }

    /// Checks every field against its range and the limits ([`crate::MAX_LAYERS`] and its neighbours, so that every size
    /// derived from a valid geometry is bounded); the error names the field.
    pub fn validate(&self) -> Result<(), KvError> {
        let bad = |field: &'static str, reason: String| KvError::InvalidGeometry { field, reason };
        for (field, value, min, max) in [
            ("layers", self.layers, 1, MAX_LAYERS),
            ("kv_heads", self.kv_heads, 1, MAX_HEADS),
            ("head_dim", self.head_dim, 1, MAX_HEAD_DIM),
            ("context", self.context, 2, MAX_CONTEXT),
        ] {
            if value < min {
                return Err(bad(field, format!("must be at least {min}, got {value}")));
            }
            if value > max {
                return Err(bad(field, format!("is {value}, above the limit of {max}")));
            }
        }
        // Both factors are at most 2^12: no overflow.
        if self.buffers() > MAX_BUFFERS {
            return Err(bad(
                "kv_heads",
                format!(
                    "gives 2 x layers x kv_heads = {} K/V buffers, above the limit of {MAX_BUFFERS}",
                    self.buffers()
                ),
            ));
        }
        if self.ar_variants.is_empty() {
            return Err(bad("ar", "needs at least one AR variant".into()));
        }
        if self.ar_variants.len() > MAX_AR_VARIANTS {
            return Err(bad(
                "ar",
                format!(
                    "lists {} AR variants, above the limit of {MAX_AR_VARIANTS}",
                    self.ar_variants.len()
                ),
            ));
        }
        let mut seen = Vec::new();
        for &n in &self.ar_variants {
            if n == 0 || n >= self.context {
                return Err(bad(
                    "ar",
                    format!(
                        "AR-{n} must be between 1 and context - 1 = {}",
                        self.context - 1
                    ),
                ));
            }
            if seen.contains(&n) {
                return Err(bad("ar", format!("AR-{n} is listed twice")));
            }
            seen.push(n);
        }
        let (min_ar, max_ar) = (self.min_ar(), self.max_ar());
        if min_ar + max_ar > self.context {
            return Err(bad(
                "ar",
                format!(
                    "AR-{max_ar} never fits: with AR-{min_ar} as the smallest variant the cache holds \
                     context - {min_ar} = {} tokens, so context must be at least {}",
                    self.context - min_ar,
                    min_ar + max_ar
                ),
            ));
        }
        self.validate_windows()
    }

    /// Windows: one per layer (or none), each with `max(ar) <= W` (an AR-n step's new tokens see
    /// each other) and `W - 1 <= S - max(ar)` (the past rows fit every variant's global window).
    fn validate_windows(&self) -> Result<(), KvError> {
        let bad = |reason: String| KvError::InvalidGeometry {
            field: "windows",
            reason,
        };
        if !self.windows.is_empty() && self.windows.len() != self.layers {
            return Err(bad(format!(
                "lists {} windows for {} layers (one per layer, or none)",
                self.windows.len(),
                self.layers
            )));
        }
        let (max_ar, s) = (self.max_ar(), self.context);
        for (layer, w) in self.windows.iter().enumerate() {
            if let Some(w) = *w
                && (w < max_ar || w > s - max_ar + 1)
            {
                return Err(bad(format!(
                    "layer {layer}: window {w} must be between the largest AR variant {max_ar} and \
                     context - {max_ar} + 1 = {} (a longer window is the global layer)",
                    s - max_ar + 1
                )));
            }
        }
        Ok(())
    }

    /// Number of K/V buffers B = layers x kv_heads x 2.
    pub fn buffers(&self) -> usize {
        self.layers * self.kv_heads * 2
    }

    /// Index of the buffer of (layer, head, kind): `(layer * kv_heads + head) * 2 + (K=0 | V=1)`,
    /// the position of its per-head tensor ([`KvTensor::position`]).
    pub fn buffer_index(&self, layer: usize, head: usize, kind: TensorKind) -> usize {
        graph_io::buffer_index(layer, head, kind, self.kv_heads)
    }

    /// The graph tensor holding buffer `buffer` at `granularity` (per layer: the layer's tensor,
    /// in which the buffer is the head-th slice).
    pub fn buffer_tensor(&self, buffer: usize, io: KvIo) -> KvTensor {
        let (layer, head, kind) = self.buffer_coords(buffer);
        KvTensor {
            io,
            kind,
            layer,
            head: (self.granularity == Granularity::PerHead).then_some(head),
        }
    }

    /// (layer, head, kind) of a buffer index.
    pub fn buffer_coords(&self, buffer: usize) -> (usize, usize, TensorKind) {
        graph_io::buffer_coords(buffer, self.kv_heads)
    }

    /// Bytes of one token's row in one buffer: head_dim x element size.
    pub fn row_bytes(&self) -> usize {
        self.head_dim * self.dtype.size_bytes()
    }

    /// Bytes of K and V for one token over the whole model.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.buffers() * self.row_bytes()
    }

    /// Smallest AR variant.
    pub fn min_ar(&self) -> usize {
        self.ar_variants.iter().copied().min().unwrap_or(1)
    }

    /// Largest AR variant.
    pub fn max_ar(&self) -> usize {
        self.ar_variants.iter().copied().max().unwrap_or(1)
    }

    /// The past window W = S - n of the AR-n graph.
    pub fn window(&self, ar: usize) -> usize {
        self.context - ar
    }

    /// The largest past window, S - min(ar).
    pub fn max_window(&self) -> usize {
        self.context - self.min_ar()
    }

    /// How many tokens the cache holds at most: S - min(ar), the largest past window (S - 1 with an
    /// AR-1 graph). An AR-n step needs `len + n <= capacity`. With AR-1 a context of S tokens is S - 1
    /// processed tokens plus the last one, sampled from the final step's logits and never fed back.
    pub fn capacity(&self) -> usize {
        self.context - self.min_ar()
    }
}

/// Everything needed to build a cache: geometry, strategy and one encoding per buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSpec {
    pub geometry: Geometry,
    pub strategy: Strategy,
    /// One encoding per buffer, indexed by [`Geometry::buffer_index`]; shared by the past input and the
    /// new output of that buffer in every graph variant.
    pub encodings: Vec<QuantSpec>,
    /// Static cross-attention K/V buffers, if the model has them (an encoder-decoder's decoder).
    pub cross: Option<crate::CrossSpec>,
}

impl CacheSpec {
    /// A spec whose buffers all share one encoding (float types: [`QuantSpec::float`]).
    /// An invalid geometry gets no encodings (its buffer count may be absurd); every use of the spec
    /// refuses it with the geometry's own error.
    pub fn uniform(geometry: Geometry, strategy: Strategy, encoding: QuantSpec) -> CacheSpec {
        let buffers = if geometry.validate().is_ok() {
            geometry.buffers()
        } else {
            0
        };
        let encodings = vec![encoding; buffers];
        CacheSpec {
            geometry,
            strategy,
            encodings,
            cross: None,
        }
    }

    /// A float (f16/f32) or uniformly-encoded spec built from the geometry's data type: fixed-point
    /// types get scale 1, offset 0 (for simulations that only move bytes, like the budget tool).
    pub fn for_simulation(geometry: Geometry, strategy: Strategy) -> CacheSpec {
        let encoding = if geometry.dtype.is_fixed_point() {
            QuantSpec {
                dtype: geometry.dtype,
                encoding: quant::Encoding::PerTensor(quant::ScaleOffset {
                    scale: 1.0,
                    offset: 0,
                }),
            }
        } else {
            QuantSpec {
                dtype: geometry.dtype,
                encoding: quant::Encoding::Float,
            }
        };
        CacheSpec::uniform(geometry, strategy, encoding)
    }

    /// Validates the geometry and the encodings (one per buffer, of the cache's data type).
    pub(crate) fn validate_encodings(&self) -> Result<(), KvError> {
        let g = &self.geometry;
        g.validate()?;
        if self.encodings.len() != g.buffers() {
            return Err(KvError::EncodingCount {
                expected: g.buffers(),
                found: self.encodings.len(),
            });
        }
        for (b, enc) in self.encodings.iter().enumerate() {
            if enc.dtype != g.dtype {
                let (layer, head, kind) = g.buffer_coords(b);
                return Err(KvError::EncodingDataType {
                    layer,
                    head,
                    kind,
                    expected: g.dtype,
                    found: enc.dtype,
                });
            }
        }
        Ok(())
    }

    /// The exact number of bytes the cache allocates for its region, computed without allocating.
    /// Includes the static cross-attention buffers ([`crate::CrossSpec::region_bytes`]).
    pub fn region_bytes(&self) -> Result<usize, KvError> {
        let layout = self.layout()?;
        let self_bytes = Size::new("region bytes", layout.region_rows)
            .times(self.geometry.row_bytes())
            .get()?;
        crate::static_kv::region_end(self, self_bytes)
    }

    /// `shift`'s reservation R in rows per buffer (None for other strategies or a refused reservation).
    pub fn reserve_rows(&self) -> Option<usize> {
        match self.strategy {
            Strategy::Shift { reserve, .. } => reserve.rows(&self.geometry).ok(),
            _ => None,
        }
    }
}

/// Builds the per-buffer encodings from a compiled model's graph descriptions: for every AR variant,
/// the encodings of its past inputs and new outputs, indexed by [`Geometry::buffer_index`]. Fails when
/// past and new of a buffer differ in any variant, or when two variants disagree: the manager copies
/// bytes and never requantizes.
pub fn encodings_from_graphs(
    geometry: &Geometry,
    variants: &[(usize, Vec<QuantSpec>, Vec<QuantSpec>)],
) -> Result<Vec<QuantSpec>, KvError> {
    let b = geometry.buffers();
    let mut out: Option<Vec<QuantSpec>> = None;
    for (ar, past, new) in variants {
        for list in [past, new] {
            if list.len() != b {
                return Err(KvError::EncodingCount {
                    expected: b,
                    found: list.len(),
                });
            }
        }
        for i in 0..b {
            let reference = out.as_ref().map_or(&past[i], |o| &o[i]);
            for candidate in [&past[i], &new[i]] {
                if candidate != reference {
                    let (layer, head, kind) = geometry.buffer_coords(i);
                    return Err(KvError::EncodingMismatch {
                        ar: *ar,
                        layer,
                        head,
                        kind,
                        past: format!("{reference:?}"),
                        new: format!("{candidate:?}"),
                    });
                }
            }
        }
        if out.is_none() {
            out = Some(past.clone());
        }
    }
    out.ok_or(KvError::InvalidGeometry {
        field: "ar",
        reason: "no graph variants given".into(),
    })
}

/// The K/V graph tensors of one side of a step, in position order: (layer, head) K then V per
/// head, or layer K then V per layer.
pub(crate) fn tensor_ids(
    layers: usize,
    kv_heads: usize,
    granularity: Granularity,
) -> Vec<crate::plan::TensorId> {
    let mut ids = Vec::new();
    for layer in 0..layers {
        match granularity {
            Granularity::PerHead => {
                for head in 0..kv_heads {
                    for kind in [TensorKind::Key, TensorKind::Value] {
                        ids.push(crate::plan::TensorId {
                            layer,
                            head: Some(head),
                            kind,
                        });
                    }
                }
            }
            Granularity::PerLayer => {
                for kind in [TensorKind::Key, TensorKind::Value] {
                    ids.push(crate::plan::TensorId {
                        layer,
                        head: None,
                        kind,
                    });
                }
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reserve;
    use crate::size::MAX_RESERVE_ROWS;

    #[test]
    fn kv_tensor_names_round_trip_and_positions_follow_buffers() {
        let mut g = llama2_7b();
        g.kv_heads = 3;
        for b in 0..g.buffers() {
            let (layer, head, kind) = g.buffer_coords(b);
            for io in [KvIo::Past, KvIo::New] {
                let t = g.buffer_tensor(b, io);
                assert_eq!(KvTensor::parse(&t.name()), Some(t));
                assert_eq!(t.position(g.kv_heads), g.buffer_index(layer, head, kind));
                assert_eq!(t.position(g.kv_heads), b);
            }
        }
        g.granularity = Granularity::PerLayer;
        let t = g.buffer_tensor(g.buffer_index(5, 2, TensorKind::Value), KvIo::New);
        assert_eq!(t.name(), "new_value_5");
        assert_eq!(t.position(g.kv_heads), 11);
        assert_eq!(KvTensor::parse("new_value_5"), Some(t));
        let cross = KvTensor {
            io: KvIo::Cross,
            ..t
        };
        assert_eq!(cross.name(), "cross_value_5");
        assert_eq!(KvTensor::parse("cross_value_5"), Some(cross));
        assert_eq!(
            KvTensor::parse("cross_key_2_1"),
            Some(KvTensor {
                io: KvIo::Cross,
                kind: TensorKind::Key,
                layer: 2,
                head: Some(1)
            })
        );
        assert_eq!(
            KvTensor::parse("past_key_3_1").map(|t| (t.layer, t.head)),
            Some((3, Some(1)))
        );
        for bad in [
            "past_key_x",
            "past_key_1_2_3",
            "past_key_",
            "past_key_+1",
            "old_key_1",
            "crosskey_1",
            "past_keys_1",
            "logits",
        ] {
            assert_eq!(KvTensor::parse(bad), None, "{bad}");
        }
    }

    fn llama2_7b() -> Geometry {
        Geometry::new(32, 32, 128, 2048, &[1], DataType::U16)
    }

    fn spec(g: Geometry, s: Strategy) -> CacheSpec {
        CacheSpec::for_simulation(g, s)
    }

    #[test]
    fn seed_region_is_exact() {
        // 2048 buffers x 2(S-1) rows x 256 bytes.
        let bytes = spec(llama2_7b(), Strategy::SHIFT_2X)
            .region_bytes()
            .unwrap();
        assert_eq!(bytes, 2_146_435_072);
        assert_eq!(bytes, 2048 * 2 * 2047 * 256);
    }

    #[test]
    fn reserve_rows_follow_the_formula() {
        let g = llama2_7b();
        assert_eq!(Reserve::Factor(2.0).rows(&g).unwrap(), 4094);
        assert_eq!(Reserve::Factor(1.5).rows(&g).unwrap(), 2047 + 1023);
        assert_eq!(Reserve::Spare(64).rows(&g).unwrap(), 2047 + 64);
        assert_eq!(Reserve::Rows(3000).rows(&g).unwrap(), 3000);
        // With a prefill variant the window is still S - min(ar).
        let g2 = Geometry::new(2, 2, 8, 512, &[1, 32], DataType::U8);
        assert_eq!(Reserve::Factor(2.0).rows(&g2).unwrap(), 2 * 511);
    }

    #[test]
    fn conveyor_is_about_half_of_shift_2x() {
        let shift = spec(llama2_7b(), Strategy::SHIFT_2X)
            .region_bytes()
            .unwrap();
        let conveyor = spec(llama2_7b(), Strategy::Conveyor)
            .region_bytes()
            .unwrap();
        // (B - 1) * S + 2 * (S - 1) rows.
        assert_eq!(conveyor, (2047 * 2048 + 2 * 2047) * 256);
        let ratio = conveyor as f64 / shift as f64;
        assert!(ratio < 0.51 && ratio > 0.49, "{ratio}");
    }

    #[test]
    fn in_place_strategies_refuse_per_layer_and_transposed() {
        for strategy in [Strategy::SHIFT_2X, Strategy::Conveyor] {
            let mut g = llama2_7b();
            g.granularity = Granularity::PerLayer;
            let err = spec(g, strategy).region_bytes().unwrap_err();
            assert!(
                matches!(&err, KvError::UnsupportedCombination { reason, .. } if reason.contains("per_head")),
                "{err}"
            );
            let mut g = llama2_7b();
            g.k_layout = KLayout::Transposed;
            let err = spec(g, strategy).region_bytes().unwrap_err();
            assert!(
                matches!(&err, KvError::UnsupportedCombination { reason, .. } if reason.contains("rows")),
                "{err}"
            );
        }
        let mut g = llama2_7b();
        g.granularity = Granularity::PerLayer;
        g.k_layout = KLayout::Transposed;
        assert!(spec(g.clone(), Strategy::SmartMask).region_bytes().is_ok());
        assert!(spec(g, Strategy::Naive).region_bytes().is_ok());
    }

    #[test]
    fn small_reserve_is_refused_with_the_minimum() {
        let g = Geometry::new(1, 1, 4, 64, &[1, 16], DataType::U8);
        let s = Strategy::Shift {
            reserve: Reserve::Spare(15),
            stagger: false,
        };
        let err = spec(g, s).region_bytes().unwrap_err();
        assert_eq!(
            err,
            KvError::ReserveTooSmall {
                reserve: 63 + 15,
                minimum: 63 + 16,
                max_window: 63,
                max_ar: 16
            }
        );
    }

    #[test]
    fn geometry_errors_name_the_field() {
        let cases = [
            (Geometry::new(0, 1, 4, 8, &[1], DataType::U8), "layers"),
            (Geometry::new(1, 0, 4, 8, &[1], DataType::U8), "kv_heads"),
            (Geometry::new(1, 1, 0, 8, &[1], DataType::U8), "head_dim"),
            (Geometry::new(1, 1, 4, 1, &[1], DataType::U8), "context"),
            (Geometry::new(1, 1, 4, 8, &[], DataType::U8), "ar"),
            (Geometry::new(1, 1, 4, 8, &[8], DataType::U8), "ar"),
            (Geometry::new(1, 1, 4, 8, &[1, 1], DataType::U8), "ar"),
            (Geometry::new(1, 1, 4, 8, &[2, 7], DataType::U8), "ar"),
        ];
        for (g, field) in cases {
            match g.validate() {
                Err(KvError::InvalidGeometry { field: f, .. }) => assert_eq!(f, field, "{g:?}"),
                other => panic!("{g:?}: expected an error on `{field}`, got {other:?}"),
            }
        }
    }

    #[test]
    fn encodings_must_agree_between_past_and_new() {
        let g = Geometry::new(1, 2, 4, 16, &[1, 4], DataType::U8);
        let enc = |scale: f32| QuantSpec {
            dtype: DataType::U8,
            encoding: quant::Encoding::PerTensor(quant::ScaleOffset {
                scale,
                offset: -128,
            }),
        };
        let same = vec![enc(0.1); 4];
        let ok = encodings_from_graphs(
            &g,
            &[
                (1, same.clone(), same.clone()),
                (4, same.clone(), same.clone()),
            ],
        );
        assert_eq!(ok.unwrap(), same);
        let mut differ = same.clone();
        differ[3] = enc(0.2);
        let err = encodings_from_graphs(
            &g,
            &[(1, same.clone(), same.clone()), (4, same.clone(), differ)],
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                KvError::EncodingMismatch {
                    ar: 4,
                    layer: 0,
                    head: 1,
                    kind: TensorKind::Value,
                    ..
                }
            ),
            "{err}"
        );
        // A cache whose encodings are of another data type is refused too.
        let wrong = CacheSpec::uniform(
            g,
            Strategy::Naive,
            QuantSpec {
                dtype: DataType::U16,
                ..enc(0.1)
            },
        );
        assert!(matches!(
            wrong.region_bytes(),
            Err(KvError::EncodingDataType { .. })
        ));
    }

    #[test]
    fn dimensions_above_their_limits_are_refused_before_anything_is_sized() {
        let huge = 1usize << 40;
        type Set = fn(&mut Geometry, usize);
        let fields: [(&str, usize, Set); 4] = [
            ("layers", MAX_LAYERS, |g, v| g.layers = v),
            ("kv_heads", MAX_HEADS, |g, v| g.kv_heads = v),
            ("head_dim", MAX_HEAD_DIM, |g, v| g.head_dim = v),
            ("context", MAX_CONTEXT, |g, v| g.context = v),
        ];
        for (field, max, set) in fields {
            let mut g = llama2_7b();
            set(&mut g, huge);
            // No per-buffer table of 2^40+ entries is built: the spec is refused by its geometry.
            let spec = spec(g, Strategy::Naive);
            assert!(spec.encodings.is_empty());
            assert_eq!(
                spec.region_bytes().unwrap_err().to_string(),
                format!("invalid geometry: `{field}` is {huge}, above the limit of {max}")
            );
        }
        let mut g = llama2_7b();
        g.layers = MAX_LAYERS;
        g.kv_heads = MAX_HEADS;
        assert_eq!(
            g.validate().unwrap_err().to_string(),
            "invalid geometry: `kv_heads` gives 2 x layers x kv_heads = 33554432 K/V buffers, \
             above the limit of 262144"
        );
        g.kv_heads = 1;
        g.ar_variants = (1..=65).collect();
        assert!(
            g.validate()
                .unwrap_err()
                .to_string()
                .contains("65 AR variants")
        );
    }

    #[test]
    fn reservations_above_the_limit_are_refused_not_wrapped() {
        let g = llama2_7b();
        for (reserve, text) in [
            (Reserve::Factor(1e300), "1e300x"),
            (Reserve::Factor(f64::MAX), "1.7976931348623157e308x"),
            (Reserve::Spare(usize::MAX), "+18446744073709551615"),
            (Reserve::Spare(MAX_RESERVE_ROWS), "+67108864"),
            (Reserve::Rows(usize::MAX), "18446744073709551615 rows"),
        ] {
            let e = reserve.rows(&g).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "shift reservation of {text} exceeds the limit of 67108864 rows per buffer"
                )
            );
            let strategy = Strategy::Shift {
                reserve,
                stagger: false,
            };
            assert_eq!(spec(g.clone(), strategy).region_bytes().unwrap_err(), e);
        }
        assert_eq!(
            Reserve::Rows(MAX_RESERVE_ROWS).rows(&g).unwrap(),
            MAX_RESERVE_ROWS
        );
    }
}
