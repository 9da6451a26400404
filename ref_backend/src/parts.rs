//! Split models: a compiled model cut into N parts of consecutive layers, one graph per part and
//! AR variant, as Qualcomm AI Hub ships its LLMs (`{prompt|token}_ar{n}_cl{c}_{i}_of_{N}`).
//!
//! Part 1 takes `input_ids`, every other part the hidden state `hidden_in [1, n, dim]` (f32:
//! the residual stream passes between parts exactly, so a split model computes the whole
//! model's logits bit for bit); the last part gives `logits`, every other part `hidden_out
//! [1, n, dim]` f32. Each part holds the K/V tensors of its own layers (named by the absolute
//! layer). With RoPE tables the positions come as `position_ids_cos` and `position_ids_sin`
//! `[1, 1, n, head_dim / 2]` f32 (the cosine and sine of each row's angle per rotated pair)
//! instead of `positions`.
//!
//! Two ways to cut ([`Split`]): htpkv's own ([`Split::Balanced`]: consecutive layers, sizes
//! differing by at most one, part 1 embeds and runs the first layers) and AI Hub's
//! ([`Split::AiHub`], as `qai_hub_models/models/_shared/llm/split_onnx_utils` cuts its exports):
//! part 1 holds only the embedding (`input_ids` to the hidden state; no positions, mask or K/V),
//! the layers follow `ceil(n_layers / (N - 1))` per part (the last part the rest, the final norm
//! and the LM head), and the hidden state between parts is named after the ONNX tensor at the
//! cut: `_model_model_embed_tokens_Gather_output_0` after the embedding,
//! `_model_model_layers_{k}_Add_1_output_0` after layer k (its second residual add).

use std::ops::Range;

pub use graph_io::Split;
use graph_io::{PositionInput, Preset};

use crate::options::CompileOptions;

/// One part of a split model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// 0-based part index.
    pub index: usize,
    /// Number of parts.
    pub count: usize,
    /// The layers this part runs.
    pub layers: Range<usize>,
    /// Positions as cos/sin tables (`position_ids_cos`/`_sin`) instead of position ids.
    pub rope_tables: bool,
    /// The IO convention naming the graphs and tensors (and, through the QNN library, their
    /// presentation), recorded in the file. ExecuTorch's files keep htpkv's tensor names inside
    /// ([`Preset::tensor_names`]).
    pub naming: Preset,
    /// How the model was cut (recorded in the file).
    pub split: Split,
}

/// Why `naming` cannot name `count` parts with these AR variants and positions (`None`: it can):
/// what its convention declares ([`graph_io::Convention::refusal`]; ExecuTorch's method names
/// tell neither parts nor several AR-n variants apart).
pub fn naming_refusal(
    naming: Preset,
    count: usize,
    rope_tables: bool,
    ar: &[usize],
) -> Option<String> {
    naming.convention().refusal(count, rope_tables, ar)
}

impl Part {
    /// The whole model as its one part, with position ids, under the default naming (htpkv's
    /// own graphs).
    pub fn whole(n_layers: usize) -> Part {
        Part {
            index: 0,
            count: 1,
            layers: 0..n_layers,
            rope_tables: false,
            naming: Preset::default(),
            split: Split::Balanced,
        }
    }

    /// `count` parts of consecutive layers of an `n_layers` model under the names parts of
    /// htpkv's files take ([`Preset::parts_naming`]: AI Hub's); sizes differ by at most one,
    /// earlier parts the larger. Every part needs at least one layer.
    pub fn split(n_layers: usize, count: usize, rope_tables: bool) -> Result<Vec<Part>, String> {
        Part::split_named(
            n_layers,
            count,
            rope_tables,
            parts_naming(Preset::default())?,
        )
    }

    /// [`Part::split`] under `naming` (see [`naming_refusal`]: a naming whose graph names carry
    /// no part number names only the whole model).
    pub fn split_named(
        n_layers: usize,
        count: usize,
        rope_tables: bool,
        naming: Preset,
    ) -> Result<Vec<Part>, String> {
        if let Some(reason) = naming_refusal(naming, count, rope_tables, &[]) {
            return Err(reason);
        }
        if count == 0 || count > n_layers {
            return Err(format!(
                "{count} parts for {n_layers} layers: expected 1 to {n_layers}"
            ));
        }
        let (base, extra) = (n_layers / count, n_layers % count);
        let mut start = 0;
        Ok((0..count)
            .map(|index| {
                let len = base + usize::from(index < extra);
                start += len;
                Part {
                    index,
                    count,
                    layers: start - len..start,
                    rope_tables,
                    naming,
                    split: Split::Balanced,
                }
            })
            .collect())
    }

