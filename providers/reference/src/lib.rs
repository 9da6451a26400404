//! The in-process reference backend: `ref_backend`'s CPU executor behind the [`Backend`] trait.

use htpkv_runtime::backend::{Backend, BackendError, GraphDesc, InputBuffer, OutputBuffer};
use ref_backend::CompiledModel;
use std::sync::Arc;

/// Graph descriptions of a compiled model.
pub fn graph_descs(model: &CompiledModel) -> Vec<GraphDesc> {
    model
        .graphs()
        .iter()
        .map(|g| GraphDesc {
            name: g.name().to_string(),
            inputs: g.inputs().to_vec(),
            outputs: g.outputs().to_vec(),
            part: Default::default(),
            mask: Default::default(),
        })
        .collect()
}

/// The reference executor in this process.
#[derive(Debug, Clone)]
pub struct ReferenceBackend {
    model: Arc<CompiledModel>,
    graphs: Vec<GraphDesc>,
}

impl ReferenceBackend {
    /// Wraps a compiled model.
    pub fn new(model: Arc<CompiledModel>) -> Self {
        let graphs = graph_descs(&model);
        ReferenceBackend { model, graphs }
    }

    /// The compiled model.
    pub fn model(&self) -> &CompiledModel {
        &self.model
    }
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.graphs
    }

    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        let g = self.model.graphs().get(graph).ok_or_else(|| BackendError {
            backend: "reference",
            message: format!("no graph #{graph}"),
            source: None,
        })?;
        let ins: Vec<(*const u8, usize)> = inputs.iter().map(|b| (b.ptr, b.len)).collect();
        let outs: Vec<(*mut u8, usize)> = outputs.iter().map(|b| (b.ptr, b.len)).collect();
        // SAFETY: the caller upholds `Backend::execute`'s contract, which is `execute_raw`'s.
        unsafe { g.execute_raw(&ins, &outs) }.map_err(|e| BackendError {
            backend: "reference",
            message: format!("executing graph #{graph}"),
            source: Some(Box::new(e)),
        })
    }
}

/// The reference executor of an encoder-decoder model ([`ref_backend::encdec`]) in this process:
/// its encoder graph and decoder graphs, for [`htpkv_runtime::session::Session::encode`] and the usual steps.
#[derive(Debug, Clone)]
pub struct EncDecReference {
    model: Arc<ref_backend::encdec::EncDecCompiled>,
    graphs: Vec<GraphDesc>,
}

impl EncDecReference {
    /// Wraps a compiled encoder-decoder model (its graphs come described with their roles).
    pub fn new(model: Arc<ref_backend::encdec::EncDecCompiled>) -> Self {
        let graphs = encdec_graph_descs(&model);
        EncDecReference { model, graphs }
    }
}

/// Graph descriptions of a compiled encoder-decoder model: its encoder graph, then its decoders.
pub fn encdec_graph_descs(model: &ref_backend::encdec::EncDecCompiled) -> Vec<GraphDesc> {
    model
        .graphs()
        .iter()
        .map(|g| GraphDesc {
            name: g.name.clone(),
            inputs: g.inputs.clone(),
            outputs: g.outputs.clone(),
            part: Default::default(),
            mask: Default::default(),
        })
        .collect()
}

impl Backend for EncDecReference {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn graphs(&self) -> &[GraphDesc] {
        &self.graphs
    }

    unsafe fn execute(
        &mut self,
        graph: usize,
        inputs: &[InputBuffer],
        outputs: &[OutputBuffer],
    ) -> Result<(), BackendError> {
        if graph >= self.graphs.len() {
            return Err(BackendError {
                backend: "reference",
                message: format!("no graph #{graph}"),
                source: None,
            });
        }
        // SAFETY: `Backend::execute`'s contract: every buffer is valid for its length for the
        // call, and no output overlaps another output or any input, so the shared and exclusive
        // slices made here do not alias mutably.
        let ins: Vec<&[u8]> = inputs
            .iter()
            .map(|b| unsafe { std::slice::from_raw_parts(b.ptr, b.len) })
            .collect();
        // SAFETY: as above.
        let mut outs: Vec<&mut [u8]> = outputs
            .iter()
            .map(|b| unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) })
            .collect();
        self.model
            .execute(graph, &ins, &mut outs)
            .map_err(|e| BackendError {
                backend: "reference",
                message: format!("executing encoder-decoder graph #{graph}"),
                source: Some(Box::new(e)),
            })
    }
}
