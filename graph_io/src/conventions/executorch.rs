//! ExecuTorch's Qualcomm llama export: methods `kv_forward` (AR-1) and `prefill_forward`, IO found
//! by position (tokens, mask, positions, then past K and past V per layer; logits, then new K and
//! new V per layer), a multiplicative mask at the type's extremes; per-layer K/V with K transposed
//! and the heads second (`k [1, kv_heads, D, rows]`), the layout ExecuTorch's runtime expects, in
//! one file.

use crate::convention::{Convention, GraphNaming, IndexOrder, IoRules, names};
use crate::packaging::{Packaging, Split};
use crate::role::IoRole;
use crate::tensor::MaskEncoding;

pub(crate) fn convention() -> Convention {
    Convention {
        name: "executorch".into(),
        graphs: names(&["{phase}_forward"]),
        io: IoRules::ByIndex(IndexOrder {
            inputs: vec![
                IoRole::InputIds,
                IoRole::Mask,
                IoRole::Positions,
                IoRole::PastKey,
                IoRole::PastValue,
            ],
            outputs: vec![IoRole::Logits, IoRole::NewKey, IoRole::NewValue],
        }),
        mask: MaskEncoding::AttendMax,
        graph_naming: GraphNaming {
            pattern: None,
            prompt: "prefill".into(),
            token: "kv".into(),
        },
        layout: crate::GraphLayout::EXECUTORCH,
        layout_fixed: true,
        last_row_graphs: false,
        packaging: Packaging::FileOnly,
        split: Split::Balanced,
    }
}
