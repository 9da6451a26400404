//! `genie-run`: Qualcomm Genie (`libGenie.so`) driven through `genie_ffi`, one JSON document on
//! stdout per run, so that tests and benchmarks can run Genie in a child process (Genie can crash
//! its process).
//!
//! - `genie-run check-config CONFIG.json`: `GenieDialogConfig_createFromJson` on the file: Genie's
//!   own JSON schema validates it. Exit status 0 when valid, 3 when Genie rejects it (Genie prints
//!   the schema's message to standard error).
//! - `genie-run dialog CONFIG.json (--prompt TEXT | --tokens 1,2,3)`: creates a dialog (relative
//!   paths in the configuration are resolved from the configuration's folder, as a bundle expects)
//!   and runs one query; prints the text or token ids, and the time of each callback. When Genie
//!   refuses the configuration or the binaries, the document names the call and its status
//!   (exit status 4; Genie's own messages are on standard error).
//!
//! `--genie PATH` (else `$HTPKV_GENIE`, else the `libGenie.so` of `scripts/fetch-qnn.sh`).
//! `--out FILE` writes the JSON document there instead of stdout: the QNN libraries print to
//! stdout themselves (through C's buffered stdio, flushed at exit, after the document).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use genie_ffi::{Genie, GenieError, SentenceCode, Status};
use model::fsio::{FileKind, read_text_capped, write_atomic_verified};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "genie-run",
    about = "Run Qualcomm Genie (libGenie.so) and report as JSON"
)]
struct Cli {
    /// libGenie.so (else $HTPKV_GENIE, else the one scripts/fetch-qnn.sh fetched).
    #[arg(long, global = true)]
    genie: Option<PathBuf>,
    /// Write the JSON document to FILE instead of stdout (which Genie and QNN also write to).
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a genie_config.json with Genie's own schema.
    CheckConfig { config: PathBuf },
    /// Create a dialog from a genie_config.json and run one query.
    Dialog {
        config: PathBuf,
        /// The prompt as text (GenieDialog_query).
        #[arg(long, conflicts_with = "tokens")]
        prompt: Option<String>,
        /// The prompt as token ids (GenieDialog_tokenQuery), e.g. 1,403,411.
        #[arg(long, value_delimiter = ',')]
        tokens: Option<Vec<u32>>,
        /// Sets `dialog.max-num-tokens` in the configuration before Genie reads it.
        #[arg(long)]
        max_tokens: Option<u32>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn genie_path(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os("HTPKV_GENIE").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    match htpkv::qnn_libs::QnnLibs::fetched() {
        Some(libs) => Ok(libs.genie()),
        None => bail!(
            "no libGenie.so: pass --genie PATH or set $HTPKV_GENIE, or {}",
            htpkv::qnn_libs::FETCH_QNN
        ),
    }
}

fn version(genie: &Genie) -> Value {
    genie
        .api_version()
        .map_or(Value::Null, |(a, b, c)| json!(format!("{a}.{b}.{c}")))
}

/// A result document: the configuration, the library, Genie's API version and `status`, then
/// `fields` (an object).
fn document(
    config: &Path,
    genie_path: &Path,
    genie: &Genie,
    status: Status,
    fields: Value,
) -> Value {
    let mut doc = json!({
        "config": config.display().to_string(),
        "genie": genie_path.display().to_string(),
        "genie_api": version(genie),
        "status": status.0,
        "status_name": status.name(),
    });
    if let (Some(d), Value::Object(f)) = (doc.as_object_mut(), fields) {
        d.extend(f);
    }
    doc
}

/// Prints `doc`, or writes it to `out` with the one atomic writer (never over a special file or
/// one of `inputs`).
fn print(out: Option<&Path>, doc: &Value, inputs: &[&Path]) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(doc)? + "\n";
    match out {
        Some(path) => Ok(write_atomic_verified(
            path,
            text.as_bytes(),
            inputs,
            &mut |_| Ok(()),
        )?),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let path = genie_path(cli.genie)?;
    // Absolute before `dialog` enters the configuration's folder.
    let out = cli.out.map(std::path::absolute).transpose()?;
    let out = out.as_deref();
    let genie = Genie::load(&path)?;
    match cli.command {
        Command::CheckConfig { config } => {
            let text = read_text_capped(&config, FileKind::CONFIG)?;
            let status = match genie.dialog_config(&text) {
                Ok(_) => Status::SUCCESS,
                Err(GenieError::Status { status, .. }) => status,
                Err(e) => return Err(e.into()),
            };
            let fields = json!({"valid": !status.is_error()});
            print(
                out,
                &document(&config, &path, &genie, status, fields),
                &[&config, &path],
            )?;
            Ok(if status.is_error() {
                std::process::ExitCode::from(3)
            } else {
                std::process::ExitCode::SUCCESS
            })
        }
        Command::Dialog {
            config,
            prompt,
            tokens,
            max_tokens,
        } => dialog(
            &genie,
            out,
            &path,
            // Absolute: `dialog` enters the configuration's folder, and the output may not
            // replace it.
            &std::path::absolute(&config)?,
            prompt.as_deref(),
            tokens.as_deref(),
            max_tokens,
        ),
    }
}

fn dialog(
    genie: &Genie,
    out: Option<&Path>,
    genie_path: &Path,
    config: &Path,
    prompt: Option<&str>,
    tokens: Option<&[u32]>,
    max_tokens: Option<u32>,
) -> anyhow::Result<std::process::ExitCode> {
    let text = read_text_capped(config, FileKind::CONFIG)?;
    let mut doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", config.display()))?;
    if let Some(n) = max_tokens {
        set_max_tokens(&mut doc, n).with_context(|| format!("{}", config.display()))?;
    }
    // Bundles name their files relative to their folder.
    let dir = config
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let named = named_files(&doc, dir).with_context(|| format!("{}", config.display()))?;
    let inputs: Vec<&Path> = [config, genie_path]
        .into_iter()
        .chain(named.iter().map(PathBuf::as_path))
        .collect();
    std::env::set_current_dir(dir).with_context(|| format!("entering {}", dir.display()))?;

    // A refusal by Genie is a result (a document with the failing call and status, exit status
    // 4), not an error of genie-run.
    let refused = |call: &str, status: Status| -> anyhow::Result<std::process::ExitCode> {
        let fields = json!({"refused_by": call});
        print(
            out,
            &document(config, genie_path, genie, status, fields),
            &inputs,
        )?;
        Ok(std::process::ExitCode::from(4))
    };
    let cfg = match genie.dialog_config(&doc.to_string()) {
        Ok(c) => c,
        Err(GenieError::Status { call, status }) => return refused(call, status),
        Err(e) => return Err(e.into()),
    };
    let t0 = Instant::now();
    let mut d = match cfg.create_dialog() {
        Ok(d) => d,
        Err(GenieError::Status { call, status }) => return refused(call, status),
        Err(e) => return Err(e.into()),
    };
    let create_s = t0.elapsed().as_secs_f64();

    let mut out_text = String::new();
    let mut out_tokens: Vec<u32> = Vec::new();
    let mut times: Vec<f64> = Vec::new();
    let mut codes: Vec<String> = Vec::new();
    let t1 = Instant::now();
    let result = match (prompt, tokens) {
        (Some(p), None) => d
            .query(p, &mut |piece: &str, code: SentenceCode| {
                if !piece.is_empty() {
                    times.push(t1.elapsed().as_secs_f64());
                }
                codes.push(format!("{code:?}"));
                out_text.push_str(piece);
            })
            .map(Some),
        (None, Some(ids)) => d.token_query(ids, &mut |ids: &[u32], code: SentenceCode| {
            if !ids.is_empty() {
                times.push(t1.elapsed().as_secs_f64());
            }
            codes.push(format!("{code:?}"));
            out_tokens.extend_from_slice(ids);
        }),
        _ => bail!("give exactly one of --prompt and --tokens"),
    };
    let status = match result {
        Ok(Some(status)) => status,
        Ok(None) => bail!("this libGenie.so has no GenieDialog_tokenQuery"),
        Err(GenieError::Status { call, status }) => return refused(call, status),
        Err(e) => return Err(e.into()),
    };
    let query_s = t1.elapsed().as_secs_f64();
    // Times of the callbacks that carried output (Genie ends with an empty `End` one): the
    // first comes after the prompt is processed, the later ones a decode step apart.
    let step_ms: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) * 1e3).collect();
    let mean_step_ms =
        (!step_ms.is_empty()).then(|| step_ms.iter().sum::<f64>() / step_ms.len() as f64);
    let fields = json!({
        "create_s": create_s,
        "query_s": query_s,
        "first_callback_s": times.first(),
        "callbacks": codes.len(),
        "outputs": times.len(),
        "step_ms": step_ms,
        "mean_step_ms": mean_step_ms,
        "sentence_codes": codes,
        "text": prompt.map(|_| out_text),
        "tokens": tokens.map(|_| out_tokens),
    });
    print(
        out,
        &document(config, genie_path, genie, status, fields),
        &inputs,
    )?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Sets `dialog.max-num-tokens`: the configuration must be an object, and its `dialog` one too.
fn set_max_tokens(doc: &mut Value, n: u32) -> anyhow::Result<()> {
    let Some(top) = doc.as_object_mut() else {
        bail!("a Genie configuration is a JSON object, not {doc}");
    };
    let dialog = top.entry("dialog").or_insert_with(|| json!({}));
    let Some(dialog) = dialog.as_object_mut() else {
        bail!("`dialog` is a JSON object, not {dialog}");
    };
    dialog.insert("max-num-tokens".into(), json!(n));
    Ok(())
}

/// Every file the configuration names (a string naming something that exists, taken from the
/// configuration's folder `dir`), under the bundle path rules (`htpkv::bundle::inside`: relative,
/// no `..`, no symbolic link out of the folder): the output may replace none of them.
fn named_files(doc: &Value, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![doc];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if !s.is_empty() && dir.join(s).symlink_metadata().is_ok() => {
                files.push(htpkv::bundle::inside(dir, s).map_err(anyhow::Error::msg)?);
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    Ok(files)
}
