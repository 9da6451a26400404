//! `htpkv compile --target htp`: the model lowered into QNN graphs by Qualcomm's HTP backend
//! library and written as a genuine context binary (`qnn_compile`), verified before it replaces
//! `--out` by listing its graphs through the QNN system library beside the backend.

use super::CompileArgs;
use super::bundle::{check_bundle_out, genie_config};
use anyhow::{Context, bail};
use htpkv::engine::{DEFAULT_MAX_CONTEXT, OpenedModel};
use model::fsio::AtomicDir;
use model::fsio::{FileKind, check_output, read_capped, write_atomic_verified};
use qnn_compile::{Fixed, HtpOptions, HtpTarget, KvEncodings, Naming, graph_name};
use qnn_ffi::dtype_to_qnn;
use qnn_ffi::{QnnLibrary, QnnSystemLibrary, SystemContext};
use quant::DataType;
use quant::Encoding;
use ref_backend::WeightType;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of the reference target that the HTP lowering does not take (yet), refused by name.
fn refuse_reference_only(args: &CompileArgs) -> anyhow::Result<()> {
    let mut bad = Vec::new();
    if args.kv_dtype == Some(DataType::F16) {
        bad.push("--kv-dtype f16 (u8, u16 or f32)");
    }
    if args.kv_dtype.is_some_and(|d| d != DataType::F32) && args.convention == Naming::AiHub {
        bad.push("--kv-dtype u8/u16 with --convention aihub (fixed-point K/V: htpkv's convention)");
    }
    if args.weights.is_some_and(|w| w != WeightType::F32) {
        bad.push("--weights (the HTP lowering's weights are f32, run in fp16)");
    }
    if args.parts.is_some_and(|p| p != 1) || !args.contexts.is_empty() {
        bad.push("--parts/--contexts (one binary, one context length)");
    }
    if args.convention == Naming::ExecuTorch {
        bad.push("--convention executorch (htpkv or aihub)");
    }
    if args.kv_zero_point.is_some() || !args.layer_window.is_empty() {
        bad.push("--kv-zero-point/--layer-window");
    }
    if args.calibration_prompts.is_some() {
        bad.push("--calibration-prompts (a float graph needs no calibration)");
    }
    if args.tokenizer_json.is_some() && args.convention != Naming::AiHub {
        bad.push("--tokenizer-json (for an aihub bundle)");
    }
    if bad.is_empty() {
        return Ok(());
    }
    bail!("--target htp does not take {}", bad.join(", "))
}

/// The backend library: `--qnn-backend`, `$HTPKV_QNN_BACKEND`, or the fetched one.
fn backend_path(args: &CompileArgs) -> anyhow::Result<PathBuf> {
    htpkv::qnn_libs::backend_library(args.qnn_backend.as_deref()).context(
        "--target htp needs Qualcomm's libQnnHtp.so: run scripts/fetch-qnn.sh, or pass \
             --qnn-backend PATH (or set $HTPKV_QNN_BACKEND)",
    )
}

/// Checks that `file` is a context binary the system library beside `backend` lists with every
/// graph of `names`.
fn verify(backend: &Path, file: &Path, names: &[String]) -> Result<(), String> {
    let system = backend.with_file_name("libQnnSystem.so");
    let lib = QnnSystemLibrary::load(&system).map_err(|e| e.to_string())?;
    let bytes = read_capped(file, FileKind::CONTEXT_BINARY).map_err(|e| e.to_string())?;
    let info = SystemContext::new(&lib)
        .and_then(|mut s| s.binary_info(&bytes))
        .map_err(|e| format!("{}: {e}", system.display()))?;
    for n in names {
        info.graph(n)
            .map_err(|_| format!("{} does not list graph `{n}`", system.display()))?;
    }
    Ok(())
}

