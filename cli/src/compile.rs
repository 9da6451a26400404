//! `htpkv compile`: a model (llama2.c checkpoint, GGUF file or Hugging Face folder) -> a
//! reference-backend context binary (or a Genie bundle of part binaries, [`bundle`]).

mod bundle;
mod htp;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use htpkv::engine::{
    DEFAULT_MAX_CONTEXT, LayerWindows, ModelSource, OpenedModel, apply_layer_windows,
};
use model::fsio::{FileKind, check_output, open_regular, read_capped};
use quant::DataType;
use ref_backend::{
    CompileOptions, Convention, DEFAULT_CALIBRATION_PROMPTS, DEFAULT_CALIBRATION_TOKENS,
    Granularity, KLayout, Packaging, Preset, Split, WeightType,
};

/// Arguments of `htpkv compile`.
#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The model, as `generate --model` takes it: a GGUF file, a Hugging Face folder, a llama2.c
    /// checkpoint file or a llama2.c directory (default: the llama2.c model discovered like the
    /// tests do: $HTPKV_MODEL_DIR, ./models/stories260K, ../shared/models/stories260K).
    #[arg(long, value_name = "MODEL")]
    model: Option<PathBuf>,
    /// llama2.c tokenizer (default: the `tok{N}.bin` or `tokenizer.bin` beside the checkpoint;
    /// GGUF and Hugging Face models bring their own).
    #[arg(long, value_name = "TOK")]
    tokenizer: Option<PathBuf>,
    /// Context length S (default: the model's seq_len).
    #[arg(long, value_name = "S", conflicts_with = "contexts")]
    context: Option<usize>,
    /// A bundle with graphs for each of these context lengths (the model is compiled at the
    /// largest); a session starts on the smallest that holds the prompt and moves up as it fills.
    #[arg(long, value_delimiter = ',', value_name = "S,..")]
    contexts: Vec<usize>,
    /// AR variants (tokens per step), one graph each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,32",
        value_name = "N,.."
    )]
    ar: Vec<usize>,
    /// KV cache dtype: u8, u16, f16 or f32.
    /// [default: u8; f32 with --target htp, whose lowering is float for now]
    #[arg(long, value_parser = parse_kv_dtype)]
    kv_dtype: Option<DataType>,
    /// `128`: u8 K/V encodings symmetric around 0 with zero point 128 (offset -128), as AI Hub
    /// ships its KV cache, instead of the calibrated asymmetric ones (u8 KV only).
    #[arg(long, value_name = "128", value_parser = parse_kv_zero_point)]
    kv_zero_point: Option<u32>,
    /// Weight type: i8 (W8A16), i4 (W4A16: 4-bit LPBQ layer matrices, V and down at 8 bits),
    /// i8f16 (i8 with V and down in f16), f16 or f32.
    /// [default: i8f16 (chosen by measurement); with --target htp f32 (run in fp16), i8 for W8A16 or i4 for W4A16 on HTP]
    #[arg(long, value_parser = parse_from_str::<WeightType>)]
    weights: Option<WeightType>,
    /// Key layout: rows or transposed [default: the convention's: rows for htpkv, transposed for
    /// aihub and executorch].
    #[arg(long, value_parser = parse_from_str::<KLayout>)]
    k_layout: Option<KLayout>,
    /// KV tensor granularity: per_head or per_layer [default: the convention's: per_head for
    /// htpkv, per_layer for aihub and executorch].
    #[arg(long, value_parser = parse_from_str::<Granularity>)]
    granularity: Option<Granularity>,
    /// Calibration prompts, one per line (default: built-in story openings, preceded for a model with
    /// a chat template by built-in conversations rendered with it).
    #[arg(long, value_name = "FILE")]
    calibration_prompts: Option<PathBuf>,
    /// Length in tokens of each calibration sequence (prompt + greedy continuation).
    #[arg(long, default_value_t = DEFAULT_CALIBRATION_TOKENS)]
    calibration_tokens: usize,
    /// IO convention of the output: `htpkv` (one file), `aihub` (a Genie bundle of part
    /// binaries taking RoPE cos/sin tables) or `executorch` (one file with ExecuTorch's methods
    /// `kv_forward` / `prefill_forward`: one context length, at most one AR-n variant beside
    /// AR-1, no parts, and only its own K/V layout: `--granularity per_layer --k-layout
    /// transposed`). Each convention's layout is the default of `--k-layout` and `--granularity`.
    #[arg(long, default_value = "htpkv", value_parser = parse_preset)]
    convention: Preset,
    /// Cut the model into N parts of consecutive layers and write a Genie bundle (`--out` is
    /// then a directory).
    #[arg(long, value_name = "N")]
    parts: Option<usize>,
    /// How `--parts` cuts the model: `balanced` (htpkv's: part 1 embeds and runs the first layers,
    /// sizes differ by at most one) or `aihub` (AI Hub's exports: part 1 only the embedding, then
    /// ceil(layers / (N - 1)) layers per part, the hidden state named after AI Hub's ONNX tensors;
    /// needs `--convention aihub`) [default: the convention's own: aihub for `--convention aihub`,
    /// else balanced].
    #[arg(long, value_parser = parse_from_str::<Split>)]
    split: Option<Split>,
    /// The HF tokenizer.json copied into a bundle (a llama2.c tokenizer is not one).
    #[arg(long, value_name = "FILE")]
    tokenizer_json: Option<PathBuf>,
    /// What to compile for: `reference` (htpkv's executor and its QNN library) or `htp` (a genuine
    /// QNN context binary made by Qualcomm's HTP backend library, see --qnn-backend).
    #[arg(long, default_value = "reference", value_parser = ["reference", "htp"])]
    target: String,
    /// With --target htp: the QNN HTP backend library that composes and prepares the graphs
    /// [default: $HTPKV_QNN_BACKEND, else libQnnHtp.so in the fetched QNN libraries].
    #[arg(long, value_name = "PATH")]
    qnn_backend: Option<PathBuf>,
    /// With --target htp: the SoC model number the graphs are prepared for.
    #[arg(long, default_value_t = 60, value_name = "N")]
    soc_model: u32,
    /// With --target htp: the HTP architecture (68, 69, 73, 75, 79, ...).
    #[arg(long, default_value_t = 75, value_name = "N")]
    htp_arch: u32,
    /// Output file (a directory for a bundle).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Sliding attention window W on the listed layers (e.g. `0,2,4:16`; repeat for other
    /// windows), for a model without its own (a Hugging Face model's config.json windows are
    /// used as they are). A window of the context or more is a global layer.
    #[arg(long, value_name = "LAYERS:W", value_parser = parse_from_str::<LayerWindows>)]
    layer_window: Vec<LayerWindows>,
    /// Compile no last-row prefill graphs: every graph returns every row's logits. By default
    /// each AR-n variant above 1 also gets a prefill graph returning only the last row's, where
    /// the convention allows it (htpkv's; AI Hub's, Genie's and ExecuTorch's keep the graphs
    /// they declare).
    #[arg(long)]
    all_row_prefill: bool,
}

