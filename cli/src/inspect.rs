//! `htpkv inspect`: everything a QNN system library reports about a context binary — the binary
//! header, every graph and every tensor — whoever made the binary. Tensor names htpkv does not
//! recognise are shown with the role "—", never refused.

use std::path::PathBuf;

use anyhow::Context as _;
use model::fsio::{FileKind, read_capped};

use qnn_ffi::{BinaryInfo, GraphInfo, Quantization, TensorInfo};
use serde_json::{Value, json};

/// Arguments of `htpkv inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The context binary (from `htpkv compile`, Qualcomm's tools, AI Hub, ExecuTorch, ...).
    file: PathBuf,
    /// QNN system library (else $HTPKV_QNN_SYSTEM, else the libQnnSystem.so of
    /// scripts/fetch-qnn.sh when fetched): `libQnnSystem.so`, or the reference backend's
    /// libhtpkv_ref_qnn.so for htpkv's own binaries.
    #[arg(long)]
    qnn_system: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    // The file first: a device, FIFO or oversized file is refused before any library is loaded.
    let binary = read_capped(&args.file, FileKind::CONTEXT_BINARY)?;
    let fetched = || htpkv::qnn_libs::QnnLibs::fetched().map(|l| l.system());
    let explicit = match args.qnn_system {
        Some(path) => Some(path),
        None if std::env::var_os(qnn_ffi::ENV_SYSTEM).is_some_and(|v| !v.is_empty()) => None,
        None => fetched(),
    };
    let system = qnn_ffi::QnnSystemLibrary::load_from(explicit.as_deref())?;
    let mut ctx = qnn_ffi::SystemContext::new(&system)?;
    let info = ctx
        .binary_info(&binary)
        .with_context(|| format!("QNN cannot read the context binary {}", args.file.display()))?;
    let text = if args.json {
        let mut doc = binary_json(&info);
        doc["file"] = json!(args.file.display().to_string());
        serde_json::to_string_pretty(&doc)? + "\n"
    } else {
        binary_text(&args.file.display().to_string(), &info)
    };
    crate::output::to_stdout(|out| out.write_all(text.as_bytes()))
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_string(), |v| v.to_string())
}

fn quant_text(q: &Quantization) -> String {
    match q {
        Quantization::None => "—".into(),
        Quantization::PerTensor { scale, offset } => format!("scale {scale:e} offset {offset}"),
        Quantization::PerAxis {
            axis,
            scale_offsets,
        } => format!("per-axis {axis} ×{}", scale_offsets.len()),
        Quantization::BlockwiseExpansion {
            axis,
            scale_offsets,
            blocks_per_axis,
            multiplier_bits,
            ..
        } => format!(
            "blockwise expansion {axis} ×{} × {blocks_per_axis} blocks ({multiplier_bits}-bit)",
            scale_offsets.len()
        ),
        Quantization::Unsupported { encoding } => format!("encoding {encoding} (not read)"),
    }
}

fn quant_json(q: &Quantization) -> Value {
    match q {
        Quantization::None => Value::Null,
        Quantization::PerTensor { scale, offset } => json!({"scale": scale, "offset": offset}),
        Quantization::PerAxis {
            axis,
            scale_offsets,
        } => json!({
            "axis": axis,
            "count": scale_offsets.len(),
            "scales": scale_offsets.iter().map(|p| p.0).collect::<Vec<_>>(),
            "offsets": scale_offsets.iter().map(|p| p.1).collect::<Vec<_>>(),
        }),
        Quantization::BlockwiseExpansion {
            axis,
            scale_offsets,
            blocks_per_axis,
            multiplier_bits,
            ..
        } => json!({
            "axis": axis,
            "count": scale_offsets.len(),
            "blocks_per_axis": blocks_per_axis,
            "multiplier_bits": multiplier_bits,
        }),
        Quantization::Unsupported { encoding } => json!({"unsupported_encoding": encoding}),
    }
}

fn tensor_json(t: &TensorInfo, role: &Option<String>) -> Value {
    json!({
        "name": t.name, "id": t.id, "type": format!("{:?}", t.tensor_type),
        "dtype": qnn_ffi::qnn_dtype_name(t.dtype), "dims": t.shape, "quant": quant_json(&t.quant),
        "role": role,
    })
}

use htpkv::qnn::RoleLabels as Labels;

fn tensors_json(list: &[TensorInfo], roles: &[Option<String>]) -> Vec<Value> {
    list.iter()
        .zip(roles)
        .map(|(t, r)| tensor_json(t, r))
        .collect()
}

fn graph_json(g: &GraphInfo, (ins, outs): &Labels) -> Value {
    json!({
        "name": g.name, "graph_info_version": g.info_version,
        "spill_fill_bytes": g.spill_fill_bytes, "updateable_tensors": g.updateable_tensors,
        "op_range": g.op_range,
        "inputs": tensors_json(&g.inputs, ins),
        "outputs": tensors_json(&g.outputs, outs),
    })
}

fn binary_json(info: &BinaryInfo) -> Value {
    json!({
        "binary_info_version": info.info_version,
        "backend_id": info.backend_id,
        "build_id": info.build_id,
        "core_api": info.core_api.to_string(),
        "backend_api": info.backend_api.to_string(),
        "soc_version": info.soc_version,
        "soc_model": info.soc_model,
        "context_blob_version": info.context_blob_version.to_string(),
        "context_blob_bytes": info.context_blob_size,
        "hw_info_blob_version": info.hw_info_blob_version.map(|v| v.to_string()),
        "spill_fill_bytes": info.spill_fill_bytes,
        "context_tensors": info.context_tensors,
        "graphs": info.graphs.iter().zip(htpkv::qnn::role_labels(&info.graphs))
            .map(|(g, labels)| graph_json(g, &labels)).collect::<Vec<_>>(),
    })
}

fn binary_text(file: &str, info: &BinaryInfo) -> String {
    let mut out = format!(
        "{file}: binary info v{}, backend id {} ({:#x}), build {}\n  core API {}, backend API {}, \
         SoC {} (model {}), context blob v{} ({} bytes), spill-fill {}\n{} graphs\n",
        info.info_version,
        info.backend_id,
        info.backend_id,
        opt(info.build_id.as_deref()),
        info.core_api,
        info.backend_api,
        opt(info.soc_version.as_deref()),
        opt(info.soc_model),
        info.context_blob_version,
        info.context_blob_size,
        opt(info.spill_fill_bytes),
        info.graphs.len()
    );
    for (g, (ins, outs)) in info
        .graphs
        .iter()
        .zip(htpkv::qnn::role_labels(&info.graphs))
    {
        out += &format!(
            "graph {} (graph info v{}, spill-fill {})\n",
            g.name,
            g.info_version,
            opt(g.spill_fill_bytes.map(|b| format!("{b} bytes")))
        );
        for (dir, list, roles) in [("in ", &g.inputs, &ins), ("out", &g.outputs, &outs)] {
            for (t, role) in list.iter().zip(roles) {
                out += &format!(
                    "  {dir} {:>4} {:<24} {:<9} {:<20} {:<28} {}\n",
                    t.id,
                    t.name,
                    qnn_ffi::qnn_dtype_name(t.dtype),
                    format!("{:?}", t.shape),
                    quant_text(&t.quant),
                    opt(role.as_deref()),
                );
            }
        }
    }
    out
}
