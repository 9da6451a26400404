//! `htpkv inspect`: list the graphs and IO tensors of a context binary, as a QNN system library
//! reports them.

use htpkv::backend::IoDType;
use std::path::PathBuf;

/// Arguments of `htpkv inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The context binary (e.g. a file written by `htpkv compile`).
    file: PathBuf,
    /// QNN system library (else $HTPKV_QNN_SYSTEM; the reference backend's libhtpkv_ref_qnn.so
    /// serves as one).
    #[arg(long)]
    qnn_system: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let system = qnn_ffi::QnnSystemLibrary::load_from(args.qnn_system.as_deref())?;
    let binary = std::fs::read(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let graphs = htpkv::qnn::binary_graphs(&system, &binary)?;
    if args.json {
        let doc: Vec<_> = graphs
            .iter()
            .map(|(g, info)| {
                let tensors = |list: &[qnn_ffi::TensorInfo]| -> Vec<serde_json::Value> {
                    list.iter()
                        .map(|t| {
                            serde_json::json!({
                                "name": t.name, "shape": t.shape, "dtype": t.dtype.name(),
                                "quant": format!("{:?}", t.quant),
                            })
                        })
                        .collect()
                };
                serde_json::json!({
                    "graph": g.name, "ar": g.ar(),
                    "inputs": tensors(&info.inputs), "outputs": tensors(&info.outputs),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{} ({} graphs)", args.file.display(), graphs.len());
    for (g, _) in &graphs {
        println!("graph {} (AR-{})", g.name, g.ar().unwrap_or(0));
        for (dir, list) in [("in ", &g.inputs), ("out", &g.outputs)] {
            for t in list {
                let dtype = match t.dtype {
                    IoDType::I32 => "i32".to_string(),
                    IoDType::Quant(d) => d.name().to_string(),
                };
                let enc = match t.quant.as_ref().map(|q| &q.encoding) {
                    Some(quant::Encoding::PerTensor(so)) => {
                        format!("scale {:e} offset {}", so.scale, so.offset)
                    }
                    Some(quant::Encoding::PerAxis { axis, params }) => {
                        format!("per-axis {axis} ({} encodings)", params.len())
                    }
                    _ => String::new(),
                };
                println!(
                    "  {dir} {:<18} {:<18} {:<4} {enc}",
                    t.name,
                    format!("{:?}", t.shape),
                    dtype
                );
            }
        }
    }
    Ok(())
}
