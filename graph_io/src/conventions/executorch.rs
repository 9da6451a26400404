//! ExecuTorch's Qualcomm llama export: methods `kv_forward` (AR-1) and `prefill_forward`, IO found
//! by position (tokens, mask, positions, then past K and past V per layer; logits, then new K and
//! new V per layer), a multiplicative mask at the type's extremes.

use crate::convention::{Convention, GraphNaming, IndexOrder, IndexedRole, IoRules, names};
use crate::tensor::MaskEncoding;

pub(crate) fn convention() -> Convention {
    Convention {
        name: "executorch".into(),
        graphs: names(&["{phase}_forward"]),
        io: IoRules::ByIndex(IndexOrder {
            inputs: vec![
                IndexedRole::Tokens,
                IndexedRole::Mask,
                IndexedRole::Positions,
                IndexedRole::PastKeys,
                IndexedRole::PastValues,
            ],
            outputs: vec![
                IndexedRole::Logits,
                IndexedRole::NewKeys,
                IndexedRole::NewValues,
            ],
        }),
        mask: MaskEncoding::AttendMax,
        graph_naming: GraphNaming {
            pattern: None,
            prompt: "prefill".into(),
            token: "kv".into(),
        },
    }
}