impl CompileArgs {
    /// Whether to compile last-row prefill graphs: unless `--all-row-prefill`, where the
    /// naming's convention allows them (its `last_row_graphs`).
    pub(crate) fn last_row(&self) -> bool {
        let naming = self.naming().unwrap_or(self.convention);
        !self.all_row_prefill && naming.convention().last_row_graphs
    }

    /// The KV dtype asked for, u8 when none was.
    fn kv_dtype(&self) -> DataType {
        self.kv_dtype.unwrap_or(DataType::U8)
    }

    /// What `--convention` declares.
    fn convention(&self) -> Convention {
        self.convention.convention()
    }

    /// The key layout: `--k-layout`, else the convention's.
    fn k_layout(&self) -> KLayout {
        self.k_layout.unwrap_or(self.convention().layout.keys)
    }

    /// The K/V granularity: `--granularity`, else the convention's.
    fn granularity(&self) -> Granularity {
        self.granularity.unwrap_or(self.convention().layout.kv)
    }

    /// How `--parts` cuts the model: `--split`, else the convention's own (one part is the whole
    /// model, which no split cuts).
    fn split(&self) -> Split {
        let cut = self.parts.is_some_and(|n| n > 1);
        self.split.unwrap_or(if cut {
            self.convention().split
        } else {
            Split::Balanced
        })
    }

    /// Whether the graphs take RoPE tables: what the convention's layout declares.
    fn rope_tables(&self) -> bool {
        ref_backend::takes_rope_tables(self.convention)
    }

