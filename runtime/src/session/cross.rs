//! Static cross-attention K/V in the session: the cache's [`CrossSpec`] derived from the graphs,
//! and the per-request API ([`Session::encode`], [`Session::fill_cross`],
//! [`Session::reset_request`]).
//!
//! An encoder-decoder model arrives as one **encoder graph** (input `source_ids`, outputs the
//! `cross_{key|value}_*` tensors) and the usual decoder graphs, which take the same
//! `cross_{key|value}_*` tensors as read-only inputs. The session sizes the static buffers from the
//! decoders' descriptions (E = the tensors' row count, one encoding per (layer, KV head, K|V)) and
//! refuses a model whose encoder writes another encoding than the decoders read: the encoder's
//! bytes are copied into the static buffers as they are, never requantized.

use super::{Session, SessionError};
use crate::backend::{Backend, GraphDesc, InputBuffer, IoRole, IoTensor, OutputBuffer};
use kv_manager::{CrossSpec, Geometry, Granularity, KvIo, KvTensor, TensorKind};
use quant::{Encoding, QuantSpec};

fn bad(message: String) -> SessionError {
    SessionError::Graphs(message)
}

/// The cross tensor an [`IoTensor`] of role `CrossKey`/`CrossValue` is.
fn cross_tensor(t: &IoTensor, kind: TensorKind) -> Result<KvTensor, SessionError> {
    let layer = t
        .layer
        .ok_or_else(|| bad(format!("cross tensor `{}` has no layer", t.name)))?;
    Ok(KvTensor {
        io: KvIo::Cross,
        kind,
        layer,
        head: t.head,
    })
}

fn kind_of(role: IoRole) -> Option<TensorKind> {
    match role {
        IoRole::CrossKey => Some(TensorKind::Key),
        IoRole::CrossValue => Some(TensorKind::Value),
        _ => None,
    }
}

/// The index of a cross tensor among the plan's cross bindings.
pub(super) fn cross_index(
    geometry: &Geometry,
    t: &IoTensor,
    kind: TensorKind,
) -> Result<usize, SessionError> {
    let tensor = cross_tensor(t, kind)?;
    if tensor.layer >= geometry.layers || tensor.head.is_some_and(|h| h >= geometry.kv_heads) {
        return Err(bad(format!(
            "cross tensor `{}` is outside the cache's {} layers x {} KV heads",
            t.name, geometry.layers, geometry.kv_heads
        )));
    }
    Ok(tensor.position(geometry.kv_heads))
}

