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
//! Precision: the graphs' inputs and outputs are f32 (the mask additive in f32), HTP computes in
//! fp16 ([`Precision::Fp16`]) between the quantized pieces, and two things are quantized with
//! htpkv's own calibrated encodings:
//! * K/V ([`KvEncodings`]): u8/u16 inputs and outputs in exactly the encodings the KV manager
//!   holds, past and new rows of a head sharing one (no requantization);
//! * weights ([`W8A16`]): every matrix product reads u16 activations and the reference
//!   executor's per-channel i8 weights and writes u16 ([`w8a16`]); or f32 weights.

#![forbid(unsafe_code)]

pub mod calibrate;
pub mod emit;
mod encoding;
pub mod llama;
pub mod w8a16;

use emit::Emitter;
pub use encoding::Fixed;
use graph_io::LogitRows;
pub use llama::{KvEncodings, Naming, PartSpec, RopeTable, rope_table};
use model::{LlamaConfig, WeightSource};
pub use qnn_ffi::HtpTarget;
use qnn_ffi::{
    Backend, Context, Device, GraphBuilder, GraphOptions, Log, LogLevel, Precision, QnnError,
    QnnLibrary,
};
use std::sync::Arc;
pub use w8a16::{W8A16, W8Matrix};

/// Errors of [`compile`].
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The options cannot describe graphs of this model.
    #[error("{0}")]
    Options(String),
    /// The model's description holds a property the HTP lowering does not build yet (named in
    /// the message); the reference target runs it.
    #[error("the HTP lowering does not build this model yet: {0}")]
    Unsupported(String),
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
    /// AR variants (tokens per step), one graph each returning every row's logits.
    pub ar: Vec<usize>,
    /// Whether each AR variant n > 1 also gets a prefill graph returning only the last row's
    /// logits (the graph set is [`graph_io::graph_set`]'s), where the convention allows it.
    pub last_row: bool,
    /// SoC model and HTP architecture to prepare for.
    pub target: HtpTarget,
    /// The graphs' IO convention.
    pub naming: Naming,
    /// Fixed-point K/V encodings (htpkv's convention), or f32 K/V.
    pub kv: KvEncodings,
    /// W8A16 matrix products ([`w8a16`]), or float weights.
    pub weights: Option<Arc<W8A16>>,
    /// The parts, in order, covering every layer ([`PartSpec::whole`] for one binary).
    pub parts: Vec<PartSpec>,
}

/// The graph name of AR-`n` at context `s` in `part`, written by the naming's convention:
/// `ar{n}_cl{s}` (htpkv), or AI Hub's `{token|prompt}_ar{n}_cl{s}_{i}_of_{N}`.
pub fn graph_name(naming: Naming, n: usize, s: usize, part: &PartSpec) -> String {
    let part = graph_io::PartOf {
        index: part.index,
        count: part.count,
    };
    naming.graph_name(n, s, part)
}

/// The graphs `o` compiles for `part`, in order: AR, logit rows and name (the graph set is
/// [`graph_io::graph_set`]'s; a last-row graph is named by [`LogitRows::graph_name`]).
pub fn graphs(o: &HtpOptions, part: &PartSpec) -> Vec<(usize, LogitRows, String)> {
    let set = graph_io::graph_set(&o.ar, o.last_row).into_iter();
    set.map(|(n, rows)| {
        let name = rows.graph_name(graph_name(o.naming, n, o.context, part));
        (n, rows, name)
    })
    .collect()
}