    /// The naming of the graphs written: the convention's, or with `--parts` the one parts of it
    /// take ([`Preset::parts_naming`]: AI Hub's for htpkv's).
    fn naming(&self) -> anyhow::Result<Preset> {
        if self.parts.is_none() {
            return Ok(self.convention);
        }
        ref_backend::parts_naming(self.convention).map_err(|why| anyhow::anyhow!("--parts: {why}"))
    }
}

fn parse_kv_dtype(s: &str) -> Result<DataType, String> {
    match s.parse::<DataType>() {
        Ok(d @ (DataType::U8 | DataType::U16 | DataType::F16 | DataType::F32)) => Ok(d),
        _ => Err(format!(
            "unsupported KV dtype `{s}` (expected u8, u16, f16 or f32)"
        )),
    }
}

fn parse_kv_zero_point(s: &str) -> Result<u32, String> {
    match s {
        "128" => Ok(128),
        _ => Err(format!(
            "unsupported K/V zero point `{s}` (128; without the option the encodings are calibrated)"
        )),
    }
}

/// A `--convention` value: the conventions the compiler writes.
fn parse_preset(s: &str) -> Result<Preset, String> {
    s.parse().map_err(|_| {
        let names: Vec<String> = Preset::ALL.iter().map(ToString::to_string).collect();
        format!("expected one of {}", names.join(", "))
    })
}

fn parse_from_str<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T, String> {
    s.parse()
}

/// Compiles the model `--model` names (a GGUF file, a Hugging Face folder or a llama2.c
/// checkpoint, found as `generate` finds it); its own tokenizer encodes the calibration.
fn run_reference(args: &CompileArgs) -> anyhow::Result<()> {
    let source = ModelSource::find(args.model.as_deref(), args.tokenizer.as_deref())?;
    // Every file the model is read from (a Hugging Face folder's files, not only the folder:
    // `--out DIR/config.json` is an input), refused as the output before the model is read.
    let files = source.inputs()?;
    let mut inputs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
    inputs.extend(args.calibration_prompts.as_deref());
    check_early(args, &inputs, source.brings_tokenizer())?;
    let mut opened = OpenedModel::open_source(&source)?;
    apply_layer_windows(&mut opened.config, &args.layer_window)?;
    let context = args
        .context
        .or(args.contexts.iter().max().copied())
        .unwrap_or(opened.config.context_length.min(DEFAULT_MAX_CONTEXT));
    check_parts(args, opened.config.n_layers)?;
    check_contexts(args, &opened.config)?;
    htpkv::engine::check_geometry(&opened.config, context, &args.ar, args.kv_dtype())?;
    let calibration = calibration_sequences(args, &opened)?;
    let opts = compile_options(args, context);
    let mut bars = crate::progress::StageBars::default();
    let started = Instant::now();
    let model = opened.compile(&opts, &calibration, &mut |p| bars.update(p));
    bars.finish();
    write_output(args, &model?, &opened.path, &inputs, started)
}

/// True when the output is a Genie bundle (`--parts`, or a convention packaged as one:
/// `--convention aihub`).
fn is_bundle(args: &CompileArgs) -> bool {
    args.convention().packaging == Packaging::GenieBundle || args.parts.is_some()
}

/// Refuses what the convention cannot express (its names, its fixed layout), with the reason
/// `CompiledModel::with_naming` / `split` would give.
fn check_convention(args: &CompileArgs) -> anyhow::Result<()> {
    let naming = args.naming()?;
    let parts = args.parts.unwrap_or(1);
    let c = args.convention();
    let refusal = ref_backend::naming_refusal(naming, parts, args.rope_tables(), &args.ar)
        .or_else(|| c.layout_refusal(args.granularity(), args.k_layout()));
    if let Some(reason) = refusal {
        bail!("--convention {}: {reason}", args.convention);
    }
    if !args.contexts.is_empty() && !is_bundle(args) && !c.names_context() {
        bail!(
            "--contexts: the {} convention's graph names carry no context length, so one file \
             holds one: use --context S",
            args.convention
        );
    }
    Ok(())
}