/// The static cross buffers the decoder graphs read, if any: E from their row count, per-buffer
/// encodings from their descriptions (per-layer tensors: one per head of a per-axis encoding).
/// Every decoder graph, and the encoder's outputs, must agree on each tensor's shape and encoding.
pub(super) fn cross_spec_from_graphs(
    graphs: &[GraphDesc],
    geometry: &Geometry,
) -> Result<Option<CrossSpec>, SessionError> {
    let decoder_inputs = graphs
        .iter()
        .filter(|g| !g.is_encoder())
        .flat_map(|g| &g.inputs);
    let encoder_outputs = graphs
        .iter()
        .filter(|g| g.is_encoder())
        .flat_map(|g| &g.outputs);
    let tensors: Vec<&IoTensor> = decoder_inputs
        .filter(|t| kind_of(t.role).is_some())
        .collect();
    let Some(first) = tensors.first() else {
        if graphs.iter().any(GraphDesc::is_encoder) {
            return Err(bad(
                "an encoder graph writes cross K/V but no decoder graph reads them".into(),
            ));
        }
        return Ok(None);
    };
    let rows = first.shape.len().checked_sub(2).map(|i| first.shape[i]);
    let rows = rows.ok_or_else(|| bad(format!("cross tensor `{}` has no rows", first.name)))?;
    let granularity = if first.head.is_some() {
        Granularity::PerHead
    } else {
        Granularity::PerLayer
    };
    let mut encodings: Vec<Option<QuantSpec>> = vec![None; geometry.buffers()];
    let mut seen: Vec<(KvTensor, &IoTensor)> = Vec::new();
    let written: Vec<&IoTensor> = encoder_outputs
        .filter(|t| kind_of(t.role).is_some())
        .collect();
    let read = tensors.len();
    for (i, &t) in tensors.iter().chain(&written).enumerate() {
        let tensor = cross_tensor(t, kind_of(t.role).expect("filtered"))?;
        if let Some((_, other)) = seen.iter().find(|(s, _)| *s == tensor) {
            if other.shape != t.shape || other.quant != t.quant {
                return Err(bad(format!(
                    "cross tensor `{}` is described twice differently ({:?} {:?} vs {:?} {:?}): \
                     the encoder's output is copied into the static buffer, never requantized",
                    t.name, other.shape, other.quant, t.shape, t.quant
                )));
            }
            continue;
        }
        if i >= read {
            return Err(bad(format!(
                "the encoder writes cross tensor `{}`, which no decoder graph reads",
                t.name
            )));
        }
        if t.head.is_some() != (granularity == Granularity::PerHead) {
            return Err(bad(format!(
                "cross tensor `{}` mixes per-head and per-layer cross tensors",
                t.name
            )));
        }
        cross_index(geometry, t, tensor.kind)?;
        let spec = t
            .quant
            .clone()
            .ok_or_else(|| bad(format!("cross tensor `{}` has no encoding", t.name)))?;
        let heads: Vec<usize> = match t.head {
            Some(h) => vec![h],
            None => (0..geometry.kv_heads).collect(),
        };
        for (i, &h) in heads.iter().enumerate() {
            let per_head = match &spec.encoding {
                Encoding::PerAxis { params, .. } => QuantSpec {
                    dtype: spec.dtype,
                    encoding: Encoding::PerTensor(*params.get(i).ok_or_else(|| {
                        bad(format!(
                            "cross tensor `{}` lacks head {h}'s encoding",
                            t.name
                        ))
                    })?),
                },
                _ => spec.clone(),
            };
            encodings[geometry.buffer_index(tensor.layer, h, tensor.kind)] = Some(per_head);
        }
        seen.push((tensor, t));
    }
    let encodings = encodings
        .into_iter()
        .enumerate()
        .map(|(b, e)| {
            e.ok_or_else(|| {
                let (l, h, k) = geometry.buffer_coords(b);
                bad(format!("no graph reads cross {k} of layer {l} head {h}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(CrossSpec {
        rows,
        granularity,
        encodings,
    }))
}

impl<B: Backend> Session<B> {
    /// Starts a request from a source sequence: resets the cache (self-attention rows and cross
    /// buffers), runs the encoder graph on `source` (exactly its `source_ids` length) and copies
    /// its cross K/V outputs into the static buffers as they are. Decoding then goes through
    /// [`Session::prefill`] / [`Session::decode`] as for any model.
    pub fn encode(&mut self, source: &[u32]) -> Result<(), SessionError> {
        let graphs = self.backend.graphs();
        let index = graphs
            .iter()
            .position(GraphDesc::is_encoder)
            .ok_or_else(|| bad("the model has no encoder graph".into()))?;
        let g = &graphs[index];
        let [input] = g.inputs.as_slice() else {
            return Err(bad(format!(
                "encoder graph `{}` must take one input (source_ids), it takes {}",
                g.name,
                g.inputs.len()
            )));
        };
        if input.role != IoRole::SourceIds || input.byte_size() != source.len() * 4 {
            return Err(SessionError::Input(format!(
                "encoder graph `{}` takes {} source tokens, got {}",
                g.name,
                input.byte_size() / 4,
                source.len()
            )));
        }
        let ids: Vec<u8> = source
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|t| vec![0; t.byte_size()]).collect();
        let described = g.outputs.clone();
        let inputs = [InputBuffer {
            ptr: ids.as_ptr(),
            len: ids.len(),
        }];
        let outputs: Vec<OutputBuffer> = outs
            .iter_mut()
            .map(|o| OutputBuffer {
                ptr: o.as_mut_ptr(),
                len: o.len(),
            })
            .collect();
        self.reset_request();
        // SAFETY: every buffer is a live Vec of exactly its described size, in description order;
        // the outputs are distinct Vecs, so none overlaps another or the input.
        unsafe { self.backend.execute(index, &inputs, &outputs)? };
        for (t, bytes) in described.iter().zip(&outs) {
            let kind = kind_of(t.role)
                .ok_or_else(|| bad(format!("encoder output `{}` is not a cross tensor", t.name)))?;
            let spec = t
                .quant
                .as_ref()
                .ok_or_else(|| bad(format!("cross tensor `{}` has no encoding", t.name)))?;
            self.fill_cross(&cross_tensor(t, kind)?, spec, bytes)?;
        }
        Ok(())
    }

    /// Fills one static cross tensor with bytes already in its encoding (an encoder run
    /// elsewhere): a wrong size, encoding or tensor is an error, nothing is requantized.
    pub fn fill_cross(
        &mut self,
        tensor: &KvTensor,
        encoding: &QuantSpec,
        bytes: &[u8],
    ) -> Result<(), SessionError> {
        Ok(self.cache.fill_cross(tensor, encoding, bytes)?)
    }

    /// Ends a request: empties the cache and the static cross buffers (the next step needs a
    /// new [`Session::encode`] or a full set of [`Session::fill_cross`]).
    pub fn reset_request(&mut self) {
        self.reset();
        self.cache.clear_cross();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htpkv_reference::encdec_graph_descs;
    use kv_manager::Strategy;
    use model::encdec::{EncDecConfig, EncDecWeights};
    use quant::DataType;
    use ref_backend::encdec::{EncDecOptions, compile_encdec};
    use std::sync::Arc;

    fn graphs() -> Vec<GraphDesc> {
        let c = EncDecConfig::tiny();
        let w = Arc::new(EncDecWeights::from_seed(&c, 3).unwrap());
        let opts = EncDecOptions {
            context: 12,
            ar: vec![1, 4],
            cross_dtype: DataType::U8,
        };
        let model = compile_encdec(&c, w, &[vec![1; 8]], &opts).unwrap();
        encdec_graph_descs(&model)
    }

    fn spec(graphs: &[GraphDesc]) -> Result<kv_manager::CacheSpec, SessionError> {
        super::super::cache_spec_from_graphs(graphs, Strategy::Conveyor)
    }

    #[test]
    fn the_cross_spec_comes_from_the_decoder_graphs() {
        let s = spec(&graphs()).unwrap();
        let cross = s.cross.unwrap();
        assert_eq!((cross.rows, cross.granularity), (8, Granularity::PerHead));
        assert_eq!(cross.encodings.len(), s.geometry.buffers());
        assert_eq!(cross.dtype(), Some(DataType::U8));
        // The encoder graph is not a step variant.
        assert_eq!(s.geometry.ar_variants, vec![1, 4]);
    }

    #[test]
    fn an_encoder_writing_another_encoding_than_the_decoders_read_is_refused() {
        let mut g = graphs();
        let encoder = g.iter_mut().find(|g| g.is_encoder()).unwrap();
        encoder.outputs[3].quant = Some(QuantSpec::float(DataType::F32).unwrap());
        let err = spec(&g).unwrap_err().to_string();
        assert!(
            err.contains("cross_value_0_1") && err.contains("never requantized"),
            "{err}"
        );
    }

    #[test]
    fn a_cross_buffer_no_decoder_reads_is_refused() {
        let mut g = graphs();
        for graph in g.iter_mut().filter(|g| !g.is_encoder()) {
            graph.inputs.retain(|t| t.name != "cross_key_1_0");
        }
        let err = spec(&g).unwrap_err().to_string();
        assert!(
            err.contains("the encoder writes cross tensor `cross_key_1_0`, which no decoder"),
            "{err}"
        );
        let encoder = g.iter_mut().find(|g| g.is_encoder()).unwrap();
        encoder.outputs.retain(|t| t.name != "cross_key_1_0");
        let err = spec(&g).unwrap_err().to_string();
        assert!(
            err.contains("no graph reads cross K of layer 1 head 0"),
            "{err}"
        );
        for graph in g.iter_mut() {
            graph.inputs.retain(|t| kind_of(t.role).is_none());
        }
        let err = spec(&g).unwrap_err().to_string();
        assert!(err.contains("no decoder graph reads them"), "{err}");
    }
}
