//! Turning the arguments Java passes into engine and generation options.
//!
//! Java passes `null` (or 0 / an empty array) for "use the engine's default"; anything given is
//! checked here or by the engine, and a bad value is a `bad_option` error naming what was expected.

use crate::error::GlueError;
use htpkv::engine::{EngineOptions, EngineSpec};
use htpkv::sampler::SamplerOptions;
use htpkv::session::{GenerateOptions, StopReason};
use htpkv::speculate::SpecKind;
use std::path::PathBuf;

/// The arguments of `HtpkvSession.open`, as Java passed them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpenArgs {
    /// The model as `--model` spells it: a GGUF file, a Hugging Face folder, a llama2.c checkpoint
    /// or directory (None: the engine's model discovery).
    pub model_dir: Option<String>,
    /// A compiled model file (context binary) to use instead of compiling.
    pub compiled: Option<String>,
    /// `reference` (default) or `qnn`.
    pub backend: Option<String>,
    /// QNN backend library (`libQnnHtp.so`); required for `qnn`.
    pub backend_lib: Option<String>,
    /// QNN system library (`libQnnSystem.so`); optional for `qnn`.
    pub system_lib: Option<String>,
    /// `shift`, `conveyor`, `smart_mask` or `naive`.
    pub strategy: Option<String>,
    /// KV cache element type: `u8`, `u16`, `f16`, `f32`.
    pub kv_dtype: Option<String>,
    /// Weight type for compiling: `i8`, `f16`, `f32`.
    pub weights: Option<String>,
    /// Context length; 0 means the model's own.
    pub context: i32,
    /// AR variants (tokens per step), e.g. `[1, 32]`; empty means the default.
    pub ar: Vec<i32>,
    /// Where compiled models are cached (None: the engine's default; an Android app passes its
    /// `cacheDir`, since `$HOME` is not set there).
    pub cache_dir: Option<String>,
    /// Speculative decoding as `--speculate` spells it (`prompt-lookup[:K]`, `lookahead[:W,N,G]`,
    /// `draft:PATH[:K]`); None: plain decoding.
    pub speculate: Option<String>,
    /// A chat template file (`--chat-template`) used instead of the model's own; None: the
    /// model's.
    pub chat_template: Option<String>,
}

impl OpenArgs {
    /// The engine options these arguments ask for, read by the engine's one reader of option
    /// spellings ([`EngineSpec`]), whose messages name each option as the CLI spells it.
    pub fn to_engine_options(&self) -> Result<EngineOptions, GlueError> {
        let path = |v: &Option<String>| non_empty(v).map(PathBuf::from);
        let text = |v: &Option<String>| non_empty(v).map(str::to_owned);
        // An app names its libraries: on a device there is no fetched copy or environment to
        // fall back on, as the CLI has.
        if non_empty(&self.backend) == Some("qnn") && non_empty(&self.backend_lib).is_none() {
            return Err(GlueError::bad_option(
                "the `qnn` backend needs the path of a QNN backend library (e.g. libQnnHtp.so)",
            ));
        }
        let spec = EngineSpec {
            model: path(&self.model_dir),
            compiled: path(&self.compiled),
            backend: text(&self.backend),
            qnn_backend: path(&self.backend_lib),
            qnn_system: path(&self.system_lib),
            update: text(&self.strategy),
            kv_dtype: text(&self.kv_dtype),
            weights: text(&self.weights),
            context: match self.context {
                0 => None,
                n => Some(positive(n, "context")?),
            },
            ar: (!self.ar.is_empty())
                .then(|| {
                    self.ar
                        .iter()
                        .map(|&n| positive(n, "an AR variant"))
                        .collect()
                })
                .transpose()?,
            speculate: self.speculation()?,
            cache_dir: path(&self.cache_dir),
            chat_template: path(&self.chat_template),
            ..EngineSpec::default()
        };
        Ok(spec.resolve()?)
    }

    /// The speculative decoding asked for (`bad_option` naming the spelling when it does not parse).
    pub fn speculation(&self) -> Result<Option<SpecKind>, GlueError> {
        non_empty(&self.speculate)
            .map(|spec| SpecKind::parse(spec).map_err(|e| GlueError::new(e.kind(), e.to_string())))
            .transpose()
    }
}

/// The fields of a Java `SamplerOptions`, as read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerArgs {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: i32,
    pub seed: i64,
}

