//! Engine options as a user spells them (the CLI's flags, the Java API's arguments), read into
//! [`EngineOptions`] in one place: each spelling is parsed here once, and every front end gets the
//! same defaults and the same messages, which name the option as the CLI spells it.

use super::{BackendChoice, EngineError, EngineOptions};
use crate::speculate::SpecKind;
use quant::DataType;
use ref_backend::WeightType;
use std::path::PathBuf;

/// What a front end was given; `None` (or empty) means the engine's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSpec {
    /// `--model`: a GGUF file, Hugging Face folder, llama2.c checkpoint or directory.
    pub model: Option<PathBuf>,
    /// `--compiled`: a compiled file to run instead of compiling.
    pub compiled: Option<PathBuf>,
    /// `--tokenizer`: a llama2.c checkpoint's tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// `--chat-template`: a Jinja chat template file.
    pub chat_template: Option<PathBuf>,
    /// `--backend`: `reference` (default) or `qnn`.
    pub backend: Option<String>,
    /// `--qnn-backend`: the QNN backend library (default: `$HTPKV_QNN_BACKEND`, the fetched one).
    pub qnn_backend: Option<PathBuf>,
    /// `--qnn-system`: the QNN system library (default: beside the backend library).
    pub qnn_system: Option<PathBuf>,
    /// `--qnn-memory`: `auto` (default), `shared-buffer`, `client` or `host`.
    pub qnn_memory: Option<String>,
    /// `--qnn-max-handles` (default [`crate::qnn_memory::DEFAULT_MAX_HANDLES`]).
    pub qnn_max_handles: Option<usize>,
    /// `--update`: the KV update strategy (default: [`EngineOptions::default_strategy`]).
    pub update: Option<String>,
    /// `--kv-dtype`: `u8`, `u16` (default), `f16` or `f32`.
    pub kv_dtype: Option<String>,
    /// `--weights`: `i8`, `i4`, `i8f16`, `f16` or `f32` (default [`WeightType::DEFAULT`]).
    pub weights: Option<String>,
    /// `--context`: the context length (default: the model's, at most the engine's maximum).
    pub context: Option<usize>,
    /// `--ar`: the AR variants (default: the context's, with what speculation and beams need).
    pub ar: Option<Vec<usize>>,
    /// `--speculate`, parsed ([`SpecKind::parse`]): its verification variant joins the default AR.
    pub speculate: Option<SpecKind>,
    /// `--beams B`: a beam search's B-row variant joins the default AR.
    pub beams: Option<usize>,
    /// `--layer-window` overrides.
    pub layer_windows: Vec<super::LayerWindows>,
    /// `--all-row-prefill`: compile no last-row prefill graphs ([`EngineOptions::last_row`]).
    pub all_row_prefill: bool,
    /// Where compiled models are cached.
    pub cache_dir: Option<PathBuf>,
}

impl EngineSpec {
    /// The engine options this spelling asks for; a bad value is a `bad_option` naming the option.
    pub fn resolve(&self) -> Result<EngineOptions, EngineError> {
        let defaults = EngineOptions::default();
        let backend = self.backend()?;
        let strategy = match &self.update {
            Some(name) => EngineOptions::parse_strategy(name)?,
            None => EngineOptions::default_strategy(
                &backend,
                EngineOptions::model_is_windowed(self.model.as_deref()),
            ),
        };
        Ok(EngineOptions {
            model_dir: self.model.clone(),
            compiled: self.compiled.clone(),
            backend,
            strategy,
            kv_dtype: self.kv_dtype()?.unwrap_or(defaults.kv_dtype),
            weights: self
                .weights()?
                .map_or(defaults.weights, |w| w.name().to_owned()),
            context: self.context()?,
            ar: self.ar()?,
            cache_dir: self.cache_dir.clone(),
            layer_windows: self.layer_windows.clone(),
            last_row: !self.all_row_prefill,
            chat_template: self.chat_template.clone(),
            tokenizer: self.tokenizer.clone(),
        })
    }

    /// `--kv-dtype`, when given.
    pub fn kv_dtype(&self) -> Result<Option<DataType>, EngineError> {
        let parse = |s: &str| {
            s.parse::<DataType>()
                .map_err(|e| bad(format!("--kv-dtype: {e}")))
        };
        self.kv_dtype.as_deref().map(parse).transpose()
    }

    /// `--weights`, when given.
    pub fn weights(&self) -> Result<Option<WeightType>, EngineError> {
        let parse = |s: &str| {
            s.parse::<WeightType>()
                .map_err(|e| bad(format!("--weights: {e}")))
        };
        self.weights.as_deref().map(parse).transpose()
    }

    fn context(&self) -> Result<Option<usize>, EngineError> {
        match self.context {
            Some(0) => Err(bad("--context must be > 0".into())),
            n => Ok(n),
        }
    }

    /// `--ar`, else the context's default variants with speculation's and the beams' added.
    fn ar(&self) -> Result<Vec<usize>, EngineError> {
        if let Some(ar) = &self.ar {
            if ar.is_empty() || ar.contains(&0) {
                return Err(bad(format!("--ar {ar:?}: every AR variant must be > 0")));
            }
            return Ok(ar.clone());
        }
        let mut ar = crate::config::default_ar(self.context.unwrap_or(usize::MAX));
        if let Some(kind) = &self.speculate {
            ar = kind.with_verify_ar(ar);
        }
        ar.extend(self.beams.filter(|&b| b > 1));
        ar.sort_unstable();
        ar.dedup();
        Ok(ar)
    }

