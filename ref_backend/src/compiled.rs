//! The compiled model: configuration, weights, encodings, the part it is and its graphs.

use std::sync::Arc;

use graph_io::{LogitRows, Preset};
use model::{LlamaConfig, Tensor};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset, Symmetry};

use crate::error::CompileError;
use crate::exec::Graph;
use crate::model::{ActSite, I8Matrix, LayerData, Matrix, ModelData};
use crate::options::CompileOptions;
use crate::parts::{Part, Split, check_naming, parts_naming};

/// A compiled model: configuration, weights, encodings and one [`Graph`] per AR variant — the
/// reference backend's "context binary" (see [`mod@crate::format`] for the file).
pub struct CompiledModel {
    pub(crate) data: Arc<ModelData>,
    pub(crate) part: Part,
    pub(crate) graphs: Vec<Graph>,
}

impl std::fmt::Debug for CompiledModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledModel")
            .field("config", &self.data.config)
            .field("options", &self.data.options)
            .field("graphs", &self.graphs)
            .finish_non_exhaustive()
    }
}

/// Two compiled models are equal when their configuration, options, weights, encodings and
/// graph descriptions are.
impl PartialEq for CompiledModel {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
            && self.part == other.part
            && self.graphs.len() == other.graphs.len()
            && self.graphs.iter().zip(&other.graphs).all(|(a, b)| {
                a.name() == b.name() && a.inputs() == b.inputs() && a.outputs() == b.outputs()
            })
    }
}

impl CompiledModel {
    /// Builds the graphs for `data` (validated by the caller): the whole model.
    pub(crate) fn from_data(data: ModelData) -> CompiledModel {
        let part = Part::whole(data.config.n_layers);
        CompiledModel::with_part(Arc::new(data), part)
    }

    /// The graphs of `part` of `data` (a part that fits the model): its options' graph set
    /// ([`CompileOptions::graph_set`]), a last-row graph named by [`LogitRows::graph_name`].
    pub(crate) fn with_part(data: Arc<ModelData>, part: Part) -> CompiledModel {
        let context = data.options.context;
        let graphs = data
            .options
            .graph_set()
            .into_iter()
            .map(|(n, rows)| {
                let name = rows.graph_name(part.graph_name(n, context));
                Graph::new(name, (n, rows), Arc::clone(&data), part.clone())
            })
            .collect();
        CompiledModel { data, part, graphs }
    }

    /// The part of the model this file holds ([`Part::whole`] unless made by
    /// [`split`](Self::split)).
    pub fn part(&self) -> &Part {
        &self.part
    }

    /// The model description.
    pub fn config(&self) -> &LlamaConfig {
        &self.data.config
    }

