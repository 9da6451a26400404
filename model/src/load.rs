//! One entry point for a model on disk, whatever its format: a GGUF file, or a Hugging Face
//! folder (`config.json`, `*.safetensors`, `tokenizer.json`, optionally
//! `tokenizer_config.json` for the chat template and `add_bos_token`).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;

use crate::gguf::{GgufFile, GgufModel};
use crate::hf::{HfModel, config_from_file};
use crate::{ChatTemplate, Error, HfTokenizer, LlamaConfig, Weights};

/// How a model is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face folder with `config.json` and safetensors.
    HfFolder,
}

/// A model with what it takes to chat with it.
#[derive(Debug)]
pub struct LoadedModel {
    /// The description.
    pub config: LlamaConfig,
    /// f32 weights.
    pub weights: Arc<Weights>,
    /// Its tokenizer.
    pub tokenizer: HfTokenizer,
    /// Its chat template, when it has one.
    pub chat: Option<ChatTemplate>,
}

/// What it takes to talk to a model, without its weights (for a model already compiled).
#[derive(Debug)]
pub struct ModelText {
    /// The description.
    pub config: LlamaConfig,
    /// Its tokenizer.
    pub tokenizer: HfTokenizer,
    /// Its chat template, when it has one.
    pub chat: Option<ChatTemplate>,
}

/// The format of `path`: a folder holding `config.json`, or a file starting with `GGUF`.
pub fn format_of(path: &Path) -> Result<ModelFormat, Error> {
    let unknown = || Error::UnknownFormat {
        path: path.to_path_buf(),
    };
    if path.is_dir() {
        // Any entry named config.json makes it a Hugging Face folder, so a config.json that is
        // not a readable file is reported as such (not as "no llama2.c model here").
        return match path.join("config.json").symlink_metadata().is_ok() {
            true => Ok(ModelFormat::HfFolder),
            false => Err(unknown()),
        };
    }
    let mut magic = [0u8; 4];
    // A FIFO or device is refused here, before the GGUF reader opens the file.
    let (mut f, _) = crate::fsio::open_regular(path, crate::fsio::FileKind::GGUF)?;
    match f.read_exact(&mut magic) {
        Ok(()) if &magic == b"GGUF" => Ok(ModelFormat::Gguf),
        _ => Err(unknown()),
    }
}

/// The description of the model at `path` without reading its weights (for budgets and plans),
/// checked against the tensors its file or shards' headers list.
pub fn describe(path: &Path) -> Result<LlamaConfig, Error> {
    match format_of(path)? {
        ModelFormat::Gguf => Ok(GgufModel::describe(path)?.0),
        ModelFormat::HfFolder => {
            let config = config_from_file(&path.join("config.json"))?;
            // A config.json alone is budgeted on its description; shards, when there are any,
            // must agree with it.
            if crate::hf::has_shards(path) {
                crate::hf::check_folder(path, &config)?;
            }
            Ok(config)
        }
    }
}

/// Loads the model at `path` with its tokenizer and chat template.
pub fn load(path: &Path) -> Result<LoadedModel, Error> {
    match format_of(path)? {
        ModelFormat::Gguf => {
            let m = GgufModel::load(path)?;
            let (tokenizer, chat) = gguf_text(&m.file, path)?;
            Ok(LoadedModel {
                config: m.config,
                weights: m.weights,
                tokenizer,
                chat,
            })
        }
        ModelFormat::HfFolder => {
            let m = HfModel::load(path)?;
            let (tokenizer, chat) = hf_text(path, &m.config)?;
            Ok(LoadedModel {
                config: m.config,
                weights: m.weights,
                tokenizer,
                chat,
            })
        }
    }
}

/// Loads the description, tokenizer and chat template of the model at `path`, without reading
/// its weights.
pub fn load_text(path: &Path) -> Result<ModelText, Error> {
    let (config, (tokenizer, chat)) = match format_of(path)? {
        ModelFormat::Gguf => {
            let (config, file) = GgufModel::describe(path)?;
            (config, gguf_text(&file, path)?)
        }
        ModelFormat::HfFolder => {
            let config = config_from_file(&path.join("config.json"))?;
            crate::hf::check_folder(path, &config)?;
            let text = hf_text(path, &config)?;
            (config, text)
        }
    };
    Ok(ModelText {
        config,
        tokenizer,
        chat,
    })
}

fn gguf_text(file: &GgufFile, path: &Path) -> Result<(HfTokenizer, Option<ChatTemplate>), Error> {
    let tokenizer = HfTokenizer::from_gguf(file).map_err(|e| e.in_file(path.display()))?;
    let has_template = file.get("tokenizer.chat_template").is_some();
    let origin = format!("{}: tokenizer.chat_template", path.display());
    let chat = has_template
        .then(|| ChatTemplate::from_gguf(file).map(|t| t.named(origin)))
        .transpose()?;
    Ok((tokenizer, chat))
}

fn hf_text(dir: &Path, config: &LlamaConfig) -> Result<(HfTokenizer, Option<ChatTemplate>), Error> {
    let tok_config = dir.join("tokenizer_config.json");
    let (add_bos, chat) = if tok_config.is_file() {
        (add_bos_token(&tok_config)?, template_if_any(&tok_config)?)
    } else {
        (false, None)
    };
    let bos = config.special.bos.filter(|_| add_bos);
    let tokenizer = HfTokenizer::from_file(&dir.join("tokenizer.json"), bos)?;
    Ok((tokenizer, chat))
}

fn read_json(path: &Path) -> Result<Json, Error> {
    let text = crate::fsio::read_text_capped(path, crate::fsio::FileKind::HF_JSON)?;
    serde_json::from_str(&text).map_err(|e| Error::HfConfig {
        origin: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// `add_bos_token` of a tokenizer_config.json (false when absent).
fn add_bos_token(path: &Path) -> Result<bool, Error> {
    Ok(read_json(path)?["add_bos_token"].as_bool().unwrap_or(false))
}

fn template_if_any(path: &Path) -> Result<Option<ChatTemplate>, Error> {
    let has = !read_json(path)?["chat_template"].is_null();
    has.then(|| ChatTemplate::from_tokenizer_config(path))
        .transpose()
}

#[cfg(test)]
mod tests;