/// Why `parts` cannot be the parts of a model of `n_layers` layers in `naming` (`None`: they can).
fn parts_refusal(parts: &[PartSpec], n_layers: usize, naming: Naming) -> Option<String> {
    if parts.len() > 1 && !naming.convention().names_parts() {
        return Some(format!(
            "several parts need a convention whose graph names carry the part ({} names none)",
            naming.name()
        ));
    }
    let mut next = 0;
    for (i, p) in parts.iter().enumerate() {
        let first = i == 0;
        let last = i + 1 == parts.len();
        if p.index != i || p.count != parts.len() || p.layers.start != next {
            return Some(format!(
                "part {} is not part {} of {} from layer {next}",
                p.index + 1,
                i + 1,
                parts.len()
            ));
        }
        if first != p.hidden_in.is_none() || last != p.hidden_out.is_none() {
            return Some(format!(
                "part {} of {}: only the first takes token ids, only the last gives logits",
                i + 1,
                parts.len()
            ));
        }
        next = p.layers.end;
    }
    (next != n_layers || parts.is_empty())
        .then(|| format!("the parts run layers 0..{next}, the model has {n_layers}"))
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
    let convention = o.naming.convention();
    if let Some(why) = o.last_row.then(|| convention.last_row_refusal()).flatten() {
        return bad(why);
    }
    if let graph_io::IoRules::ByIndex(_) = convention.io {
        return bad(format!(
            "the {} convention finds its IO by position and is not lowered to QNN operations",
            convention.name
        ));
    }
    if let Some(why) = llama::layout_refusal(convention.layout) {
        return bad(why);
    }
    if let Some(why) = llama::model_refusal(c, convention.layout) {
        return Err(CompileError::Unsupported(why));
    }
    if let Some(kv) = &o.kv {
        let per_layer = |l: usize| &kv[l * c.n_kv_heads..(l + 1) * c.n_kv_heads];
        if convention.layout.kv == graph_io::Granularity::PerLayer
            && kv.len() == c.n_layers * c.n_kv_heads
            && let Some(l) =
                (0..c.n_layers).find(|&l| per_layer(l).iter().any(|e| *e != kv[l * c.n_kv_heads]))
        {
            return bad(format!(
                "AI Hub's K/V tensors hold a whole layer: the heads of layer {l} need one encoding"
            ));
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
    if let Some(reason) = parts_refusal(&o.parts, c.n_layers, o.naming) {
        return bad(reason);
    }
    Ok(())
}

/// Compiles every AR variant of every part of `o` on `lib` and returns one context binary per
/// part; `progress(graph, done, total)` is called as each graph is finalized.
pub fn compile(
    lib: &Arc<QnnLibrary>,
    c: &LlamaConfig,
    w: &dyn WeightSource,
    o: &HtpOptions,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<Vec<u8>>, CompileError> {
    // The description as a graph of this context runs it (LongRoPE's factors for the context).
    let bound = c.clone().for_context(o.context);
    let c = &bound;
    check(c, o)?;
    // The backend's messages through htpkv's log (errors and warnings on stderr, the rest
    // recorded), not printed by the library itself.
    let log = Log::new(lib, LogLevel::Warn).map_err(qnn_error(lib, ""))?;
    let backend = Backend::new(lib, Some(&log)).map_err(qnn_error(lib, ""))?;
    let device = Device::with_htp_target(&backend, o.target).map_err(qnn_error(lib, ""))?;
    let per_part = graph_io::graph_set(&o.ar, o.last_row).len();
    let total = o.parts.len() * per_part;
    let mut binaries = Vec::with_capacity(o.parts.len());
    for part in &o.parts {
        let context = Context::create(&backend, device.as_ref()).map_err(qnn_error(lib, ""))?;
        for (i, (n, rows, name)) in graphs(o, part).into_iter().enumerate() {
            compile_graph(&context, c, w, o, (n, rows, part), &name)?;
            progress(&name, binaries.len() * per_part + i + 1, total);
        }
        binaries.push(context.binary().map_err(qnn_error(lib, ""))?);
    }
    Ok(binaries)
}

/// Composes and finalizes the AR-`n` graph `name` of `part` in `context`.
fn compile_graph(
    context: &Arc<Context>,
    c: &LlamaConfig,
    w: &dyn WeightSource,
    o: &HtpOptions,
    (n, rows, part): (usize, LogitRows, &PartSpec),
    name: &str,
) -> Result<(), CompileError> {
    let lib = context.backend().library();
    let options = GraphOptions {
        precision: Precision::Fp16,
        optimization: None,
    };
    let g = GraphBuilder::new(context, name, options).map_err(qnn_error(lib, name))?;
    let step = llama::Step {
        n,
        rows,
        context: o.context,
        naming: o.naming,
        part,
    };
    let w8 = o.weights.as_deref();
    let e =
        llama::emit_step(c, w, Emitter::new(g), step, &o.kv, w8).map_err(qnn_error(lib, name))?;
    e.into_graph().finalize().map_err(qnn_error(lib, name))
}

/// Wraps a QNN error of `graph` on `lib`.
fn qnn_error(lib: &Arc<QnnLibrary>, graph: &str) -> impl FnOnce(QnnError) -> CompileError {
    let (graph, library) = (graph.to_string(), lib.path().to_path_buf());
    move |source| CompileError::Qnn {
        graph,
        library,
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: usize, count: usize, layers: std::ops::Range<usize>) -> PartSpec {
        PartSpec {
            index,
            count,
            layers,
            hidden_in: (index > 0).then(|| format!("h{index}")),
            hidden_out: (index + 1 < count).then(|| format!("h{}", index + 1)),
        }
    }

    #[test]
    fn parts_must_cover_every_layer_in_order() {
        let ok = [part(0, 3, 0..0), part(1, 3, 0..3), part(2, 3, 3..5)];
        assert_eq!(parts_refusal(&ok, 5, Naming::AiHub), None);
        let gap = [part(0, 2, 0..2), part(1, 2, 3..5)];
        assert!(parts_refusal(&gap, 5, Naming::AiHub).is_some());
        let short = [part(0, 2, 0..2), part(1, 2, 2..4)];
        assert!(parts_refusal(&short, 5, Naming::AiHub).is_some());
        let mut no_ids = ok.clone();
        no_ids[0].hidden_in = Some("x".into());
        assert!(parts_refusal(&no_ids, 5, Naming::AiHub).is_some());
        assert!(parts_refusal(&[], 5, Naming::AiHub).is_some());
    }

    #[test]
    fn the_lowering_builds_the_layouts_of_the_conventions_and_refuses_others() {
        use graph_io::{Granularity, GraphLayout, KLayout, PositionInput};
        for p in [Naming::Htpkv, Naming::AiHub] {
            assert_eq!(llama::layout_refusal(p.convention().layout), None, "{p}");
        }
        let mixed = GraphLayout {
            positions: PositionInput::RopeTables,
            ..GraphLayout::HTPKV
        };
        let why = llama::layout_refusal(mixed).unwrap();
        assert!(
            why.contains("per_head K/V with rows keys and rope_tables"),
            "{why}"
        );
        let odd = GraphLayout {
            keys: KLayout::Transposed,
            ..GraphLayout::HTPKV
        };
        assert!(llama::layout_refusal(odd).is_some());
        let odd = GraphLayout {
            kv: Granularity::PerLayer,
            ..GraphLayout::HTPKV
        };
        assert!(llama::layout_refusal(odd).is_some());
    }

    fn gemma_like(theta: f32, window_theta: f32) -> LlamaConfig {
        LlamaConfig {
            n_layers: 6,
            dim: 64,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 32,
            hidden_dim: 128,
            vocab_size: 32,
            context_length: 64,
            rms_eps: 1e-6,
            rope: model::RopeConfig {
                theta,
                window_theta: Some(window_theta),
                ..model::RopeConfig::default()
            },
            tied_output: true,
            block: model::Block::default(),
            embed_scale: None,
            final_softcap: None,
            special: model::SpecialTokens::default(),
            layer_windows: vec![Some(8); 6],
        }
    }

    /// Gemma 3's two bases (1e6 global, 1e4 window) in one table: the columns each layer reads
    /// hold, at every position, the angles `model::ops::Rope` (the forward's rotation) gives
    /// that layer, under the frequencies Genie and htpkv's runtime compute for a table of
    /// `rope-dim` columns and base `rope-theta` (`theta^(-k / dim)`).
    #[test]
    fn one_rope_table_carries_both_of_gemmas_bases() {
        let c = gemma_like(1e6, 1e4);
        let t = llama::rope_table(&c).unwrap();
        assert_eq!((t.global_step, t.window_step, t.dim), (3, 2, 46));
        let rope = model::ops::Rope::new(c.head_dim, &c.rope);
        for (windowed, step) in [(false, t.global_step), (true, t.window_step)] {
            for (i, &f) in rope.layer_frequencies(windowed).iter().enumerate() {
                let k = (step * i) as f64;
                let table = t.theta.powf(-k / t.dim as f64);
                let rel = (table - f64::from(f)).abs() / f64::from(f);
                assert!(rel < 1e-6, "windowed {windowed} pair {i}: {table} vs {f}");
            }
        }
        assert_eq!(
            llama::model_refusal(&c, Naming::AiHub.convention().layout),
            None
        );
    }

    /// Bases one table cannot carry are refused naming the property, not the family.
    #[test]
    fn bases_of_no_common_power_are_refused_by_property() {
        let c = gemma_like(1e6, 12345.0);
        let why = llama::model_refusal(&c, Naming::AiHub.convention().layout).unwrap();
        assert!(why.contains("rope.window_theta 12345"), "{why}");
        assert!(why.contains("not powers"), "{why}");
        assert!(!why.to_lowercase().contains("gemma"), "{why}");
        assert_eq!(
            llama::model_refusal(&c, Naming::Htpkv.convention().layout),
            None
        );
    }

    #[test]
    fn several_parts_need_ai_hubs_names() {
        let two = [part(0, 2, 0..2), part(1, 2, 2..5)];
        let why = parts_refusal(&two, 5, Naming::Htpkv).unwrap();
        assert!(why.contains("carry the part"), "{why}");
        assert_eq!(parts_refusal(&[PartSpec::whole(5)], 5, Naming::Htpkv), None);
    }

    #[test]
    fn graph_names_carry_the_part_in_ai_hubs_convention() {
        let p = part(1, 3, 0..3);
        assert_eq!(
            graph_name(Naming::AiHub, 1, 64, &p),
            "token_ar1_cl64_2_of_3"
        );
        assert_eq!(
            graph_name(Naming::AiHub, 8, 64, &p),
            "prompt_ar8_cl64_2_of_3"
        );
        assert_eq!(graph_name(Naming::Htpkv, 8, 64, &p), "ar8_cl64");
    }
}