    fn backend(&self) -> Result<BackendChoice, EngineError> {
        match self.backend.as_deref().unwrap_or("reference") {
            "reference" => self.reference(),
            "qnn" => self.qnn(),
            other => Err(bad(format!(
                "--backend must be `reference` or `qnn`, got `{other}`"
            ))),
        }
    }

    /// The reference backend runs in process: QNN options would be ignored silently.
    fn reference(&self) -> Result<BackendChoice, EngineError> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let qnn_given = [
            ("--qnn-backend", path(&self.qnn_backend)),
            ("--qnn-system", path(&self.qnn_system)),
            (
                "--qnn-memory",
                self.qnn_memory.clone().filter(|m| m != "auto"),
            ),
            (
                "--qnn-max-handles",
                self.qnn_max_handles.map(|n| n.to_string()),
            ),
        ];
        match qnn_given.into_iter().find_map(|(n, v)| Some((n, v?))) {
            Some((name, value)) => Err(bad(format!(
                "{name} {value} applies only to --backend qnn (the reference backend runs in \
                 process)"
            ))),
            None => Ok(BackendChoice::Reference),
        }
    }

    fn qnn(&self) -> Result<BackendChoice, EngineError> {
        let memory = self.qnn_memory.as_deref().unwrap_or("auto");
        let memory = (memory.parse()).map_err(|e: String| bad(format!("--qnn-memory: {e}")))?;
        let backend_lib = crate::qnn_libs::backend_library(self.qnn_backend.as_deref())
            .ok_or_else(|| {
                bad(format!(
                    "--backend qnn needs the QNN backend library (libQnnHtp.so): --qnn-backend \
                     PATH or $HTPKV_QNN_BACKEND (or {})",
                    crate::qnn_libs::FETCH_QNN
                ))
            })?;
        let system_lib = crate::qnn_libs::system_library(self.qnn_system.as_deref(), &backend_lib);
        Ok(BackendChoice::Qnn {
            backend_lib,
            system_lib,
            memory,
            max_handles: (self.qnn_max_handles).unwrap_or(crate::qnn_memory::DEFAULT_MAX_HANDLES),
        })
    }
}

fn bad(message: String) -> EngineError {
    EngineError::BadOption(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(spec: EngineSpec) -> String {
        let err = spec.resolve().unwrap_err();
        assert_eq!(err.kind(), "bad_option", "{err}");
        err.to_string()
    }

    #[test]
    fn nothing_given_is_the_engine_defaults() {
        let (o, d) = (
            EngineSpec::default().resolve().unwrap(),
            EngineOptions::default(),
        );
        assert!(matches!(o.backend, BackendChoice::Reference));
        assert_eq!(
            (o.strategy, o.kv_dtype, &o.weights),
            (d.strategy, d.kv_dtype, &d.weights)
        );
        assert_eq!((o.ar, o.context), (d.ar, d.context));
    }

    #[test]
    fn speculation_and_beams_join_the_default_variants_and_given_ones_stay() {
        let spec = EngineSpec {
            context: Some(256),
            speculate: Some(SpecKind::parse("prompt-lookup:4").unwrap()),
            beams: Some(3),
            ..EngineSpec::default()
        };
        let mut want = crate::config::default_ar(256);
        want.extend([3, 5]);
        want.sort_unstable();
        want.dedup();
        assert_eq!(spec.resolve().unwrap().ar, want);
        let given = EngineSpec {
            ar: Some(vec![1, 8]),
            ..spec
        };
        assert_eq!(given.resolve().unwrap().ar, [1, 8]);
    }

    #[test]
    fn bad_spellings_name_the_option() {
        let cases = [
            (
                EngineSpec {
                    backend: Some("gpu".into()),
                    ..Default::default()
                },
                "--backend",
            ),
            (
                EngineSpec {
                    kv_dtype: Some("u12".into()),
                    ..Default::default()
                },
                "--kv-dtype",
            ),
            (
                EngineSpec {
                    weights: Some("i7".into()),
                    ..Default::default()
                },
                "--weights",
            ),
            (
                EngineSpec {
                    update: Some("zigzag".into()),
                    ..Default::default()
                },
                "zigzag",
            ),
            (
                EngineSpec {
                    context: Some(0),
                    ..Default::default()
                },
                "--context",
            ),
            (
                EngineSpec {
                    ar: Some(vec![1, 0]),
                    ..Default::default()
                },
                "--ar",
            ),
            (
                EngineSpec {
                    qnn_memory: Some("host".into()),
                    ..Default::default()
                },
                "--qnn-memory host applies only to --backend qnn",
            ),
            (
                EngineSpec {
                    qnn_backend: Some("/x.so".into()),
                    ..Default::default()
                },
                "--qnn-backend /x.so applies only to --backend qnn",
            ),
        ];
        for (spec, needle) in cases {
            let m = message(spec);
            assert!(m.contains(needle), "{m} lacks {needle}");
        }
    }
}
