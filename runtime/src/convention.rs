//! IO conventions: how the tensors and graphs of a set of context binaries map to the roles the
//! runtime binds. The conventions themselves — the presets `htpkv`, `aihub`, `executorch` and YAML
//! files, with name patterns read by the runtime and written by the compiler — live in
//! [`graph_io`] ([`graph_io::conventions`] says how to add one); this module reads convention
//! files and encodes the inputs some conventions add (an attend-max mask, RoPE tables).

pub use graph_io::{
    Assigned, Convention, ConventionError, GraphName, GraphNames, IndexOrder, IoRules,
    MaskEncoding, NameTable, Preset, detect, role_label,
};
use std::path::Path;

/// A preset name, or else the path of a YAML convention file.
pub fn named_or_file(spec: &str) -> Result<Convention, ConventionError> {
    if let Ok(preset) = spec.parse::<Preset>() {
        return Ok(preset.convention());
    }
    let path = Path::new(spec);
    if !path.exists() {
        return Err(ConventionError::UnknownPreset(spec.to_string()));
    }
    let text = model::fsio::read_capped(path, model::fsio::FileKind::CONFIG)
        .map_err(|e| ConventionError::Read(Box::new(e)))?;
    Convention::from_yaml(&String::from_utf8_lossy(&text), &path.display().to_string())
}

/// Encodes a step's mask (`values`: 0.0 where visible, anything else masked) for a graph whose
/// convention uses [`MaskEncoding::AttendMax`]: the type's highest integer where visible and its
/// lowest where masked (1.0 / 0.0 for float types). `out` holds `values.len()` elements.
pub fn attend_max_mask(
    values: &[f32],
    dtype: quant::DataType,
    out: &mut [u8],
) -> Result<(), quant::QuantError> {
    let (visible, masked) = match dtype.integer_range() {
        Some((lo, hi)) => (hi as f32, lo as f32),
        None => (1.0, 0.0),
    };
    let flags: Vec<f32> = values
        .iter()
        .map(|&v| if v == 0.0 { visible } else { masked })
        .collect();
    // The identity encoding stores each integer as itself.
    let spec = match dtype.integer_range() {
        Some(_) => quant::QuantSpec::per_tensor(dtype, quant::ScaleOffset::new(1.0, 0)?)?,
        None => quant::QuantSpec::float(dtype)?,
    };
    quant::encode_f32_to_bytes(&flags, &spec, out)
}

/// Writes the RoPE cos (or sin) table of a step into `out`, encoded with `spec`: row `i` holds
/// `cos(positions[i] · f_k)` for the `rope.frequencies()` `f_k` (the table's width is the number of
/// frequencies, half the rotated head width), exactly as [`model::ops::Rope::cos_sin`] makes them
/// for the shared forward (one RoPE definition). Negative positions (never planned) count as 0.
pub fn rope_table(
    rope: &model::ops::Rope,
    positions: &[i32],
    want_sin: bool,
    spec: &quant::QuantSpec,
    out: &mut Vec<u8>,
) -> Result<(), quant::QuantError> {
    let width = rope.frequencies().len();
    let (mut cos, mut sin) = (vec![0.0; width], vec![0.0; width]);
    let mut values = Vec::with_capacity(positions.len() * width);
    for &p in positions {
        rope.cos_sin(p.max(0) as usize, &mut cos, &mut sin);
        values.extend_from_slice(if want_sin { &sin } else { &cos });
    }
    out.resize(values.len() * spec.dtype.size_bytes(), 0);
    quant::encode_f32_to_bytes(&values, spec, out)
}

#[cfg(test)]
mod tests;