    /// The parts of `split` ([`Part::split_named`] for [`Split::Balanced`]). AI Hub's split is
    /// for AI Hub's names, at least 2 parts (the embedding and one of layers), and refuses a count
    /// that leaves a part without layers.
    pub fn split_as(
        n_layers: usize,
        count: usize,
        rope_tables: bool,
        naming: Preset,
        split: Split,
    ) -> Result<Vec<Part>, String> {
        if split == Split::Balanced {
            return Part::split_named(n_layers, count, rope_tables, naming);
        }
        if naming.convention().split != split {
            let owner = Preset::owning(split).map_or("no".into(), |p| p.name());
            return Err(format!(
                "the {split} split is for the {owner} convention, not {naming}"
            ));
        }
        if count < 2 || count > n_layers + 1 {
            return Err(format!(
                "AI Hub's split of {n_layers} layers takes 2 to {} parts (the embedding, then \
                 layers), not {count}",
                n_layers + 1
            ));
        }
        let per = n_layers.div_ceil(count - 1);
        if n_layers.div_ceil(per) != count - 1 {
            return Err(format!(
                "AI Hub's split of {n_layers} layers into {count} parts: {per} layers per part \
                 fill only {} parts after the embedding",
                n_layers.div_ceil(per)
            ));
        }
        Ok((0..count)
            .map(|index| Part {
                index,
                count,
                layers: match index {
                    0 => 0..0,
                    i => (i - 1) * per..(i * per).min(n_layers),
                },
                rope_tables,
                naming,
                split,
            })
            .collect())
    }

    /// True for a part that runs no layer (AI Hub's part 1: the embedding only): it takes only
    /// the token ids.
    pub fn embeds_only(&self) -> bool {
        self.layers.is_empty()
    }

    /// The name of the hidden state this part gives (not the last part).
    pub fn hidden_out_name(&self) -> String {
        match self.split {
            Split::Balanced => "hidden_out".into(),
            Split::AiHub if self.layers.is_empty() => {
                "_model_model_embed_tokens_Gather_output_0".into()
            }
            Split::AiHub => format!("_model_model_layers_{}_Add_1_output_0", self.layers.end - 1),
        }
    }

    /// The name of the hidden state this part takes (not the first part): the name the part
    /// before it gives.
    pub fn hidden_in_name(&self) -> String {
        match self.split {
            Split::Balanced => "hidden_in".into(),
            Split::AiHub if self.layers.start == 0 => {
                "_model_model_embed_tokens_Gather_output_0".into()
            }
            Split::AiHub => format!(
                "_model_model_layers_{}_Add_1_output_0",
                self.layers.start - 1
            ),
        }
    }

    /// True for the part that takes the token ids.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// True for the part that gives the logits.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// True for a part that holds the embedding matrix: the first (token lookup) and, with a
    /// tied classifier, the last (the LM head is the embedding).
    pub fn holds_embedding(&self, tied_output: bool) -> bool {
        self.is_first() || (self.is_last() && tied_output)
    }

    /// The name of the AR-`n` graph, written by the naming's convention: AI Hub's
    /// `prompt_ar{n}_cl{c}_{i}_of_{N}` for `n > 1`, else `token_…`; ExecuTorch's `prefill_forward` /
    /// `kv_forward`; htpkv's `ar{n}_cl{c}`.
    pub fn graph_name(&self, n: usize, context: usize) -> String {
        let part = graph_io::PartOf {
            index: self.index,
            count: self.count,
        };
        self.naming.graph_name(n, context, part)
    }
}

/// The preset parts of a model named by `naming` take ([`Preset::parts_naming`]), or why there
/// is none.
pub fn parts_naming(naming: Preset) -> Result<Preset, String> {
    naming.parts_naming().ok_or_else(|| {
        format!(
            "the {naming} convention writes one file, never parts: its graph names carry no part \
             number"
        )
    })
}

