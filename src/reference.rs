//! The in-process reference backend: `ref_backend`'s CPU executor behind the [`Backend`] trait.

use crate::backend::{
    Backend, BackendError, GraphDesc, InputBuffer, IoRole, IoTensor, OutputBuffer,
};
use ref_backend::{CompiledModel, TensorDesc, TensorRole};
use std::sync::Arc;

/// Converts a reference-backend tensor description into the runtime's.
pub fn io_tensor(t: &TensorDesc) -> IoTensor {
    let role = match t.role {
        TensorRole::InputIds => IoRole::InputIds,
        TensorRole::Positions => IoRole::Positions,
        TensorRole::Mask => IoRole::Mask,
        TensorRole::PastKey => IoRole::PastKey,
        TensorRole::PastValue => IoRole::PastValue,
        TensorRole::NewKey => IoRole::NewKey,
        TensorRole::NewValue => IoRole::NewValue,
        TensorRole::Logits => IoRole::Logits,
        TensorRole::RopeCos => IoRole::RopeCos,
        TensorRole::RopeSin => IoRole::RopeSin,
        TensorRole::HiddenIn => IoRole::HiddenIn,
        TensorRole::HiddenOut => IoRole::HiddenOut,
    };
    IoTensor {
        name: t.name.clone(),
        role,
        layer: t.layer.map(|l| l as usize),
        head: t.head.map(|h| h as usize),
        shape: t.shape.clone(),
        dtype: t.dtype,
        quant: t.quant_spec(),
    }
}

/// Graph descriptions of a compiled model.
pub fn graph_descs(model: &CompiledModel) -> Vec<GraphDesc> {
    model
        .graphs()
        .iter()
        .map(|g| GraphDesc {
            name: g.name().to_string(),
            inputs: g.inputs().iter().map(io_tensor).collect(),
            outputs: g.outputs().iter().map(io_tensor).collect(),
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
