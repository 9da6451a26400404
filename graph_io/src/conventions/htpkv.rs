//! htpkv's own convention: graphs `ar{n}_cl{c}` (read: any name, one part), tensors `input_ids`,
//! `positions`, `attention_mask`, `logits` and the K/V names of [`crate::KvTensor::name`].

use crate::convention::{Convention, GraphNaming, IoRules, NameTable, names};
use crate::kv::{KvIo, TensorKind, htpkv_kv_name};
use crate::packaging::{Packaging, Split};
use crate::tensor::MaskEncoding;

/// The per-layer and per-head patterns of one K/V tensor kind: [`crate::KvTensor::name`]'s rule
/// with the fields in place of the numbers.
fn kv(io: KvIo, kind: TensorKind) -> Vec<String> {
    vec![
        htpkv_kv_name(io, kind, "{layer}", None),
        htpkv_kv_name(io, kind, "{layer}", Some("{head}")),
    ]
}

pub(crate) fn convention() -> Convention {
    Convention {
        name: "htpkv".into(),
        graphs: Vec::new(),
        io: IoRules::ByName(Box::new(NameTable {
            tokens: names(&["input_ids"]),
            mask: vec![crate::mask_name(None), "mask".into()],
            positions: names(&["positions"]),
            logits: names(&["logits"]),
            past_key: kv(KvIo::Past, TensorKind::Key),
            past_value: kv(KvIo::Past, TensorKind::Value),
            new_key: kv(KvIo::New, TensorKind::Key),
            new_value: kv(KvIo::New, TensorKind::Value),
            ..NameTable::default()
        })),
        mask: MaskEncoding::Additive,
        graph_naming: GraphNaming {
            pattern: Some("ar{ar}_cl{context}".into()),
            ..GraphNaming::default()
        },
        layout: crate::GraphLayout::HTPKV,
        layout_fixed: false,
        last_row_graphs: true,
        packaging: Packaging::File,
        split: Split::Balanced,
    }
}