impl Default for SamplerArgs {
    /// The Java defaults, which are the runtime's.
    fn default() -> Self {
        let d = SamplerOptions::default();
        SamplerArgs {
            temperature: d.temperature,
            top_p: d.top_p,
            top_k: 0,
            min_p: d.min_p,
            repeat_penalty: d.repeat_penalty,
            presence_penalty: d.presence_penalty,
            frequency_penalty: d.frequency_penalty,
            penalty_last_n: d.penalty_last_n as i32,
            seed: d.seed as i64,
        }
    }
}

/// Generation options from Java's `maxTokens`, sampler fields and stop strings. The seed's 64 bits
/// are used as they are (a negative Java `long` is a large seed); the values are checked by the
/// sampler and the generation (kind `bad_option`).
pub fn generate_options(
    max_tokens: i32,
    s: &SamplerArgs,
    stop: Vec<String>,
) -> Result<GenerateOptions, GlueError> {
    let max_tokens = length(max_tokens, "maxTokens")?;
    let sampler = SamplerOptions {
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: length(s.top_k, "topK")?,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        penalty_last_n: length(s.penalty_last_n, "penaltyLastN")?,
        seed: s.seed as u64,
    };
    Ok(GenerateOptions {
        stop,
        ..GenerateOptions::new(max_tokens, sampler)
    })
}

/// A Java `int` that must be a length or position (>= 0).
pub fn length(value: i32, what: &str) -> Result<usize, GlueError> {
    usize::try_from(value)
        .map_err(|_| GlueError::bad_option(format!("{what} must be >= 0, got {value}")))
}

/// A count as a Java `int`, saturating at `i32::MAX`.
pub fn to_jint(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A count as a Java `long`, saturating at `i64::MAX`.
pub fn to_jlong(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The Java name of a stop reason (`Generation.stopReason()`).
pub fn stop_name(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndOfText => "end_of_text",
        StopReason::MaxTokens => "max_tokens",
        StopReason::ContextFull => "context_full",
        StopReason::Callback => "callback",
        StopReason::StopString => "stop_string",
        StopReason::Cancelled => "cancelled",
    }
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.is_empty())
}

