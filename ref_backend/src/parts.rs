//! Split models: a compiled model cut into N parts of consecutive layers, one graph per part and
//! AR variant, as Qualcomm AI Hub ships its LLMs (`{prompt|token}_ar{n}_cl{c}_{i}_of_{N}`).
//!
//! Part 1 takes `input_ids`, every other part the hidden state `hidden_in [1, n, dim]` (f32:
//! the residual stream passes between parts exactly, so a split model computes the whole
//! model's logits bit for bit); the last part gives `logits`, every other part `hidden_out
//! [1, n, dim]` f32. Each part holds the K/V tensors of its own layers (named by the absolute
//! layer). With RoPE tables the positions come as `position_ids_cos` and `position_ids_sin`
//! `[1, 1, n, head_dim / 2]` f32 (the cosine and sine of each row's angle per rotated pair)
//! instead of `positions`.

use std::ops::Range;
use std::sync::Arc;

use kv_manager::{KvIo, KvTensor, TensorKind};
use quant::{DataType, Encoding, ScaleOffset, Symmetry};

use crate::compile::CompiledModel;
use crate::error::CompileError;

/// One part of a split model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// 0-based part index.
    pub index: usize,
    /// Number of parts.
    pub count: usize,
    /// The layers this part runs.
    pub layers: Range<usize>,
    /// Positions as cos/sin tables (`position_ids_cos`/`_sin`) instead of position ids.
    pub rope_tables: bool,
    /// AI Hub's names: graphs `{phase}_ar{n}_cl{c}_{i}_of_{N}`, K/V `past_key_{l}_in`,
    /// `past_key_{l}_out`, … (`…_{l}_h{h}_…` per head). Every part made by [`Part::split`]
    /// has them; [`Part::whole`] keeps htpkv's (`ar{n}_cl{c}`, `past_key_{l}[_{h}]`, `new_key_…`).
    pub ai_hub_names: bool,
}

impl Part {
    /// The whole model as its one part, with position ids (htpkv's own graphs).
    pub fn whole(n_layers: usize) -> Part {
        Part {
            index: 0,
            count: 1,
            layers: 0..n_layers,
            rope_tables: false,
            ai_hub_names: false,
        }
    }

    /// `count` parts of consecutive layers of an `n_layers` model; sizes differ by at most one,
    /// earlier parts the larger. Every part needs at least one layer.
    pub fn split(n_layers: usize, count: usize, rope_tables: bool) -> Result<Vec<Part>, String> {
        if count == 0 || count > n_layers {
            return Err(format!(
                "{count} parts for {n_layers} layers: expected 1 to {n_layers}"
            ));
        }
        let (base, extra) = (n_layers / count, n_layers % count);
        let mut start = 0;
        Ok((0..count)
            .map(|index| {
                let len = base + usize::from(index < extra);
                start += len;
                Part {
                    index,
                    count,
                    layers: start - len..start,
                    rope_tables,
                    ai_hub_names: true,
                }
            })
            .collect())
    }

    /// True for the part that takes the token ids.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// True for the part that gives the logits.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The name of the AR-`n` graph: with AI Hub's names `prompt_ar{n}_cl{c}_{i}_of_{N}` for
    /// `n > 1`, else `token_…`; otherwise htpkv's `ar{n}_cl{c}`.
    pub fn graph_name(&self, n: usize, context: usize) -> String {
        if !self.ai_hub_names {
            return crate::model::graph_name(n, context);
        }
        let phase = if n > 1 { "prompt" } else { "token" };
        let (i, count) = (self.index + 1, self.count);
        format!("{phase}_ar{n}_cl{context}_{i}_of_{count}")
    }
}

/// AI Hub's name of a K/V tensor: `past_{key|value}_{l}[_h{h}]_{in|out}`.
pub(crate) fn ai_hub_kv_name(t: &KvTensor) -> String {
    let kind = match t.kind {
        TensorKind::Key => "key",
        TensorKind::Value => "value",
    };
    let dir = match t.io {
        KvIo::Past => "in",
        KvIo::New => "out",
        KvIo::Cross => "cross",
    };
    match t.head {
        Some(h) => format!("past_{kind}_{}_h{h}_{dir}", t.layer),
        None => format!("past_{kind}_{}_{dir}", t.layer),
    }
}

impl CompiledModel {
    /// The model cut into `count` parts ([`Part::split`]), one [`CompiledModel`] (one file,
    /// one QNN context) each, sharing this model's weights and encodings; every part has a
    /// graph per AR variant.
    pub fn split(
        &self,
        count: usize,
        rope_tables: bool,
    ) -> Result<Vec<CompiledModel>, CompileError> {
        let parts = Part::split(self.data.config.n_layers, count, rope_tables)
            .map_err(|reason| CompileError::InvalidOptions { reason })?;
        Ok(parts
            .into_iter()
            .map(|p| CompiledModel::with_part(Arc::clone(&self.data), p))
            .collect())
    }

    /// The same model and part — weights, activation and K/V encodings — with its graphs built for
    /// context length `context` (`_cl{context}` in their names): several context lengths of one
    /// model whose K/V rows mean the same in each, so a runtime can move its cache from one to
    /// another by copying rows. `context` must satisfy the compile rules (2 to the model's context
    /// length, above every AR variant).
    pub fn with_context(&self, context: usize) -> Result<CompiledModel, CompileError> {
        let mut data = (*self.data).clone();
        data.options.context = context;
        crate::compile::validate_options(&data.config, &data.options)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_layer_once() {
        let parts = Part::split(5, 2, true).unwrap();
        assert_eq!(parts[0].layers, 0..3);
        assert_eq!(parts[1].layers, 3..5);
        assert!(parts[0].is_first() && !parts[0].is_last() && parts[1].is_last());
        assert_eq!(Part::whole(5).graph_name(1, 64), "ar1_cl64");
        assert_eq!(parts[1].graph_name(1, 64), "token_ar1_cl64_2_of_2");
        assert_eq!(parts[0].graph_name(32, 64), "prompt_ar32_cl64_1_of_2");
        assert!(Part::split(5, 6, false).is_err());
        assert!(Part::split(5, 0, false).is_err());
        assert_eq!(Part::split(5, 5, false).unwrap()[4].layers, 4..5);
    }
}