/// Whether a part under `naming` takes RoPE tables: what its convention's layout declares.
pub fn takes_rope_tables(naming: Preset) -> bool {
    naming.convention().layout.positions == PositionInput::RopeTables
}

/// Refuses a part whose naming cannot express the model compiled with `o` ([`naming_refusal`];
/// a convention with a fixed layout, ExecuTorch's, refuses any other K/V layout).
pub(crate) fn check_naming(part: &Part, o: &CompileOptions) -> Result<(), String> {
    let convention = part.naming.convention();
    if let Some(reason) = convention.refusal(part.count, part.rope_tables, &o.ar) {
        return Err(reason);
    }
    if let Some(reason) = o.last_row.then(|| convention.last_row_refusal()).flatten() {
        return Err(reason);
    }
    match convention.layout_refusal(o.granularity, o.k_layout) {
        Some(reason) => Err(reason),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_layer_once() {
        let parts = Part::split(5, 2, true).unwrap();
        assert_eq!(parts[0].layers, 0..3);
        assert_eq!(parts[1].layers, 3..5);
        assert!(parts[0].is_first() && !parts[0].is_last() && parts[1].is_last());
        assert_eq!(Part::whole(5).graph_name(1, 64), "ar1_cl64");
        assert_eq!(parts[1].graph_name(1, 64), "token_ar1_cl64_2_of_2");
        assert_eq!(parts[0].graph_name(32, 64), "prompt_ar32_cl64_1_of_2");
        assert!(Part::split(5, 6, false).is_err());
        assert!(Part::split(5, 0, false).is_err());
        assert_eq!(Part::split(5, 5, false).unwrap()[4].layers, 4..5);
        assert_eq!(parts[0].hidden_out_name(), "hidden_out");
        assert_eq!(parts[1].hidden_in_name(), "hidden_in");
    }

    /// AI Hub's rule on its own models' sizes (n_layers, NUM_SPLITS -> layers per part) and on
    /// stories260K; the hidden state named after the cut.
    #[test]
    fn ai_hub_split_puts_the_embedding_alone_in_part_1() {
        let layers = |n, count| -> Vec<Range<usize>> {
            Part::split_as(n, count, true, Preset::AiHub, Split::AiHub)
                .unwrap()
                .into_iter()
                .map(|p| p.layers)
                .collect()
        };
        assert_eq!(layers(36, 4), [0..0, 0..12, 12..24, 24..36]); // Qwen3-4B
        assert_eq!(layers(28, 4), [0..0, 0..10, 10..20, 20..28]); // Llama-3.2-3B
        assert_eq!(layers(28, 2), [0..0, 0..28]); // Qwen3-0.6B
        assert_eq!(layers(5, 2), [0..0, 0..5]);
        assert_eq!(layers(5, 3), [0..0, 0..3, 3..5]);
        let p = Part::split_as(5, 3, true, Preset::AiHub, Split::AiHub).unwrap();
        assert!(p[0].embeds_only() && !p[1].embeds_only());
        assert_eq!(
            p[0].hidden_out_name(),
            "_model_model_embed_tokens_Gather_output_0"
        );
        assert_eq!(
            p[1].hidden_in_name(),
            "_model_model_embed_tokens_Gather_output_0"
        );
        assert_eq!(
            p[1].hidden_out_name(),
            "_model_model_layers_2_Add_1_output_0"
        );
        assert_eq!(
            p[2].hidden_in_name(),
            "_model_model_layers_2_Add_1_output_0"
        );
        assert_eq!(p[2].graph_name(1, 64), "token_ar1_cl64_3_of_3");
        // 5 layers in 4 layer parts of 2 leave one empty; 1 part has no layers; htpkv's names.
        let err = |n, c, naming| Part::split_as(n, c, true, naming, Split::AiHub).unwrap_err();
        assert!(err(5, 5, Preset::AiHub).contains("fill only 3 parts"));
        assert!(err(5, 1, Preset::AiHub).contains("2 to 6 parts"));
        assert!(err(5, 2, Preset::Htpkv).contains("for the aihub convention"));
        assert_eq!(Split::from_name("aihub"), Some(Split::AiHub));
    }
}
