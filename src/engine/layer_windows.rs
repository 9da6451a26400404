//! `--layer-window LAYERS:W`: per-layer attention windows set on a model that has none (a
//! llama2.c checkpoint, a GGUF file), e.g. to try a sliding-window layout on a small model. A
//! Hugging Face model's own windows (`config.json`, see [`model::LlamaConfig::layer_windows`])
//! are honoured without it.

use super::EngineError;
use model::LlamaConfig;

/// Window `window` on the layers `layers`: the text `0,2,4:16`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerWindows {
    pub layers: Vec<usize>,
    pub window: usize,
}

impl std::str::FromStr for LayerWindows {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            |why: &str| format!("layer window `{s}`: {why} (expected LAYERS:W, e.g. 0,2,4:16)");
        let (layers, window) = s.split_once(':').ok_or_else(|| bad("no `:`"))?;
        let window = match window.trim().parse::<usize>() {
            Ok(w) if w > 0 => w,
            _ => return Err(bad("the window must be a positive integer")),
        };
        let layers = layers
            .split(',')
            .map(|l| l.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("the layers must be layer indices separated by commas"))?;
        Ok(LayerWindows { layers, window })
    }
}

impl std::fmt::Display for LayerWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layers: Vec<String> = self.layers.iter().map(usize::to_string).collect();
        write!(f, "{}:{}", layers.join(","), self.window)
    }
}

/// Sets `specs` on `config`: refused for a model that brings its own windows, a layer outside the
/// model, or a layer given two different windows. Layers not listed stay global.
pub fn apply_layer_windows(
    config: &mut LlamaConfig,
    specs: &[LayerWindows],
) -> Result<(), EngineError> {
    if specs.is_empty() {
        return Ok(());
    }
    let bad = |m: String| Err(EngineError::BadOption(format!("--layer-window: {m}")));
    if config.layer_windows.iter().any(Option::is_some) {
        return bad(
            "the model has its own per-layer windows (its config.json); the option sets windows on \
             a model without any"
                .into(),
        );
    }
    let mut windows = vec![None; config.n_layers];
    for spec in specs {
        for &layer in &spec.layers {
            let Some(slot) = windows.get_mut(layer) else {
                return bad(format!(
                    "layer {layer} is outside the model's {} layers",
                    config.n_layers
                ));
            };
            match *slot {
                Some(w) if w != spec.window => {
                    return bad(format!(
                        "layer {layer} is given two windows, {w} and {}",
                        spec.window
                    ));
                }
                _ => *slot = Some(spec.window),
            }
        }
    }
    config.layer_windows = windows;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print() {
        let s: LayerWindows = "0,2,4:16".parse().unwrap();
        assert_eq!(
            s,
            LayerWindows {
                layers: vec![0, 2, 4],
                window: 16
            }
        );
        assert_eq!(s.to_string(), "0,2,4:16");
        for bad in ["16", "0,2:", "0,2:0", "a:16", ":16", "0,,2:16", "0:-1"] {
            let e = bad.parse::<LayerWindows>().unwrap_err();
            assert!(e.starts_with(&format!("layer window `{bad}`")), "{e}");
        }
    }

    #[test]
    fn windows_are_set_once_per_layer_inside_the_model() {
        let mut c = model::llama2c::llama_config(&model::llama2c::Config {
            dim: 32,
            hidden_dim: 48,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            vocab_size: 64,
            seq_len: 64,
            shared_classifier: true,
        });
        let spec = |s: &str| s.parse::<LayerWindows>().unwrap();
        apply_layer_windows(&mut c, &[spec("0:4"), spec("0:4")]).unwrap();
        assert_eq!(c.layer_windows, [Some(4), None]);
        let e = apply_layer_windows(&mut c, &[spec("1:8")]).unwrap_err();
        assert!(
            e.to_string().contains("has its own per-layer windows"),
            "{e}"
        );
        c.layer_windows.clear();
        let e = apply_layer_windows(&mut c, &[spec("2:8")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--layer-window: layer 2 is outside the model's 2 layers"
        );
        let e = apply_layer_windows(&mut c, &[spec("0:4"), spec("0:8")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--layer-window: layer 0 is given two windows, 4 and 8"
        );
    }
}
