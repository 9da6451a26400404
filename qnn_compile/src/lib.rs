//! `qnn_compile`: a Llama-family model lowered into QNN graphs through a QNN backend library and
//! serialized as a genuine context binary.
//!
//! [`compile`] loads nothing itself: it takes a loaded backend library (Qualcomm's `libQnnHtp.so`,
//! which on x86_64 Linux prepares HTP graphs in emulation), the model description and its weights,
//! makes an empty context on a device configured for the [`HtpTarget`], composes one graph per AR
//! variant (named `ar{n}_cl{S}`, htpkv's IO convention: see [`llama`]), finalizes each (HTP
//! preparation) and returns the context binary. `htpkv generate --backend qnn --compiled FILE` then
//! runs it with htpkv's KV manager feeding the K/V tensors.
//!
//! This first lowering is **float**: f32 inputs and outputs (K/V in f32, the mask additive in f32),
//! f32 weights as static tensors, and HTP computing in fp16 ([`Precision::Fp16`]). The quantized
//! lowering (u16 activations, per-channel i8 weights, the KV manager's u8/u16 encodings on the K/V
//! tensors) is the next step.

#![forbid(unsafe_code)]

mod emit;
pub mod llama;

use emit::Emitter;
pub use emit::Fixed;
pub use llama::{KvEncodings, Naming};
use model::{LlamaConfig, WeightSource};
pub use qnn_ffi::HtpTarget;
use qnn_ffi::{
    Backend, Context, Device, GraphBuilder, GraphOptions, Precision, QnnError, QnnLibrary,
};
use std::sync::Arc;

/// Errors of [`compile`].
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The options cannot describe graphs of this model.
    #[error("{0}")]
    Options(String),
    /// The backend refused a step (the graph and the QNN call are in the source).
    #[error("graph `{graph}`: the QNN backend {}", library.display())]
    Qnn {
        /// The graph being built.
        graph: String,
        /// The backend library.
        library: std::path::PathBuf,
        /// What the backend said.
        #[source]
        source: Box<QnnError>,
    },
}

/// What to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct HtpOptions {
    /// Context length S.
    pub context: usize,
    /// AR variants (tokens per step), one graph each.
    pub ar: Vec<usize>,
    /// SoC model and HTP architecture to prepare for.
    pub target: HtpTarget,
    /// The graphs' IO convention.
    pub naming: Naming,
    /// Fixed-point K/V encodings (htpkv's convention), or f32 K/V.
    pub kv: KvEncodings,
}

/// The graph name of AR-`n` at context `s`, written by the naming's convention: `ar{n}_cl{s}`
/// (htpkv), or AI Hub's `{token|prompt}_ar{n}_cl{s}_1_of_1` (one part).
pub fn graph_name(naming: Naming, n: usize, s: usize) -> String {
    naming.graph_name(n, s, graph_io::PartOf::default())
}

fn check(c: &LlamaConfig, o: &HtpOptions) -> Result<(), CompileError> {
    let bad = |m: String| Err(CompileError::Options(m));
    if o.ar.is_empty() {
        return bad("no AR variant given".into());
    }
    if let Some(&n) = o.ar.iter().find(|&&n| n == 0 || n >= o.context) {
        return bad(format!("AR-{n} does not fit context {}", o.context));
    }
    if o.context > c.context_length {
        return bad(format!(
            "context {} is longer than the model's {}",
            o.context, c.context_length
        ));
    }
    if o.naming == Naming::ExecuTorch {
        return bad("the executorch convention is not lowered to QNN operations".into());
    }
    if let Some(kv) = &o.kv {
        if o.naming != Naming::Htpkv {
            return bad("fixed-point K/V are lowered in htpkv's convention only (for now)".into());
        }
        if kv.len() != c.n_layers * c.n_kv_heads {
            return bad(format!(
                "{} K/V encodings for {} layers x {} KV heads",
                kv.len(),
                c.n_layers,
                c.n_kv_heads
            ));
        }
    }
    if c.layer_windows.iter().any(Option::is_some) {
        return bad("per-layer attention windows are not lowered to QNN yet".into());
    }
    Ok(())
}

/// Compiles every AR variant of `o` into one context on `lib` and returns its context binary;
/// `progress(graph, done, total)` is called as each graph is finalized.
pub fn compile(
    lib: &Arc<QnnLibrary>,
    c: &LlamaConfig,
    w: &dyn WeightSource,
    o: &HtpOptions,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<u8>, CompileError> {
    check(c, o)?;
    let qnn = |graph: &str| {
        let (graph, library) = (graph.to_string(), lib.path().to_path_buf());
        move |source| CompileError::Qnn {
            graph,
            library,
            source: Box::new(source),
        }
    };
    let backend = Backend::new(lib, None).map_err(qnn(""))?;
    let device = Device::with_htp_target(&backend, o.target).map_err(qnn(""))?;
    let context = Context::create(&backend, device.as_ref()).map_err(qnn(""))?;
    let options = GraphOptions {
        precision: Precision::Fp16,
        optimization: None,
    };
    for (i, &n) in o.ar.iter().enumerate() {
        let name = graph_name(o.naming, n, o.context);
        let g = GraphBuilder::new(&context, &name, options).map_err(qnn(&name))?;
        let step = llama::Step {
            n,
            context: o.context,
            naming: o.naming,
        };
        let e = llama::emit_step(c, w, Emitter::new(g), step, &o.kv).map_err(qnn(&name))?;
        e.into_graph().finalize().map_err(qnn(&name))?;
        progress(&name, i + 1, o.ar.len());
    }
    context.binary().map_err(qnn(""))
}