    /// The options the model was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.data.options
    }

    /// The fingerprint (SHA-256 of the model file(s)) [`compile`] was given: a runtime checks
    /// it against the model it is about to use with this compiled file.
    pub fn model_sha256(&self) -> [u8; 32] {
        self.data.model_sha256
    }

    /// [`model_sha256`](Self::model_sha256) as 64 lower-case hex digits.
    pub fn model_sha256_hex(&self) -> String {
        self.data
            .model_sha256
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The token sequences calibration started from.
    pub fn calibration(&self) -> &[Vec<u32>] {
        &self.data.calibration
    }

    /// [`CompileOptions::fingerprint`] of the options.
    pub fn fingerprint(&self) -> u64 {
        self.data.options.fingerprint()
    }

    /// All graphs, in the order of [`CompileOptions::graph_set`]: the all-row ones in the order
    /// of `options().ar`, then the last-row ones.
    pub fn graphs(&self) -> &[Graph] {
        &self.graphs
    }

    /// The graph called `name` (e.g. `ar1_cl512`).
    pub fn graph(&self, name: &str) -> Option<&Graph> {
        self.graphs.iter().find(|g| g.name() == name)
    }

    /// The graph that processes `n` tokens per step and returns every row's logits.
    pub fn graph_for_ar(&self, n: usize) -> Option<&Graph> {
        self.graph_for(n, LogitRows::All)
    }

    /// The graph that processes `n` tokens per step and returns the logits of `rows`.
    pub fn graph_for(&self, n: usize, rows: LogitRows) -> Option<&Graph> {
        self.graphs
            .iter()
            .find(|g| g.ar() == n && g.logit_rows() == rows)
    }

    /// The KV encoding of (layer, KV head), keys (`value = false`) or values; shared by the
    /// past and new tensors of that head.
    pub fn kv_spec(&self, layer: usize, head: usize, value: bool) -> Option<&QuantSpec> {
        let c = &self.data.config;
        if layer >= c.n_layers || head >= c.n_kv_heads {
            return None;
        }
        Some(self.data.kv_spec(layer, head, value))
    }

    /// The static i16 encoding of a matmul input (`None` for float weights or out of range).
    pub fn activation_encoding(&self, layer: usize, site: ActSite) -> Option<ScaleOffset> {
        if layer >= self.data.config.n_layers {
            return None;
        }
        self.data.act(layer, site)
    }

    /// Every matrix product of the whole model, in the forward's order: each layer's seven
    /// matrices, then the classifier ([`Tensor::classifier`]), each with the static i16 encoding
    /// of its input (`None` for float weights).
    pub fn matrix_products(&self) -> Vec<(Tensor, Option<ScaleOffset>)> {
        let c = &self.data.config;
        let layers =
            (0..c.n_layers).flat_map(|l| LayerData::MATRICES.map(|lt| Tensor::Layer(l, lt)));
        layers
            .chain([Tensor::classifier(c)])
            .map(|t| (t, self.data.input_encoding(t)))
            .collect()
    }

    /// The i8 weights of matrix `t` as the executor multiplies them: a layer's `Q`, `K`, `V`,
    /// `O`, `Gate`, `Up`, `Down`, the embedding table (`TokenEmbedding`, also the classifier of a
    /// tied model) or the classifier (`Output`). `None` for float weights,
    /// a tensor that is not a matrix, or a part that does not hold it.
    pub fn i8_matrix(&self, t: Tensor) -> Option<I8Matrix<'_>> {
        let d = &self.data;
        let m = match t {
            Tensor::TokenEmbedding => d.embedding.as_ref(),
            Tensor::Output => d.classifier.as_ref(),
            Tensor::Layer(l, lt) => d.layer(l).and_then(|x| x.matrix(lt)),
            Tensor::OutputNorm => None,
        };
        m.and_then(Matrix::as_i8)
    }

    /// The block multipliers of matrix `t` when it is on the LPBQ grid ([`crate::is_lpbq`]),
    /// recomputed from `source`'s f32 values and checked against the stored values
    /// ([`crate::lpbq`]'s `matrix_multipliers`); `Ok(None)` for a matrix on the i8 grid.
    pub fn lpbq_multipliers(
        &self,
        t: Tensor,
        source: &dyn ::model::WeightSource,
    ) -> Result<Option<Vec<u8>>, CompileError> {
        let stored = (self.i8_matrix(t), self.options().weights);
        crate::lpbq::matrix_multipliers(stored, t, source)
    }

    /// Bytes the weights take in memory: every matrix (its values, row scales and row sums)
    /// and every norm and bias vector of this part. Values read in place from the compiled
    /// file's bytes ([`CompiledModel::read`]) count as that file: its whole length, once.
    pub fn weight_bytes(&self) -> u64 {
        let (own, file) = self.weight_memory();
        own + file
    }

    /// The weights' memory in two: bytes of their own (copies, scales, row sums, norms) and the
    /// length of the compiled file whose bytes hold the rest (0 when none does).
    pub fn weight_memory(&self) -> (u64, u64) {
        let d = &self.data;
        let layers = d.layers.iter();
        let matrices = layers.clone().flat_map(|l| &l.matrices);
        let matrices: Vec<&Matrix> = matrices.chain(&d.embedding).chain(&d.classifier).collect();
        let vectors = layers.flat_map(|l| &l.vectors).chain([&d.output_norm]);
        let floats: usize = vectors.map(Vec::len).sum();
        let own: usize = matrices.iter().map(|m| m.own_bytes()).sum::<usize>() + floats * 4;
        let file = matrices
            .iter()
            .find_map(|m| m.file())
            .map_or(0, |f| f.len());
        (own as u64, file as u64)
    }

    /// The static i16 encoding of the classifier input (`None` for float weights).
    pub fn classifier_input_encoding(&self) -> Option<ScaleOffset> {
        self.data.act_final()
    }
}

impl CompiledModel {
    /// The model cut into `count` parts ([`Part::split`]), one [`CompiledModel`] (one file,
    /// one QNN context) each, with this model's encodings and only the weights its graphs use
    /// ([`Part::holds_embedding`], its layers, the final norm and LM head in the last); every
    /// part has a graph per AR variant. `self` must be the whole model.
    pub fn split(
        &self,
        count: usize,
        rope_tables: bool,
    ) -> Result<Vec<CompiledModel>, CompileError> {
        self.split_as(count, rope_tables, Split::Balanced)
    }

