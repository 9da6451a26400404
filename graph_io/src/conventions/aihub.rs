//! Qualcomm AI Hub's LLM exports and Genie bundles: graphs
//! `{prompt|token}_ar{n}_cl{c}_{i}_of_{N}`, K/V `past_{key|value}_{l}[_h{h}]_{in|out}` (the new
//! rows are the `_out` of the past names), RoPE tables `position_ids_cos` / `_sin`; per-layer K/V
//! with K transposed, packaged as a Genie bundle and cut as AI Hub cuts its exports (part 1 the
//! embedding alone).

use crate::convention::{Convention, GraphNaming, IoRules, NameTable, names};
use crate::packaging::{Packaging, Split};
use crate::tensor::MaskEncoding;

pub(crate) fn convention() -> Convention {
    Convention {
        name: "aihub".into(),
        graphs: names(&["{phase}_ar{ar}_cl{context}_{part}_of_{parts}"]),
        io: IoRules::ByName(Box::new(NameTable {
            tokens: names(&["input_ids"]),
            embeddings: names(&["input_embeds", "inputs_embeds"]),
            mask: names(&["attention_mask"]),
            positions: names(&["position_ids"]),
            rope_cos: names(&["position_ids_cos"]),
            rope_sin: names(&["position_ids_sin"]),
            logits: names(&["logits"]),
            past_key: names(&["past_key_{layer}_in", "past_key_{layer}_h{head}_in"]),
            past_value: names(&["past_value_{layer}_in", "past_value_{layer}_h{head}_in"]),
            new_key: names(&["past_key_{layer}_out", "past_key_{layer}_h{head}_out"]),
            new_value: names(&["past_value_{layer}_out", "past_value_{layer}_h{head}_out"]),
        })),
        mask: MaskEncoding::Additive,
        graph_naming: GraphNaming::default(),
        layout: crate::GraphLayout::AIHUB,
        layout_fixed: false,
        last_row_graphs: false,
        packaging: Packaging::GenieBundle,
        split: Split::AiHub,
    }
}
