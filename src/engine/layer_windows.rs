//! `--layer-window LAYERS:W`: per-layer attention windows set over the model's own. A model's
//! windows (Gemma 3's local layers, a Hugging Face `config.json`'s, see
//! [`model::LlamaConfig::layer_windows`]) are honoured without it; the option overrides the
//! layers it names (e.g. a longer window on Gemma's local layers) or sets windows on a model
//! without any (a llama2.c checkpoint, to try a sliding-window layout on a small model).

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

/// Sets `specs` over `config`'s own windows: refused for a layer outside the model or a layer
/// given two different windows. Layers not listed keep the model's window (global by default).
pub fn apply_layer_windows(
    config: &mut LlamaConfig,
    specs: &[LayerWindows],
) -> Result<(), EngineError> {
    if specs.is_empty() {
        return Ok(());
    }
    let bad = |m: String| Err(EngineError::BadOption(format!("--layer-window: {m}")));
    let mut windows = vec![None; config.n_layers];
    let mut given = vec![None; config.n_layers];
    for spec in specs {
        for &layer in &spec.layers {
            let Some(slot) = windows.get_mut(layer) else {
                return bad(format!(
                    "layer {layer} is outside the model's {} layers",
                    config.n_layers
                ));
            };
            match given[layer] {
                Some(w) if w != spec.window => {
                    return bad(format!(
                        "layer {layer} is given two windows, {w} and {}",
                        spec.window
                    ));
                }
                _ => (*slot, given[layer]) = (Some(spec.window), Some(spec.window)),
            }
        }
    }
    for (l, w) in windows.iter_mut().enumerate() {
        if w.is_none() {
            *w = config.layer_window(l);
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
        // Over a model's own windows: the named layers change, the others keep theirs.
        apply_layer_windows(&mut c, &[spec("1:8")]).unwrap();
        assert_eq!(c.layer_windows, [Some(4), Some(8)]);
        apply_layer_windows(&mut c, &[spec("0:16")]).unwrap();
        assert_eq!(c.layer_windows, [Some(16), Some(8)]);
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