    /// [`CompiledModel::split`] cut as `split` ([`Part::split_as`]) under the names parts of
    /// this model's naming take ([`crate::parts::parts_naming`]: AI Hub's for htpkv's).
    pub fn split_as(
        &self,
        count: usize,
        rope_tables: bool,
        split: Split,
    ) -> Result<Vec<CompiledModel>, CompileError> {
        self.require_whole("cut into parts")?;
        let n = self.data.config.n_layers;
        let parts = parts_naming(self.part.naming)
            .and_then(|naming| Part::split_as(n, count, rope_tables, naming, split))
            .map_err(|reason| CompileError::InvalidOptions { reason })?;
        // Parts are named by a convention that declares its graphs (AI Hub's): all-row ones.
        let part_data = |p: &Part| {
            let mut d = self.data.for_part(p);
            d.options.last_row = false;
            Arc::new(d)
        };
        Ok(parts
            .into_iter()
            .map(|p| CompiledModel::with_part(part_data(&p), p))
            .collect())
    }

    /// The whole model under `naming` (its graph names, and the presentation the QNN library
    /// gives it); refused where the naming cannot express the model ([`naming_refusal`];
    /// ExecuTorch's K/V are per layer with K transposed).
    pub fn with_naming(&self, naming: Preset) -> Result<CompiledModel, CompileError> {
        self.require_whole("renamed")?;
        let part = Part {
            naming,
            ..self.part.clone()
        };
        check_naming(&part, &self.data.options)
            .map_err(|reason| CompileError::InvalidOptions { reason })?;
        Ok(CompiledModel::with_part(Arc::clone(&self.data), part))
    }

    fn require_whole(&self, what: &str) -> Result<(), CompileError> {
        if self.part == Part::whole(self.data.config.n_layers) {
            return Ok(());
        }
        Err(CompileError::InvalidOptions {
            reason: format!(
                "part {} of {} cannot be {what}: only the whole model (htpkv names) can",
                self.part.index + 1,
                self.part.count
            ),
        })
    }

    /// The same model and part — weights, activation and K/V encodings — with its graphs built for
    /// context length `context` (`_cl{context}` in their names): several context lengths of one
    /// model whose K/V rows mean the same in each, so a runtime can move its cache from one to
    /// another by copying rows. `context` must satisfy the compile rules (2 to the model's context
    /// length, above every AR variant).
    pub fn with_context(&self, context: usize) -> Result<CompiledModel, CompileError> {
        let mut data = (*self.data).clone();
        data.options.context = context;
        crate::validate::validate_options(&data.config, &data.options)
            .map_err(|reason| CompileError::InvalidOptions { reason })?;
        Ok(CompiledModel::with_part(Arc::new(data), self.part.clone()))
    }

    /// The same model with every u8 K/V encoding symmetric around 0 with zero point 128 (offset
    /// −128, scale `max(|lo|, |hi|) / 127` of the calibrated range `[lo, hi]`), as Qualcomm AI Hub
    /// ships its KV cache: the range of each (layer, KV head, K|V) widened to be symmetric, at the
    /// cost of up to one bit of resolution where the calibrated range was one-sided. Refused unless
    /// the KV cache is u8.
    pub fn with_kv_zero_point_128(&self) -> Result<CompiledModel, CompileError> {
        let refuse = |reason: String| CompileError::InvalidOptions { reason };
        if self.data.options.kv_dtype != DataType::U8 {
            return Err(refuse(format!(
                "a K/V zero point of 128 needs a u8 KV cache, not {}",
                self.data.options.kv_dtype
            )));
        }
        let mut data = (*self.data).clone();
        for spec in &mut data.kv {
            let Encoding::PerTensor(so) = spec.encoding else {
                return Err(refuse("a u8 K/V encoding is not per tensor".into()));
            };
            let lo = so.scale * so.offset as f32;
            let hi = so.scale * (255 + so.offset) as f32;
            let symmetric = ScaleOffset::from_range(lo, hi, DataType::U8, Symmetry::Symmetric)
                .map_err(|source| CompileError::Quant {
                    what: "the symmetric K/V encoding".into(),
                    source,
                })?;
            spec.encoding = Encoding::PerTensor(symmetric);
        }
        Ok(CompiledModel::with_part(Arc::new(data), self.part.clone()))
    }
}
