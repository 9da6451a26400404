//! `htpkv compile --parts N` / `--convention aihub`: the compiled model as Qualcomm AI Hub ships
//! an LLM — one context binary per part (`{model}_part_{i}_of_{N}.bin`), `genie_config.json`
//! and `tokenizer.json` in one directory, which `htpkv generate --bundle DIR` runs.

use std::path::{Path, PathBuf};

use anyhow::Context;
use model::LlamaConfig;
use model::fsio::{AtomicDir, check_output_dir};
use ref_backend::CompiledModel;
use serde_json::{Value, json};

/// What to emit.
pub struct BundleSpec<'a> {
    /// Number of parts.
    pub parts: usize,
    /// Positions as RoPE cos/sin tables (the `aihub` convention).
    pub rope_tables: bool,
    /// The HF `tokenizer.json` written into the bundle.
    pub tokenizer: &'a [u8],
    /// File-name stem of the parts (the checkpoint's).
    pub stem: &'a str,
    /// Context lengths to write graphs for (empty: the model's own); the model was compiled at
    /// the largest.
    pub contexts: &'a [usize],
}

/// Checks that `dir` may receive a bundle: new, an empty directory or an earlier bundle (it has a
/// `genie_config.json`), not a symlink, and holding none of `inputs`. Any other directory is
/// refused: the bundle replaces the directory whole.
pub fn check_bundle_out(dir: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    check_output_dir(dir, inputs)?;
    let Ok(mut entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    if entries.next().is_some() && !dir.join("genie_config.json").exists() {
        anyhow::bail!(
            "refusing to replace the directory {}: it is not empty and holds no \
             genie_config.json (a bundle replaces its directory whole)",
            dir.display()
        );
    }
    Ok(())
}

/// Writes the bundle into a new temporary directory beside `dir`, then puts it in place of `dir`
/// (an old bundle there is replaced whole): a failure leaves `dir` as it was and nothing
/// half-written. Returns the part files.
pub fn write_bundle(
    model: &CompiledModel,
    dir: &Path,
    spec: &BundleSpec<'_>,
    inputs: &[&Path],
) -> anyhow::Result<Vec<PathBuf>> {
    check_bundle_out(dir, inputs)?;
    let out = AtomicDir::create(dir, inputs)?;
    let own = model.options().context;
    let mut contexts = spec.contexts.to_vec();
    contexts.sort_unstable();
    contexts.dedup();
    if contexts.is_empty() {
        contexts.push(own);
    }
    let mut bins = Vec::new();
    for &c in &contexts {
        // The same weights and encodings with graphs of context c (rows mean the same in each).
        let tier = (c != own).then(|| model.with_context(c)).transpose()?;
        // One file per part and context length (AI Hub links all of a part's graphs into one
        // binary; the reference format holds one context length per file).
        let label = if contexts.len() > 1 {
            format!("_cl{c}")
        } else {
            String::new()
        };
        for part in tier
            .as_ref()
            .unwrap_or(model)
            .split(spec.parts, spec.rope_tables)?
        {
            let p = part.part();
            let name = format!(
                "{}{label}_part_{}_of_{}.bin",
                spec.stem,
                p.index + 1,
                p.count
            );
            // Verified: read back and compared before it counts as written.
            part.write(&out.path_of(&name), inputs)?;
            bins.push(name);
        }
    }
    out.write("tokenizer.json", spec.tokenizer)?;
    let config = genie_config(model.config(), model.options().context, &bins);
    let text = serde_json::to_string_pretty(&config).context("genie_config.json")?;
    out.write("genie_config.json", text.as_bytes())?;
    out.commit()?;
    Ok(bins.iter().map(|name| dir.join(name)).collect())
}

/// `genie_config.json` with the fields `htpkv::bundle` reads: context size, vocabulary, BOS,
/// the tokens that end generation (EOS, end of turn, and BOS, which ends a llama2.c story),
/// tokenizer path, the binaries, and the RoPE settings (`rope-dim` is half the head dim: the
/// width of the cos/sin tables).
fn genie_config(c: &LlamaConfig, context: usize, bins: &[String]) -> Value {
    let s = &c.special;
    let eos: Vec<u32> = [s.eos, s.eot, s.bos].into_iter().flatten().collect();
    let mut rope = json!({"type": "rope", "rope-dim": c.head_dim / 2, "rope-theta": c.rope.theta});
    if let Some(sc) = &c.rope.scaling {
        rope["rope-scaling"] = json!({
            "rope-type": "llama3",
            "factor": sc.factor,
            "low-freq-factor": sc.low_freq_factor,
            "high-freq-factor": sc.high_freq_factor,
            "original-max-position-embeddings": sc.original_context,
        });
    }
    json!({"dialog": {
        "version": 1,
        "type": "basic",
        "context": {
            "version": 1,
            "size": context,
            "n-vocab": c.vocab_size,
            "bos-token": s.bos.map_or(-1, i64::from),
            "eos-token": eos,
        },
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {
            "version": 1,
            "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1}},
            "model": {
                "version": 1,
                "type": "binary",
                "binary": {"version": 1, "ctx-bins": bins},
                "positional-encoding": rope,
            },
        },
    }})
}