/// Refuses what can be refused before any work: what the convention cannot express, a bundle
/// without its tokenizer.json, a bad output path (checked again when written).
fn check_early(
    args: &CompileArgs,
    inputs: &[&std::path::Path],
    brings_tokenizer: bool,
) -> anyhow::Result<()> {
    check_convention(args)?;
    if args.kv_zero_point.is_some() && args.kv_dtype() != DataType::U8 {
        bail!(
            "--kv-zero-point 128 is for a u8 KV cache, not --kv-dtype {}",
            args.kv_dtype()
        );
    }
    if !is_bundle(args) {
        return Ok(check_output(&args.out, inputs)?);
    }
    bundle::check_bundle_out(&args.out, inputs)?;
    if args.tokenizer_json.is_none() && !brings_tokenizer {
        bail!(
            "a bundle (--parts or --convention aihub) of a llama2.c checkpoint needs \
             --tokenizer-json FILE"
        );
    }
    Ok(())
}

/// The bundle's tokenizer.json: `--tokenizer-json`, else the model's own (a Hugging Face folder's
/// tokenizer.json; a GGUF file's vocabulary and merges written as one).
fn bundle_tokenizer(args: &CompileArgs, model_path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    if let Some(p) = &args.tokenizer_json {
        return Ok(read_capped(p, FileKind::TOKENIZER)?);
    }
    match model::format_of(model_path) {
        Ok(model::ModelFormat::HfFolder) => Ok(read_capped(
            &model_path.join("tokenizer.json"),
            FileKind::TOKENIZER,
        )?),
        Ok(model::ModelFormat::Gguf) => {
            let (file, len) = open_regular(model_path, FileKind::GGUF)?;
            let gguf = model::gguf::GgufFile::read(std::io::BufReader::new(file), len)
                .with_context(|| format!("reading {}", model_path.display()))?;
            let tok = model::HfTokenizer::from_gguf(&gguf)?;
            let json = tok.inner().to_string(false).map_err(|e| {
                anyhow::anyhow!("writing the GGUF tokenizer as tokenizer.json: {e}")
            })?;
            Ok(json.into_bytes())
        }
        Err(_) => bail!("a bundle of a llama2.c checkpoint needs --tokenizer-json FILE"),
    }
}

/// Refuses `--contexts` outside a bundle, or with a length no graph set can have, before compiling.
fn check_contexts(args: &CompileArgs, config: &model::LlamaConfig) -> anyhow::Result<()> {
    if args.contexts.is_empty() {
        return Ok(());
    }

    if !is_bundle(args) {
        bail!("--contexts writes a bundle: add --parts N or --convention aihub");
    }
    for &c in &args.contexts {
        htpkv::engine::check_geometry(config, c, &args.ar, args.kv_dtype())
            .with_context(|| format!("--contexts: context {c}"))?;
    }
    Ok(())
}

/// Refuses a bad `--parts` (or `--ar` the executorch names cannot tell apart) before compiling,
/// with the reason `CompiledModel::split` / `with_naming` would give.
fn check_parts(args: &CompileArgs, n_layers: usize) -> anyhow::Result<()> {
    let split = args.split();
    if split != Split::Balanced && split != args.convention().split {
        let owner = Preset::owning(split).map_or("another".into(), |p| p.name());
        bail!(
            "--split {split} cuts the model as the {owner} convention does: it needs \
               --convention {owner}"
        );
    }
    if split == Split::AiHub && args.contexts.len() > 1 {
        // The embedding-only part has no mask to tell its context length by: the runtime would
        // take every length's part 1 for each context.
        bail!("--split aihub writes one context length: give --context, not --contexts");
    }
    if let Some(n) = args.parts {
        ref_backend::Part::split_as(n_layers, n, args.rope_tables(), args.naming()?, split)
            .map_err(|reason| anyhow::anyhow!("--parts: {reason}"))?;
    }
    Ok(())
}