/// `htpkv compile --target htp`: one binary (`--convention htpkv`), or a Genie bundle of one part
/// (`--convention aihub`: the binary, `genie_config.json` and `tokenizer.json` in `--out`).
pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    refuse_reference_only(args)?;
    let opened = OpenedModel::open(args.model.as_deref())?;
    // Every file of the model (a Hugging Face folder's files, not the folder).
    let mut inputs: Vec<&Path> = opened.inputs.iter().map(PathBuf::as_path).collect();
    inputs.extend(args.tokenizer.as_deref());
    inputs.extend(args.tokenizer_json.as_deref());
    let naming = args.convention;
    // Refused before any work; checked again when written.
    // An AI Hub compile writes a Genie bundle with its tokenizer; any other, one file.
    let tokenizer = if naming == Naming::AiHub {
        check_bundle_out(&args.out, &inputs)?;
        Some(super::bundle_tokenizer(args, &opened.path)?)
    } else {
        check_output(&args.out, &inputs)?;
        None
    };
    let context = args
        .context
        .unwrap_or(opened.config.context_length.min(DEFAULT_MAX_CONTEXT));
    let backend = backend_path(args)?;
    let lib = QnnLibrary::load(&backend)?;
    let opts = HtpOptions {
        context,
        ar: args.ar.clone(),
        target: HtpTarget {
            soc_model: args.soc_model,
            arch: args.htp_arch,
        },
        naming,
        kv: None,
    };
    let started = Instant::now();
    let opts = HtpOptions {
        kv: kv_encodings(args, &opened, context)?,
        ..opts
    };
    let binary = opened.with_weights(|w| {
        qnn_compile::compile(&lib, &opened.config, w, &opts, &mut |g, done, total| {
            eprintln!(
                "prepared graph {g} ({done}/{total}) in {:.1?}",
                started.elapsed()
            )
        })
    })??;
    let names: Vec<String> = (args.ar.iter())
        .map(|&n| graph_name(naming, n, context))
        .collect();
    let written = match &tokenizer {
        None => {
            write_atomic_verified(&args.out, &binary, &inputs, &mut |tmp| {
                verify(&backend, tmp, &names).map_err(Into::into)
            })?;
            args.out.clone()
        }
        Some(tok) => write_bundle(
            args,
            &opened,
            context,
            (&binary, tok),
            &inputs,
            &mut |tmp| verify(&backend, tmp, &names),
        )?,
    };
    crate::output::to_stdout(|out| {
        writeln!(
            out,
            "wrote {} ({} bytes) in {:.2?}: a QNN context binary from {} with graphs {}",
            written.display(),
            binary.len(),
            started.elapsed(),
            backend.display(),
            names.join(", ")
        )
    })
}

/// The Genie bundle of one part in `args.out`, written whole (a temporary directory renamed into
/// place); the binary is verified before it counts. Returns the binary's path.
fn write_bundle(
    args: &CompileArgs,
    opened: &OpenedModel,
    context: usize,
    (binary, tokenizer): (&[u8], &[u8]),
    inputs: &[&Path],
    verify: &mut dyn FnMut(&Path) -> Result<(), String>,
) -> anyhow::Result<PathBuf> {
    let stem = opened
        .path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let name = format!("{stem}_part_1_of_1.bin");
    let out = AtomicDir::create(&args.out, inputs)?;
    out.write(&name, binary)?;
    verify(&out.path_of(&name)).map_err(|e| anyhow::anyhow!("verifying {name}: {e}"))?;
    out.write("tokenizer.json", tokenizer)?;
    let config = genie_config(&opened.config, context, std::slice::from_ref(&name));
    let text = serde_json::to_string_pretty(&config)?;
    out.write("genie_config.json", text.as_bytes())?;
    out.commit()?;
    Ok(args.out.join(name))
}

/// With `--kv-dtype u8|u16`: htpkv's calibrated K/V encodings, one per (layer, KV head) shared by
/// the past and new tensors, exactly as the reference executor and the KV manager use them
/// (calibration by the f32 forward over the built-in prompts, as `compile` does).
fn kv_encodings(
    args: &CompileArgs,
    opened: &OpenedModel,
    context: usize,
) -> anyhow::Result<KvEncodings> {
    let dtype = match args.kv_dtype {
        Some(d @ (DataType::U8 | DataType::U16)) => d,
        _ => return Ok(None),
    };
    let mut opts = super::compile_options(args, context);
    opts.weights = WeightType::F32;
    let calibration = htpkv::engine::calibration_sequences(&*opened.codec, &opened.chat)?;
    eprintln!("calibrating the {dtype} K/V encodings ...");
    let model = opened.compile(&opts, &calibration, &mut |_| {})?;
    let c = &opened.config;
    let fixed = |l: usize, h: usize, value: bool| -> anyhow::Result<Fixed> {
        match model.kv_spec(l, h, value).map(|s| (s.dtype, &s.encoding)) {
            Some((d, Encoding::PerTensor(so))) => Ok(Fixed {
                dtype: dtype_to_qnn(d),
                scale: so.scale,
                offset: so.offset,
            }),
            other => anyhow::bail!("layer {l} head {h}: no per-tensor K/V encoding ({other:?})"),
        }
    };
    let mut v = Vec::with_capacity(c.n_layers * c.n_kv_heads);
    for l in 0..c.n_layers {
        for h in 0..c.n_kv_heads {
            v.push((fixed(l, h, false)?, fixed(l, h, true)?));
        }
    }
    Ok(Some(v))
}
