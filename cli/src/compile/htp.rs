//! `htpkv compile --target htp`: the model lowered into QNN graphs by Qualcomm's HTP backend
//! library and written as a genuine context binary (`qnn_compile`), verified before it replaces
//! `--out` by listing its graphs through the QNN system library beside the backend.

use super::CompileArgs;
use super::bundle::{check_bundle_out, genie_config};
use anyhow::{Context, bail};
use htpkv::engine::{DEFAULT_MAX_CONTEXT, OpenedModel};
use model::fsio::AtomicDir;
use model::fsio::{FileKind, check_output, read_capped, write_atomic_verified};
use model::{LlamaConfig, Tensor, WeightSource};
use qnn_compile::w8a16::{BlockMultipliers, output_encoding, u16_from_i16};
use qnn_compile::{Fixed, HtpOptions, HtpTarget, KvEncodings, Naming, PartSpec, W8A16, W8Matrix};
use qnn_ffi::dtype_to_qnn;
use qnn_ffi::{QnnLibrary, QnnSystemLibrary, SystemContext};
use quant::DataType;
use quant::{Encoding, ScaleOffset};
use ref_backend::{CompiledModel, Granularity, Packaging, WeightType};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Options of the reference target that the HTP lowering does not take (yet), refused by name.
fn refuse_reference_only(args: &CompileArgs) -> anyhow::Result<()> {
    let mut bad = Vec::new();
    if args.kv_dtype == Some(DataType::F16) {
        bad.push("--kv-dtype f16 (u8, u16 or f32)");
    }
    if args.weights.is_some_and(|w| w == WeightType::F16) {
        bad.push("--weights f16 (f32, run in fp16, or i8: W8A16)");
    }
    let c = args.convention();
    let bundle = c.packaging == Packaging::GenieBundle;
    let parts_in = Naming::default().parts_naming();
    let parts_in = parts_in.map_or("a bundle".into(), |p| p.name());
    let parts_msg = format!("--parts without --convention {parts_in} (parts are Genie bundles)");
    if args.parts.is_some_and(|p| p != 1) && !bundle {
        bad.push(&parts_msg);
    }
    if !args.contexts.is_empty() {
        bad.push("--contexts (one context length)");
    }
    let by_index = format!("--convention {} (its IO goes by position)", c.name);
    if c.io_by_index() {
        bad.push(&by_index);
    }
    let layout = (args.granularity(), args.k_layout());
    if layout != (c.layout.kv, c.layout.keys) {
        bad.push(
            "--k-layout/--granularity other than the convention's (the lowering builds its layout)",
        );
    }
    if args.kv_zero_point.is_some() || !args.layer_window.is_empty() {
        bad.push("--kv-zero-point/--layer-window");
    }
    if args.calibration_prompts.is_some() && reference_options(args, 2).is_none() {
        bad.push("--calibration-prompts without --kv-dtype u8/u16 or --weights i8/i4 (nothing to calibrate)");
    }
    if args.tokenizer_json.is_some() && !bundle {
        bad.push("--tokenizer-json (for a Genie bundle)");
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
    let opened = OpenedModel::open(args.model.as_deref(), args.tokenizer.as_deref())?;
    // Every file of the model (a Hugging Face folder's files, not the folder; a llama2.c
    // checkpoint's tokenizer, `--tokenizer` or found beside it).
    let mut inputs: Vec<&Path> = opened.inputs.iter().map(PathBuf::as_path).collect();
    inputs.extend(args.tokenizer_json.as_deref());
    let naming = args.convention;
    // Refused before any work; checked again when written.
    // A convention packaged as a Genie bundle writes one with its tokenizer; any other, one file.
    let tokenizer = if args.convention().packaging == Packaging::GenieBundle {
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
        last_row: args.last_row(),
        target: HtpTarget {
            soc_model: args.soc_model,
            arch: args.htp_arch,
        },
        naming,
        kv: None,
        weights: None,
        parts: parts(args, opened.config.n_layers)?,
    };
    let started = Instant::now();
    let reference = calibrated(args, &opened, context)?;
    let opts = HtpOptions {
        kv: kv_encodings(reference.as_ref(), &opened.config, naming)?,
        ..opts
    };
    let binaries = opened.with_weights(|w| -> anyhow::Result<Vec<Vec<u8>>> {
        let opts = HtpOptions {
            weights: w8a16(reference.as_ref(), &opened.config, w, context)?.map(Arc::new),
            ..opts.clone()
        };
        let binaries =
            qnn_compile::compile(&lib, &opened.config, w, &opts, &mut |g, done, total| {
                eprintln!(
                    "prepared graph {g} ({done}/{total}) in {:.1?}",
                    started.elapsed()
                )
            })?;
        Ok(binaries)
    })??;
    let names = |p: &PartSpec| -> Vec<String> {
        (qnn_compile::graphs(&opts, p).into_iter())
            .map(|(_, _, name)| name)
            .collect()
    };
    let written = match &tokenizer {
        None => {
            let names = names(&opts.parts[0]);
            write_atomic_verified(&args.out, &binaries[0], &inputs, &mut |tmp| {
                verify(&backend, tmp, &names).map_err(Into::into)
            })?;
            vec![args.out.clone()]
        }
        Some(tok) => {
            let files: Vec<_> = binaries.iter().zip(&opts.parts).collect();
            write_bundle(
                args,
                &opened,
                context,
                (&files, tok),
                &inputs,
                &mut |tmp, p| verify(&backend, tmp, &names(p)),
            )?
        }
    };
    let all: Vec<String> = opts.parts.iter().flat_map(names).collect();
    crate::output::to_stdout(|out| {
        let bytes: usize = binaries.iter().map(Vec::len).sum();
        let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        writeln!(
            out,
            "wrote {} ({bytes} bytes) in {:.2?}: QNN context binaries from {} with graphs {}",
            files.join(", "),
            started.elapsed(),
            backend.display(),
            all.join(", ")
        )
    })
}

/// The parts `--parts N [--split aihub|balanced]` cut the model into (a convention packaged as a
/// Genie bundle, refused otherwise before), or the whole model.
fn parts(args: &CompileArgs, n_layers: usize) -> anyhow::Result<Vec<PartSpec>> {
    let Some(count) = args.parts else {
        return Ok(vec![PartSpec::whole(n_layers)]);
    };
    let (tables, split) = (args.rope_tables(), args.split());
    let parts = ref_backend::Part::split_as(n_layers, count, tables, args.naming()?, split)
        .map_err(|reason| anyhow::anyhow!("--parts: {reason}"))?;
    Ok(parts
        .iter()
        .map(|p| PartSpec {
            index: p.index,
            count: p.count,
            layers: p.layers.clone(),
            hidden_in: (!p.is_first()).then(|| p.hidden_in_name()),
            hidden_out: (!p.is_last()).then(|| p.hidden_out_name()),
        })
        .collect())
}

/// The Genie bundle of `binaries` (one per part, with the part) in `args.out`, written whole (a
/// temporary directory renamed into place); each binary is verified before it counts. Returns
/// the binaries' paths.
fn write_bundle(
    args: &CompileArgs,
    opened: &OpenedModel,
    context: usize,
    (binaries, tokenizer): (&[(&Vec<u8>, &PartSpec)], &[u8]),
    inputs: &[&Path],
    verify: &mut dyn FnMut(&Path, &PartSpec) -> Result<(), String>,
) -> anyhow::Result<Vec<PathBuf>> {
    let stem = opened
        .path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let out = AtomicDir::create(&args.out, inputs)?;
    let mut names = Vec::with_capacity(binaries.len());
    for (binary, part) in binaries {
        let name = format!("{stem}_part_{}_of_{}.bin", part.index + 1, part.count);
        out.write(&name, binary)?;
        verify(&out.path_of(&name), part).map_err(|e| anyhow::anyhow!("verifying {name}: {e}"))?;
        names.push(name);
    }
    out.write("tokenizer.json", tokenizer)?;
    let config = genie_config(&opened.config, context, &names);
    let text = serde_json::to_string_pretty(&config)?;
    out.write("genie_config.json", text.as_bytes())?;
    out.commit()?;
    Ok(names.iter().map(|n| args.out.join(n)).collect())
}

/// The reference executor's options when something must be calibrated (`--kv-dtype u8|u16`
/// or integer `--weights`), else `None`: its K/V type and weights are the ones asked for.
fn reference_options(args: &CompileArgs, context: usize) -> Option<ref_backend::CompileOptions> {
    let kv = args
        .kv_dtype
        .filter(|d| matches!(d, DataType::U8 | DataType::U16));
    let integer = args.weights.filter(|w| w.is_integer());
    if kv.is_none() && integer.is_none() {
        return None;
    }
    let mut opts = super::compile_options(args, context);
    opts.kv_dtype = kv.unwrap_or(DataType::F32);
    opts.weights = integer.unwrap_or(WeightType::F32);
    Some(opts)
}

/// The reference executor compiled as [`reference_options`] says (calibration by the f32 forward
/// over the built-in prompts or `--calibration-prompts`, as `compile` does): the one source of
/// the HTP graphs' K/V encodings, i8 weights and matrix input encodings.
fn calibrated(
    args: &CompileArgs,
    opened: &OpenedModel,
    context: usize,
) -> anyhow::Result<Option<CompiledModel>> {
    let Some(opts) = reference_options(args, context) else {
        return Ok(None);
    };
    let calibration = super::calibration_sequences(args, opened)?;
    eprintln!(
        "calibrating (K/V {}, weights {}) ...",
        opts.kv_dtype,
        opts.weights.name()
    );
    let started = Instant::now();
    let model = opened.compile(&opts, &calibration, &mut |_| {})?;
    eprintln!("calibrated in {:.1?}", started.elapsed());
    Ok(Some(model))
}

/// With fixed-point K/V: the calibrated K/V encodings, shared by the past and new tensors: one
/// per (layer, KV head) when the convention's K/V tensors are per head (htpkv's), exactly as the
/// reference executor and the KV manager use them; when they hold a whole layer (AI Hub's), one
/// per layer covering the union of its heads' calibrated ranges (QNN's activations take one
/// encoding per tensor).
fn kv_encodings(
    model: Option<&CompiledModel>,
    c: &LlamaConfig,
    naming: Naming,
) -> anyhow::Result<KvEncodings> {
    let Some(model) = model.filter(|m| m.options().kv_dtype != DataType::F32) else {
        return Ok(None);
    };
    let spec = |l: usize, h: usize, value: bool| -> anyhow::Result<(DataType, ScaleOffset)> {
        match model.kv_spec(l, h, value).map(|s| (s.dtype, &s.encoding)) {
            Some((d, Encoding::PerTensor(so))) => Ok((d, *so)),
            other => anyhow::bail!("layer {l} head {h}: no per-tensor K/V encoding ({other:?})"),
        }
    };
    let fixed = |l: usize, h: usize, value: bool| -> anyhow::Result<Fixed> {
        let (dtype, so) = match naming.convention().layout.kv {
            Granularity::PerHead => spec(l, h, value)?,
            Granularity::PerLayer => {
                let heads: Vec<_> = (0..c.n_kv_heads)
                    .map(|h| spec(l, h, value))
                    .collect::<anyhow::Result<_>>()?;
                layer_encoding(&heads)?
            }
        };
        Ok(Fixed {
            dtype: dtype_to_qnn(dtype),
            scale: so.scale,
            offset: so.offset,
        })
    };
    let mut v = Vec::with_capacity(c.n_layers * c.n_kv_heads);
    for l in 0..c.n_layers {
        for h in 0..c.n_kv_heads {
            v.push((fixed(l, h, false)?, fixed(l, h, true)?));
        }
    }
    Ok(Some(v))
}

/// One encoding of `heads`' type whose range covers each head's (asymmetric, as calibrated).
fn layer_encoding(heads: &[(DataType, ScaleOffset)]) -> anyhow::Result<(DataType, ScaleOffset)> {
    let dtype = heads[0].0;
    let (qmin, qmax) = dtype.integer_range().context("a float K/V type")?;
    let (lo, hi) = heads.iter().fold((0f32, 0f32), |(lo, hi), (_, so)| {
        let real = |q: i32| (q + so.offset) as f32 * so.scale;
        (lo.min(real(qmin)), hi.max(real(qmax)))
    });
    let so = ScaleOffset::from_range(lo, hi, dtype, quant::Symmetry::Asymmetric)?;
    Ok((dtype, so))
}

/// With integer `--weights` (i8, i4, i8f16): the reference executor's integer matrices and matrix input
/// encodings, and output encodings from the ranges the f32 forward shows on the same
/// calibration sequences, run on the f32 weights the integer ones were quantized from (`Up` and
/// `Down` of an i8 build carry the FFN smoothing, [`ref_backend::smoothed_weights`]: `Up`'s
/// outputs are scaled by it). An i4 build's layer matrices go to QNN's blockwise expansion: the
/// stored values divided by their block's multiplier ([`lpbq_matrix`]). An i8f16 build's f16
/// matrices are listed in [`W8A16::float`]: the lowering multiplies the f32 weights in float.
fn w8a16(
    model: Option<&CompiledModel>,
    c: &LlamaConfig,
    w: &dyn WeightSource,
    context: usize,
) -> anyhow::Result<Option<W8A16>> {
    let Some(model) = model.filter(|m| m.options().weights.is_integer()) else {
        return Ok(None);
    };
    let started = Instant::now();
    let smoothed = ref_backend::smoothed_weights(model, w);
    let ranges = qnn_compile::calibrate::linear_ranges(c, &smoothed, model.calibration(), context)?;
    eprintln!("matrix output ranges in {:.1?}", started.elapsed());
    let mut out = W8A16::default();
    for (t, input) in model.matrix_products() {
        if model.options().weights.matrix_type(t) == WeightType::F16 {
            out.float.insert(t);
            continue;
        }
        let m = model
            .i8_matrix(t)
            .with_context(|| format!("the reference model has no i8 matrix {t}"))?;
        let input = input.with_context(|| format!("no input encoding for {t}"))?;
        let range = *ranges
            .get(&t)
            .with_context(|| format!("{t} never ran in calibration"))?;
        let matrix = W8Matrix {
            rows: m.rows,
            cols: m.cols,
            q: m.q.to_vec(),
            scales: m.scales.to_vec(),
            blocks: None,
            input: u16_from_i16(input.scale, input.offset),
            output: output_encoding(range),
        };
        let blocks = ref_backend::lpbq_multipliers(model, t, w)?;
        let matrix = match blocks {
            Some(b) => lpbq_matrix(matrix, b),
            None => matrix,
        };
        out.matrices.insert(t, matrix);
    }
    let e = model
        .i8_matrix(Tensor::TokenEmbedding)
        .context("the reference model has no i8 embedding")?;
    out.embedding = vec![0.0; e.rows * e.cols];
    for (r, row) in out.embedding.chunks_exact_mut(e.cols).enumerate() {
        e.row_into(r, row);
    }
    Ok(Some(out))
}

/// `m` on QNN's blockwise expansion: each stored value (a 4-bit value times its block's
/// multiplier, [`ref_backend::lpbq_multipliers`]) divided by the multiplier, so the HTP reads
/// `value * row scale * multiplier`, the product the reference executor computes.
fn lpbq_matrix(mut m: W8Matrix, multipliers: Vec<u8>) -> W8Matrix {
    let size = ref_backend::LPBQ_BLOCK;
    let per_row = m.cols / size;
    for (i, q) in m.q.iter_mut().enumerate() {
        let (r, c) = (i / m.cols, i % m.cols);
        *q /= multipliers[r * per_row + c / size] as i8;
    }
    m.blocks = Some(BlockMultipliers {
        size,
        bits: 4,
        m: multipliers,
    });
    m
}