/// Writes the compiled model: one file, or a Genie bundle (part binaries, genie_config.json and
/// the tokenizer.json) in the directory `--out`.
fn write_output(
    args: &CompileArgs,
    model: &ref_backend::CompiledModel,
    model_path: &std::path::Path,
    inputs: &[&std::path::Path],
    started: Instant,
) -> anyhow::Result<()> {
    let symmetric;
    let model = if args.kv_zero_point.is_some() {
        symmetric = model.with_kv_zero_point_128()?;
        &symmetric
    } else {
        model
    };
    if !is_bundle(args) {
        // One file, named by the convention; written only after it was read back and found equal
        // (the runtime's validation).
        let model = model.with_naming(args.convention)?;
        model.write(&args.out, inputs)?;
        return report(args, &model, started);
    }
    let tokenizer = bundle_tokenizer(args, model_path)?;
    let stem = model_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned());
    // Checked by `check_parts` before compiling.
    let spec = bundle::BundleSpec {
        parts: args.parts.unwrap_or(1),
        split: args.split(),
        rope_tables: args.rope_tables(),
        tokenizer: &tokenizer,
        stem: stem.as_deref().unwrap_or("model"),
        contexts: &args.contexts,
    };
    let mut inputs = inputs.to_vec();
    inputs.extend(args.tokenizer_json.as_deref());
    let bins = bundle::write_bundle(model, &args.out, &spec, &inputs)?;
    crate::output::to_stdout(|out| {
        writeln!(
            out,
            "wrote the bundle {} in {:.2?}",
            args.out.display(),
            started.elapsed()
        )?;
        for b in &bins {
            writeln!(out, "part {}", b.display())?;
        }
        Ok(())
    })
}

/// The token sequences calibration starts from: `--calibration-prompts` (with BOS), or the
/// engine's defaults.
fn calibration_sequences(
    args: &CompileArgs,
    opened: &OpenedModel,
) -> anyhow::Result<Vec<Vec<u32>>> {
    Ok(match &args.calibration_prompts {
        Some(_) => calibration_texts(args)?
            .iter()
            .map(|t| opened.codec.encode(t, true))
            .collect(),
        None => htpkv::engine::calibration_sequences(&*opened.codec, &opened.chat)?,
    })
}

fn calibration_texts(args: &CompileArgs) -> anyhow::Result<Vec<String>> {
    Ok(match &args.calibration_prompts {
        Some(p) => {
            let bytes = read_capped(p, FileKind::PROMPTS)?;
            let text = String::from_utf8(bytes)
                .with_context(|| format!("calibration prompt file {} is not UTF-8", p.display()))?;
            let lines: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            if lines.is_empty() {
                bail!("calibration prompt file {} has no prompts", p.display());
            }
            lines
        }
        None => DEFAULT_CALIBRATION_PROMPTS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    })
}

fn compile_options(args: &CompileArgs, context: usize) -> CompileOptions {
    let mut opts = CompileOptions::new(context, args.ar.clone());
    opts.kv_dtype = args.kv_dtype();
    opts.weights = args.weights.unwrap_or(WeightType::DEFAULT);
    // The convention's layout unless asked for another (a fixed one is checked early).
    (opts.k_layout, opts.granularity) = (args.k_layout(), args.granularity());
    opts.calibration_tokens = args.calibration_tokens;
    opts.last_row = args.last_row();
    opts
}

pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    if args.target == "htp" {
        return htp::run(&args);
    }
    run_reference(&args)
}

/// What was written, on stdout.
fn report(
    args: &CompileArgs,
    model: &ref_backend::CompiledModel,
    started: Instant,
) -> anyhow::Result<()> {
    let size = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    let c = model.config();
    crate::output::to_stdout(|out| {
        writeln!(
            out,
            "wrote {} ({size} bytes) in {:.2?}: fingerprint {}",
            args.out.display(),
            started.elapsed(),
            model.options().fingerprint_hex()
        )?;
        writeln!(
            out,
            "model: dim {} layers {} heads {}/{} head_dim {} vocab {}; KV {} ({}, {}), weights {}",
            c.dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab_size,
            model.options().kv_dtype,
            model.options().k_layout.name(),
            model.options().granularity.name(),
            model.options().weights.name()
        )?;
        if c.layer_windows.iter().any(Option::is_some) {
            let w: Vec<String> = (c.layer_windows.iter())
                .map(|w| w.map_or("global".into(), |w| w.to_string()))
                .collect();
            writeln!(out, "per-layer windows: {}", w.join(" "))?;
        }
        for g in model.graphs() {
            writeln!(
                out,
                "graph {}: {} inputs, {} outputs, window {} rows",
                g.name(),
                g.inputs().len(),
                g.outputs().len(),
                g.window()
            )?;
        }
        Ok(())
    })
}