fn positive(value: i32, what: &str) -> Result<usize, GlueError> {
    match usize::try_from(value) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(GlueError::bad_option(format!(
            "{what} must be > 0, got {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::KIND_BAD_OPTION;
    use htpkv::engine::BackendChoice;
    use htpkv::kv_manager::Strategy;
    use htpkv::quant::DataType;

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn empty_arguments_give_the_engine_defaults() {
        let o = OpenArgs::default().to_engine_options().unwrap();
        let d = EngineOptions::default();
        assert!(matches!(o.backend, BackendChoice::Reference));
        assert_eq!(o.strategy, d.strategy);
        assert_eq!(o.kv_dtype, d.kv_dtype);
        assert_eq!(o.weights, d.weights);
        assert_eq!(o.ar, d.ar);
        assert_eq!(o.context, None);
        assert_eq!(o.model_dir, None);
        assert_eq!(o.cache_dir, None);
        assert_eq!(o.chat_template, None);
    }

    #[test]
    fn given_arguments_are_used() {
        let args = OpenArgs {
            model_dir: some("/m"),
            compiled: some("/m/model.bin"),
            backend: some("qnn"),
            backend_lib: some("/lib/libQnnHtp.so"),
            system_lib: some("/lib/libQnnSystem.so"),
            strategy: some("conveyor"),
            kv_dtype: some("u8"),
            weights: some("f16"),
            context: 256,
            ar: vec![1, 64],
            cache_dir: some("/cache"),
            speculate: None,
            chat_template: some("/m/chat.jinja"),
        };
        let o = args.to_engine_options().unwrap();
        assert_eq!(o.model_dir, Some(PathBuf::from("/m")));
        assert_eq!(o.compiled, Some(PathBuf::from("/m/model.bin")));
        match o.backend {
            BackendChoice::Qnn {
                backend_lib,
                system_lib,
                ..
            } => {
                assert_eq!(backend_lib, PathBuf::from("/lib/libQnnHtp.so"));
                assert_eq!(system_lib, Some(PathBuf::from("/lib/libQnnSystem.so")));
            }
            other => panic!("expected qnn, got {other:?}"),
        }
        assert_eq!(o.strategy, Strategy::Conveyor);
        assert_eq!(o.kv_dtype, DataType::U8);
        assert_eq!(o.weights, "f16");
        assert_eq!(o.context, Some(256));
        assert_eq!(o.ar, vec![1, 64]);
        assert_eq!(o.cache_dir, Some(PathBuf::from("/cache")));
        assert_eq!(o.chat_template, Some(PathBuf::from("/m/chat.jinja")));
    }

    #[test]
    fn speculation_adds_its_verification_variant_unless_variants_are_given() {
        let spec = |s: &str, ar: Vec<i32>| OpenArgs {
            speculate: some(s),
            ar,
            ..Default::default()
        };
        let o = spec("prompt-lookup:4", vec![]).to_engine_options().unwrap();
        assert!(o.ar.contains(&5), "{:?}", o.ar);
        let o = spec("prompt-lookup:4", vec![1, 8])
            .to_engine_options()
            .unwrap();
        assert_eq!(o.ar, vec![1, 8]);
        let err = spec("guess", vec![]).to_engine_options().unwrap_err();
        assert_eq!(err.kind(), KIND_BAD_OPTION);
        assert!(err.to_string().contains("guess"), "{err}");
    }

    #[test]
    fn bad_arguments_are_bad_options_naming_what_was_expected() {
        let cases: Vec<(OpenArgs, &str)> = vec![
            (
                OpenArgs {
                    backend: some("qnn"),
                    ..Default::default()
                },
                "libQnnHtp.so",
            ),
            (
                OpenArgs {
                    backend: some("gpu"),
                    ..Default::default()
                },
                "`reference` or `qnn`",
            ),
            (
                OpenArgs {
                    backend_lib: some("/x.so"),
                    ..Default::default()
                },
                "applies only to --backend qnn",
            ),
            (
                OpenArgs {
                    weights: some("i7"),
                    ..Default::default()
                },
                "--weights",
            ),
            (
                OpenArgs {
                    kv_dtype: some("u12"),
                    ..Default::default()
                },
                "u8, u16",
            ),
            (
                OpenArgs {
                    context: -5,
                    ..Default::default()
                },
                "context must be > 0",
            ),
            (
                OpenArgs {
                    ar: vec![1, 0],
                    ..Default::default()
                },
                "AR variant must be > 0",
            ),
        ];
        for (args, expected) in cases {
            let err = args.to_engine_options().unwrap_err();
            assert_eq!(err.kind(), KIND_BAD_OPTION, "{args:?}");
            assert!(err.to_string().contains(expected), "{err} lacks {expected}");
        }
        let strategy = OpenArgs {
            strategy: some("zigzag"),
            ..Default::default()
        }
        .to_engine_options()
        .unwrap_err();
        assert_eq!(strategy.kind(), KIND_BAD_OPTION, "{strategy}");
    }

    #[test]
    fn generate_options_check_counts_and_keep_seed_bits() {
        let args = SamplerArgs {
            seed: -1,
            top_k: 40,
            min_p: 0.05,
            repeat_penalty: 1.1,
            ..SamplerArgs::default()
        };
        let g = generate_options(40, &args, vec!["\n\n".into()]).unwrap();
        assert_eq!(g.max_tokens, 40);
        assert_eq!(g.sampler.seed, u64::MAX);
        assert_eq!((g.sampler.top_k, g.sampler.min_p), (40, 0.05));
        assert_eq!(g.sampler.repeat_penalty, 1.1);
        assert_eq!(g.stop, ["\n\n"]);
        assert_eq!(SamplerArgs::default().penalty_last_n, 64);
        let bad = |a: SamplerArgs, n| generate_options(n, &a, vec![]).unwrap_err().kind();
        assert_eq!(bad(SamplerArgs::default(), -1), KIND_BAD_OPTION);
        let top_k = SamplerArgs {
            top_k: -1,
            ..SamplerArgs::default()
        };
        assert_eq!(bad(top_k, 1), KIND_BAD_OPTION);
        assert_eq!(length(-3, "len").unwrap_err().kind(), KIND_BAD_OPTION);
        assert_eq!(to_jint(usize::MAX), i32::MAX);
        assert_eq!(stop_name(StopReason::Callback), "callback");
        assert_eq!(stop_name(StopReason::Cancelled), "cancelled");
    }
}
