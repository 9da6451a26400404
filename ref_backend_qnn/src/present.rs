//! How graphs and tensors are presented to clients: under the naming the file records, or the
//! one [`NAMES_ENV`] asks for (names, order, K/V dims and mask encoding), each read from what the
//! naming's convention declares.

use graph_io::{IoRules, MaskEncoding};
use qnn_ffi::{Quantization, TensorInfo, TensorType, dtype_to_qnn};
use ref_backend::{IoRole, IoTensor, Preset};

/// The QNN description of a compiled tensor (what the system provider reports) under `naming`.
pub fn tensor_info(
    desc: &IoTensor,
    id: u32,
    tensor_type: TensorType,
    naming: Preset,
) -> TensorInfo {
    let attend_max = converts_mask(naming) && is_u16_mask(desc);
    let quant = match &desc.encoding() {
        // An attend-max mask is a 0..1 multiplier quantized to u16 (65535 attend, 0 masked).
        _ if attend_max => Quantization::PerTensor {
            scale: 1.0 / 65535.0,
            offset: 0,
        },
        quant::Encoding::Float => Quantization::None,
        quant::Encoding::PerTensor(so) => Quantization::PerTensor {
            scale: so.scale,
            offset: so.offset,
        },
        quant::Encoding::PerAxis { axis, params } => Quantization::PerAxis {
            axis: *axis as i32,
            scale_offsets: params.iter().map(|p| (p.scale, p.offset)).collect(),
        },
    };
    TensorInfo {
        id,
        name: reported_tensor_name(desc, naming),
        tensor_type,
        dtype: dtype_to_qnn(desc.dtype),
        shape: reported_shape(desc, naming)
            .iter()
            .map(|&d| d as u32)
            .collect(),
        quant,
    }
}

/// Environment variable overriding how the library presents graphs and tensors. Unset, each model
/// is presented by the naming its file records ([`ref_backend::Preset`]: `htpkv compile
/// --convention htpkv|aihub|executorch`); set, every model is presented one way, so that the
/// runtime's conventions are exercised on binaries compiled otherwise (a test device, not a
/// setting for users):
/// - `htpkv`: htpkv's own names and order;
/// - `aihub`: the names of Qualcomm AI Hub's LLM exports — graphs `{token|prompt}_ar{n}_cl{S}_{i}_of_{N}` (`1_of_1` for a whole model),
///   `position_ids`, `past_key_{layer}_in` / `_out`, `past_value_{layer}_in` / `_out` (per head:
///   `past_key_{layer}_h{head}_in`, …);
/// - `executorch`: ExecuTorch's Qualcomm llama layout — graphs `kv_forward` (AR-1) and
///   `prefill_forward`, IO in index order (tokens, mask, positions, K of every layer, V of every
///   layer; outputs logits, K…, V…) under names no convention knows, K/V dims `[1, kv_heads, ., .]`,
///   and a u16 mask reported as ExecuTorch's 0..1 multiplier (scale 1/65535, offset 0: 65535
///   attend, 0 masked) and converted to the executor's additive encoding.
pub const NAMES_ENV: &str = "HTPKV_REF_QNN_NAMES";

/// How graph `g` is presented: the naming its file records, unless [`NAMES_ENV`] overrides it.
pub fn presented(g: &ref_backend::Graph) -> Preset {
    std::env::var(NAMES_ENV)
        .ok()
        .and_then(|v| v.parse::<Preset>().ok())
        .unwrap_or(g.part().naming)
}

/// The name graph `g` is reported and retrieved under (see [`presented`]).
pub fn reported_graph_name(g: &ref_backend::Graph) -> String {
    let naming = presented(g);
    if naming == g.part().naming {
        return g.name().to_string();
    }
    let mut part = g.part().clone();
    part.naming = naming;
    part.graph_name(g.ar(), g.context())
}

/// True when a graph presented under `naming` takes its mask as the executor's additive one
/// converted from the convention's attend-max encoding (ExecuTorch's).
pub fn converts_mask(naming: Preset) -> bool {
    naming.convention().mask == MaskEncoding::AttendMax
}

/// True for the u16 mask, the one an attend-max convention's client fills.
pub(crate) fn is_u16_mask(desc: &IoTensor) -> bool {
    desc.role == IoRole::Mask && desc.dtype == quant::DataType::U16
}

/// The name tensor `desc` is reported under `naming`: written by the naming's convention (a
/// sliding window's mask keeps its name in every convention, and a tensor the convention has no
/// name for, such as the hidden state, keeps the file's; htpkv's files carry htpkv's names, so
/// under htpkv's naming every name is the file's); prefixed so that no convention knows them when
/// its IO is found by position (ExecuTorch's).
pub fn reported_tensor_name(desc: &IoTensor, naming: Preset) -> String {
    let convention = naming.convention();
    if matches!(convention.io, IoRules::ByIndex(_)) {
        return format!("et_{}", desc.name);
    }
    if desc.role == IoRole::Mask {
        return desc.name.clone();
    }
    let name = convention.tensor_name(desc.role, desc.layer, desc.head);
    name.expect("preset patterns are well-formed")
        .unwrap_or_else(|| desc.name.clone())
}

/// The dims tensor `desc` is reported with: K/V with the heads on the axis the naming's layout
/// declares ([`graph_io::HeadAxis`]: ExecuTorch's second).
pub fn reported_shape(desc: &IoTensor, naming: Preset) -> Vec<usize> {
    if !desc.role.is_kv() {
        return desc.shape.clone();
    }
    naming.convention().layout.heads.arrange(&desc.shape)
}

/// The graph's tensor indices in the order they are reported: the naming's index order when its
/// IO is found by position ([`graph_io::Convention::io_order`]), else as the model lists them.
pub fn reported_order(descs: &[IoTensor], naming: Preset) -> Vec<usize> {
    let roles: Vec<_> = descs.iter().map(|d| (d.role, d.layer, d.head)).collect();
    naming.convention().io_order(&roles)
}

/// ExecuTorch's u16 mask (65535 attend, 0 masked; reported with scale 1/65535 and offset 0) in
/// the executor's additive encoding (the zero point where visible, 0 where masked).
pub(crate) fn additive_from_attend_max(desc: &IoTensor, bytes: &[u8]) -> Option<Vec<u8>> {
    let Some(quant::Encoding::PerTensor(so)) = desc.quant.as_ref().map(|q| &q.encoding) else {
        return None;
    };
    let visible = u16::try_from(-so.offset).ok()?.to_le_bytes();
    Some(
        bytes
            .chunks_exact(2)
            .flat_map(|c| {
                if u16::from_le_bytes([c[0], c[1]]) >= 1 << 15 {
                    visible
                } else {
                    [0, 0]
                }
            })
            .collect(),
    )
}
