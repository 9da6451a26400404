//! The compiled-model file ("context binary" of the reference backend).
//!
//! Little endian throughout. Layout, version [`FORMAT_VERSION`]:
//!
//! ```text
//! offset 0   magic        8 bytes  "HTPKVREF"
//! offset 8   version      u32      FORMAT_VERSION (WINDOWS_FORMAT_VERSION with windows)
//! offset 12  flags        u32      0 (reserved)
//! offset 16  payload_len  u64
//! offset 24  crc32        u32      CRC-32 (IEEE) of the payload
//! offset 28  payload      payload_len bytes: eight sections (nine with windows), in this order
//! ```
//!
//! Each section is a 4-byte tag, a u64 body length and the body: `OPTS` (compile options),
//! `MSHA` (the 32-byte SHA-256 of the model file(s) it was compiled from), `CONF` (the
//! [`model::LlamaConfig`]: sizes as u64, epsilon and RoPE theta as f32, Llama 3 scaling as a
//! flag + 3 f32 + u64, pairing / tied output / Q/K/V biases as u8, special ids as flag + u32),
//! `CALB` (the calibration token sequences), `ENCS` (i16 activation encodings, KV encodings),
//! `PART` (part index u64 and count u64 of the parts [`crate::Part::split_named`] makes — 0 and 1
//! for the whole model —, RoPE-table flag u8, naming u8: 0 htpkv, 1 aihub, 2 executorch, which
//! must fit the options, [`crate::naming_refusal`]; then, only for AI Hub's split
//! ([`crate::Split::AiHub`]: part 1 the embedding alone), a split byte 1), `WGTS` (the weights the part's graphs use:
//! the embedding when [`crate::Part::holds_embedding`], then per layer of the part the f32 vectors attention norm, FFN norm, Q/K/V biases
//! (empty without biases) as u64 count + f32 values and the matrices Q, K, V, O, gate, up,
//! down, then in the last part the final norm and the classifier flag (+ matrix when untied); a
//! matrix is kind u8 (0 i8, 1 f16, 2 f32), rows u64, cols u64, then i8: f32 row scales + i8
//! values, f16: u16 bits, f32: f32 values) and `GRPH` (graph names and tensor descriptions). Counts are u64;
//! strings are a u64 length and UTF-8 bytes.
//!
//! Reading checks the magic, the version, the payload length, the checksum, every count
//! against the bytes that remain, the consistency of everything with the configuration
//! and options (the graph descriptions must equal the ones this build derives from them), and
//! that every weight, norm and scale is finite ([`FormatError::NonFinite`]), so a damaged file
//! whose checksum was fixed up is still refused. A file is read under the
//! [`FileKind::COMPILED`] cap; it must be a regular file whose size is what its header declares.
//!
//! Version history: 1 had no `CKPT` section; 2 adds it (llama2.c checkpoints only); 3 holds
//! any Llama-family model (`MSHA`, the full description in `CONF`, `CALB`, per-layer weights
//! with biases); 4 always has `PART`, before `WGTS`, with the naming byte, and a part file holds
//! only its own weights; 5 ([`WINDOWS_FORMAT_VERSION`]) is 4 plus a `WNDS` section right after
//! `CONF` for a model with per-layer attention windows (window count u64, which must equal the
//! layer count, then one u64 per layer: 0 for a global layer, else its window W; at least one
//! non-zero, each within the description's limits and the options' window rule). A model
//! without windows is still written as version 4, so builds without windows read it; 6
//! ([`DESC_FORMAT_VERSION`]) holds the description as key–value metadata in a `DESC` section in
//! place of `CONF` and `WNDS`; 7 ([`LAST_ROW_FORMAT_VERSION`]) is 6 whose `OPTS` ends with a
//! flag byte 1: its graph set has a last-row prefill graph per AR variant above 1, after the
//! all-row graphs in `GRPH`. A file is written with the lowest version that holds it. Version 3
//! (whole-model weights in every file; `PART`, without the naming byte and meaning AI Hub's
//! names, after `WGTS` in part files only) is still read; older files are refused with
//! [`FormatError::UnsupportedVersion`], which says to recompile.

use std::path::Path;

use model::fsio::{CappedFile, FileKind};
use model::{Llama3Scaling, LlamaConfig, RopeConfig, RopePairing, SpecialTokens, Tensor, limits};
use quant::{Encoding, QuantSpec, ScaleOffset};

use crate::bytes::{Reader, Writer};
use crate::compiled::CompiledModel;
use crate::desc;
use crate::error::FormatError;
use crate::kernels;
use crate::model::{LayerData, Matrix, ModelData, classifier_act_index};
use crate::options::{CompileOptions, MAX_CALIBRATION_TOKENS, kv_code, kv_from_code};
use crate::parts::{Part, Split, check_naming};
use crate::stored::{FileBytes, InPlace, Stored};
use crate::types::{Granularity, KLayout, WeightType, role_code, role_from_code};
use crate::validate::validate_options;
use graph_io::{IoTensor, Preset};
use model::checksum::crc32;
use std::sync::Arc;

/// Magic bytes at the start of every file.
pub const MAGIC: [u8; 8] = *b"HTPKVREF";
pub use crate::types::{
    DESC_FORMAT_VERSION, FORMAT_VERSION, LAST_ROW_FORMAT_VERSION, OLDEST_FORMAT_VERSION,
    WINDOWS_FORMAT_VERSION,
};
/// Size of the fixed header before the payload.
pub const HEADER_LEN: usize = 28;

const MAX_COUNT: usize = 1 << 40;

impl CompiledModel {
    /// Serializes the model (header + checksummed payload).
    pub fn to_bytes(&self) -> Vec<u8> {
        let d = &*self.data;
        let mut payload = Writer::default();
        section(&mut payload, b"OPTS", |w| d.options.encode(w));
        section(&mut payload, b"MSHA", |w| w.bytes(&d.model_sha256));
        match file_version(d) {
            DESC_FORMAT_VERSION | LAST_ROW_FORMAT_VERSION => {
                section(&mut payload, b"DESC", |w| desc::write(w, &d.config));
            }
            version => {
                section(&mut payload, b"CONF", |w| write_config(w, &d.config));
                if version == WINDOWS_FORMAT_VERSION {
                    section(&mut payload, b"WNDS", |w| write_windows(w, &d.config));
                }
            }
        }
        section(&mut payload, b"CALB", |w| {
            w.len(d.calibration.len());
            for seq in &d.calibration {
                w.len(seq.len());
                for &t in seq {
                    w.u32(t);
                }
            }
        });
        section(&mut payload, b"ENCS", |w| {
            w.len(d.act.len());
            for so in &d.act {
                w.f32(so.scale);
                w.i32(so.offset);
            }
            w.len(d.kv.len());
            for spec in &d.kv {
                w.u8(kv_code(spec.dtype));
                write_encoding(w, &spec.encoding);
            }
        });
        section(&mut payload, b"PART", |w| write_part(w, &self.part));
        section(&mut payload, b"WGTS", |w| {
            if let Some(m) = &d.embedding {
                write_matrix(w, m);
            }
            for layer in &d.layers {
                let vectors = LayerData::VECTORS.iter().zip(&layer.vectors);
                for (_, v) in vectors.filter(|(t, _)| LayerData::stored(**t, &d.config)) {
                    w.f32s(v);
                }
                for m in &layer.matrices {
                    write_matrix(w, m);
                }
            }
            if self.part.is_last() {
                w.f32s(&d.output_norm);
                match &d.classifier {
                    None => w.u8(0),
                    Some(m) => {
                        w.u8(1);
                        write_matrix(w, m);
                    }
                }
            }
        });
        section(&mut payload, b"GRPH", |w| {
            w.len(self.graphs.len());
            for g in &self.graphs {
                w.str(g.name());
                w.len(g.ar());
                w.len(g.context());
                for descs in [g.inputs(), g.outputs()] {
                    w.len(descs.len());
                    for t in descs {
                        write_desc(w, t);
                    }
                }
            }
        });
        let payload = payload.buf;
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&file_version(d).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Writes the model to `path` atomically (see [`model::fsio::write_atomic_verified`]), refusing a `path` that is
    /// not a regular file or is one of `inputs`; the new file replaces an old one only after it
    /// was read back, validated and found equal to `self`.
    pub fn write(&self, path: &Path, inputs: &[&Path]) -> Result<(), FormatError> {
        let bytes = self.to_bytes();
        model::fsio::write_atomic_verified(path, &bytes, inputs, &mut |tmp| {
            let back = CompiledModel::read(tmp)?;
            if back != *self {
                return Err("it differs from the compiled model after reading it back".into());
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Reads and validates a model file (see the module docs for the size cap).
    pub fn read(path: &Path) -> Result<CompiledModel, FormatError> {
        let mut file = CappedFile::open(path, FileKind::COMPILED)?;
        let mut bytes = Vec::new();
        file.read_up_to(&mut bytes, HEADER_LEN as u64)?;
        // Only a plausible header lets the rest be read, and only when the file's size is the
        // size the header declares (a longer file is refused before it is read).
        if bytes.len() == HEADER_LEN && bytes.starts_with(&MAGIC) {
            let mut declared = [0u8; 8];
            declared.copy_from_slice(&bytes[16..24]);
            let total = (HEADER_LEN as u64).saturating_add(u64::from_le_bytes(declared));
            if file.len() > total {
                return Err(FormatError::TrailingBytes {
                    origin: path.display().to_string(),
                    offset: total,
                    extra: file.len() - total,
                });
            }
            file.read_rest(&mut bytes)?;
        }
        CompiledModel::parse(&Arc::new(bytes), &path.display().to_string())
    }

    /// Parses and validates a model from `bytes`; `origin` labels errors (e.g. a path). The
    /// bytes are copied once, and the matrices read their values from that copy
    /// ([`crate::stored`]).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<CompiledModel, FormatError> {
        CompiledModel::parse(&Arc::new(bytes.to_vec()), origin)
    }

    /// [`CompiledModel::from_bytes`] over a file's bytes, which the matrices keep and read
    /// their values from instead of copies ([`crate::stored`]).
    fn parse(file: &FileBytes, origin: &str) -> Result<CompiledModel, FormatError> {
        let bytes = file.as_slice();
        let mut r = Reader::new(bytes, 0, origin);
        let prefix = &bytes[..MAGIC.len().min(bytes.len())];
        if prefix == &MAGIC[..prefix.len()] {
            // A (possibly cut) magic: a short file is reported as truncated.
            r.take(MAGIC.len(), "magic")?;
        } else {
            let magic = prefix;
            return Err(FormatError::BadMagic {
                origin: origin.into(),
                found: magic.to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        let version = r.u32("format version")?;
        if !(OLDEST_FORMAT_VERSION..=LAST_ROW_FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                origin: origin.into(),
                found: version,
                supported: LAST_ROW_FORMAT_VERSION,
            });
        }
        let flags_at = r.offset();
        let flags = r.u32("flags")?;
        if flags != 0 {
            return Err(r.corrupt_at(
                flags_at,
                format!("reserved flags are {flags:#x}, expected 0"),
            ));
        }
        let payload_len = r.u64("payload length")?;
        let stored = r.u32("checksum")?;
        let avail = r.remaining() as u64;
        if payload_len > avail {
            return Err(FormatError::Truncated {
                origin: origin.into(),
                what: "payload".into(),
                offset: HEADER_LEN as u64,
                expected: payload_len,
                available: avail,
            });
        }
        if payload_len < avail {
            return Err(FormatError::TrailingBytes {
                origin: origin.into(),
                offset: HEADER_LEN as u64 + payload_len,
                extra: avail - payload_len,
            });
        }
        let payload = &bytes[HEADER_LEN..];
        let computed = crc32(payload);
        if computed != stored {
            return Err(FormatError::ChecksumMismatch {
                origin: origin.into(),
                stored,
                computed,
            });
        }
        let mut p = Reader::new(payload, HEADER_LEN as u64, origin);

        let mut s = open_section(&mut p, b"OPTS")?;
        let options = read_options(&mut s, version)?;
        close_section(&s)?;

        let mut s = open_section(&mut p, b"MSHA")?;
        let model_sha256: [u8; 32] = s.array("model SHA-256")?;
        close_section(&s)?;

        let (config, s) = read_description(&mut p, version)?;
        if let Err(reason) = validate_options(&config, &options) {
            return Err(s.corrupt_at(
                HEADER_LEN as u64,
                format!("options do not fit the model: {reason}"),
            ));
        }

        let mut s = open_section(&mut p, b"CALB")?;
        let calibration = read_calibration(&mut s, &config)?;
        close_section(&s)?;

        let mut s = open_section(&mut p, b"ENCS")?;
        let (act, kv) = read_encodings(&mut s, &config, &options)?;
        close_section(&s)?;

        // Version 4 names the part before the weights, which are the part's own; version 3 held
        // the whole model's weights, then (in a part file) the part.
        let v4_part = if version >= 4 {
            Some(read_part_section(&mut p, &config, &options, true)?)
        } else {
            None
        };
        let held = v4_part
            .clone()
            .unwrap_or_else(|| Part::whole(config.n_layers));
        let mut s = open_section(&mut p, b"WGTS")?;
        let (embedding, layers, output_norm, classifier) =
            read_weights(&mut s, (&config, options.weights, file), &held)?;
        close_section(&s)?;
        let part = match v4_part {
            Some(part) => part,
            None if p.starts_with(b"PART") => read_part_section(&mut p, &config, &options, false)?,
            None => Part::whole(config.n_layers),
        };
        let data = ModelData {
            config,
            options,
            model_sha256,
            calibration,
            embedding,
            first_layer: held.layers.start,
            layers,
            output_norm,
            classifier,
            act,
            kv,
        }
        .for_part(&part);
        let mut s = open_section(&mut p, b"GRPH")?;
        let at = s.offset();
        let count = s.len("graph count", MAX_COUNT)?;
        let declared = data.options.graph_set().len();
        if count != declared {
            return Err(s.corrupt_at(
                at,
                format!(
                    "{count} graph(s), but the options declare {declared} ({} AR variant(s){})",
                    data.options.ar.len(),
                    if data.options.last_row {
                        " and their last-row prefill graphs"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let model = CompiledModel::with_part(std::sync::Arc::new(data), part);
        for g in &model.graphs {
            let at = s.offset();
            let name = s.str("graph name")?;
            let ar = s.len("graph AR", MAX_COUNT)?;
            let context = s.len("graph context", MAX_COUNT)?;
            if name != g.name() || ar != g.ar() || context != g.context() {
                return Err(s.corrupt_at(
                    at,
                    format!(
                        "graph `{name}` (AR {ar}, context {context}) where `{}` (AR {}, context {}) was expected",
                        g.name(),
                        g.ar(),
                        g.context()
                    ),
                ));
            }
            for (kind, expected) in [("input", g.inputs()), ("output", g.outputs())] {
                let at = s.offset();
                let n = s.len("tensor count", MAX_COUNT)?;
                if n != expected.len() {
                    return Err(s.corrupt_at(
                        at,
                        format!(
                            "graph `{name}` lists {n} {kind}(s), expected {}",
                            expected.len()
                        ),
                    ));
                }
                for e in expected {
                    let at = s.offset();
                    let t = read_desc(&mut s)?;
                    if &t != e {
                        return Err(s.corrupt_at(
                            at,
                            format!(
                                "graph `{name}` {kind} `{}` does not match the model (expected `{}` {:?} {})",
                                t.name, e.name, e.shape, e.dtype
                            ),
                        ));
                    }
                }
            }
        }
        close_section(&s)?;
        if p.remaining() != 0 {
            return Err(p.corrupt_at(
                p.offset(),
                format!("{} byte(s) after the last section", p.remaining()),
            ));
        }
        Ok(model)
    }
}

/// The description of a file of `version`: its `DESC` section (versions 6 and 7), or its `CONF`
/// section and, in version 5, its `WNDS` section. Returns the last section read, for later errors.
fn read_description<'a>(
    p: &mut Reader<'a>,
    version: u32,
) -> Result<(LlamaConfig, Reader<'a>), FormatError> {
    if version >= DESC_FORMAT_VERSION {
        let mut s = open_section(p, b"DESC")?;
        let config = desc::read(&mut s)?;
        close_section(&s)?;
        return Ok((config, s));
    }
    let mut s = open_section(p, b"CONF")?;
    let mut config = read_config(&mut s)?;
    close_section(&s)?;
    if version == WINDOWS_FORMAT_VERSION {
        let mut w = open_section(p, b"WNDS")?;
        config.layer_windows = read_windows(&mut w, &config)?;
        close_section(&w)?;
        return Ok((config, w));
    }
    Ok((config, s))
}

/// The version a model's file carries: [`LAST_ROW_FORMAT_VERSION`] when its graph set holds
/// last-row prefill graphs, [`DESC_FORMAT_VERSION`] when its description holds more than
/// versions 4 and 5 can ([`desc::needs_desc`]), [`WINDOWS_FORMAT_VERSION`] when a layer has a
/// window, else [`FORMAT_VERSION`].
fn file_version(d: &ModelData) -> u32 {
    let c = &d.config;
    if d.options.last_row {
        LAST_ROW_FORMAT_VERSION
    } else if desc::needs_desc(c) {
        DESC_FORMAT_VERSION
    } else if c.layer_windows.iter().any(Option::is_some) {
        WINDOWS_FORMAT_VERSION
    } else {
        FORMAT_VERSION
    }
}

/// The `WNDS` section: the window count (one per layer) and each layer's window as u64, 0 for a
/// global layer.
fn write_windows(w: &mut Writer, c: &LlamaConfig) {
    w.len(c.layer_windows.len());
    for window in &c.layer_windows {
        w.len(window.unwrap_or(0));
    }
}

/// The `WNDS` section of a model described by `c`: exactly one window per layer, each within the
/// description's limits (the options are checked against them by the caller).
fn read_windows(s: &mut Reader<'_>, c: &LlamaConfig) -> Result<Vec<Option<usize>>, FormatError> {
    let at = s.offset();
    let count = s.count("window count", 8)?;
    if count != c.n_layers {
        return Err(s.corrupt_at(
            at,
            format!("{count} window(s) for a model of {} layers", c.n_layers),
        ));
    }
    let mut windows = Vec::with_capacity(count);
    for _ in 0..count {
        let w = s.len("layer window", limits::MAX_CONTEXT)?;
        windows.push((w != 0).then_some(w));
    }
    if windows.iter().all(Option::is_none) {
        return Err(s.corrupt_at(at, "a windows section whose layers are all global".into()));
    }
    let windowed = LlamaConfig {
        layer_windows: windows.clone(),
        ..c.clone()
    };
    windowed
        .validate()
        .map_err(|e| s.corrupt_at(at, e.to_string()))?;
    Ok(windows)
}

fn write_part(w: &mut Writer, p: &Part) {
    w.len(p.index);
    w.len(p.count);
    w.u8(u8::from(p.rope_tables));
    w.u8(naming_code(p.naming));
    // AI Hub's split adds a byte (1); htpkv's own writes none, so its files read as before.
    if p.split == Split::AiHub {
        w.u8(1);
    }
}

/// A part section: index and count (one of the parts [`Part::split_named`] makes of the
/// model), the RoPE-table flag and (`named`, version 4) the naming code, which must fit the
/// options ([`check_naming`]); a version-3 part has AI Hub's names.
fn read_part_section(
    p: &mut Reader<'_>,
    config: &LlamaConfig,
    options: &CompileOptions,
    named: bool,
) -> Result<Part, FormatError> {
    let mut s = open_section(p, b"PART")?;
    let at = s.offset();
    let index = s.len("part index", MAX_COUNT)?;
    let count = s.len("part count", MAX_COUNT)?;
    let tables = read_flag(&mut s, "RoPE-table flag")?;
    let naming = if named {
        let code_at = s.offset();
        let code = s.u8("naming")?;
        naming_from_code(code)
            .ok_or_else(|| s.corrupt_at(code_at, format!("unknown naming code {code}")))?
    } else {
        naming_from_code(V3_NAMING).unwrap_or_default()
    };
    // An optional split byte: 1 for AI Hub's split (absent: htpkv's own).
    let split = if named && s.remaining() > 0 {
        let split_at = s.offset();
        match s.u8("split")? {
            1 => Split::AiHub,
            code => return Err(s.corrupt_at(split_at, format!("unknown split code {code}"))),
        }
    } else {
        Split::Balanced
    };
    close_section(&s)?;
    let parts = Part::split_as(config.n_layers, count, tables, naming, split)
        .map_err(|r| s.corrupt_at(at, r))?;
    let part = parts
        .into_iter()
        .nth(index)
        .ok_or_else(|| s.corrupt_at(at, format!("part index {index} of {count} parts")))?;
    check_naming(&part, options).map_err(|r| s.corrupt_at(at, r))?;
    Ok(part)
}

/// The weights `held` runs ([`ModelData::for_part`]): the embedding where
/// [`Part::holds_embedding`], its layers, the final norm and classifier in the last part.
fn read_weights(
    s: &mut Reader<'_>,
    m: MatrixSource<'_>,
    held: &Part,
) -> Result<PartWeights, FormatError> {
    let c = m.0;
    let embedding = if held.holds_embedding(c.tied_output) {
        Some(read_tensor_matrix(s, m, Tensor::TokenEmbedding)?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(held.layers.len());
    for l in held.layers.clone() {
        layers.push(read_layer(s, m, l)?);
    }
    let (output_norm, classifier) = if held.is_last() {
        read_head(s, m)?
    } else {
        (Vec::new(), None)
    };
    Ok((embedding, layers, output_norm, classifier))
}

/// A part's weights as [`ModelData`] holds them: embedding, layers, final norm, classifier.
type PartWeights = (Option<Matrix>, Vec<LayerData>, Vec<f32>, Option<Matrix>);

/// What reading a matrix needs: the description (its shape), the weight type (its kind) and
/// the file's bytes (which its values stay in).
type MatrixSource<'a> = (&'a LlamaConfig, WeightType, &'a FileBytes);

fn read_layer(s: &mut Reader<'_>, m: MatrixSource<'_>, l: usize) -> Result<LayerData, FormatError> {
    let c = m.0;
    let mut vectors = Vec::with_capacity(LayerData::VECTORS.len());
    for lt in LayerData::VECTORS {
        let t = Tensor::Layer(l, lt);
        if !LayerData::stored(lt, c) {
            vectors.push(Vec::new());
            continue;
        }
        let len = if lt.present(c) { t.len(c) } else { 0 };
        vectors.push(read_norm(s, &t.to_string(), len)?);
    }
    let mut matrices = Vec::with_capacity(LayerData::MATRICES.len());
    for t in LayerData::MATRICES {
        matrices.push(read_tensor_matrix(s, m, Tensor::Layer(l, t))?);
    }
    Ok(LayerData { matrices, vectors })
}

/// The final norm and the classifier (`None` when tied to the embedding).
fn read_head(
    s: &mut Reader<'_>,
    m: MatrixSource<'_>,
) -> Result<(Vec<f32>, Option<Matrix>), FormatError> {
    let c = m.0;
    let output_norm = read_norm(s, "output norm", c.dim)?;
    let at = s.offset();
    let classifier = match s.u8("classifier flag")? {
        0 if c.tied_output => None,
        1 if !c.tied_output => Some(read_tensor_matrix(s, m, Tensor::Output)?),
        f => {
            return Err(s.corrupt_at(
                at,
                format!(
                    "classifier flag {f} does not fit a model whose classifier is {}",
                    if c.tied_output {
                        "tied (flag 0)"
                    } else {
                        "separate (flag 1)"
                    }
                ),
            ));
        }
    };
    Ok((output_norm, classifier))
}

fn section(w: &mut Writer, tag: &[u8; 4], body: impl FnOnce(&mut Writer)) {
    let mut inner = Writer::default();
    body(&mut inner);
    w.bytes(tag);
    w.len(inner.buf.len());
    w.bytes(&inner.buf);
}

fn open_section<'a>(p: &mut Reader<'a>, tag: &[u8; 4]) -> Result<Reader<'a>, FormatError> {
    let name = String::from_utf8_lossy(tag).into_owned();
    let at = p.offset();
    let found = p.take(4, &format!("tag of section {name}"))?;
    if found != tag {
        return Err(p.corrupt_at(
            at,
            format!("expected section {name}, found tag {:02x?}", found),
        ));
    }
    let len = p.count(&format!("section {name}"), 1)?;
    let base = p.offset();
    let body = p.take(len, &format!("section {name}"))?;
    Ok(Reader::new(body, base, p.origin))
}

fn close_section(s: &Reader<'_>) -> Result<(), FormatError> {
    if s.remaining() != 0 {
        return Err(s.corrupt_at(
            s.offset(),
            format!("{} unread byte(s) at the end of a section", s.remaining()),
        ));
    }
    Ok(())
}

/// The `OPTS` section of a file of `version` (the last-row flag only in version 7, where it
/// must be 1: the version says the graph set has last-row graphs).
fn read_options(s: &mut Reader<'_>, version: u32) -> Result<CompileOptions, FormatError> {
    let context = s.len("context", limits::MAX_CONTEXT)?;
    let n = s.count("AR variant count", 8)?;
    let mut ar = Vec::with_capacity(n);
    for _ in 0..n {
        ar.push(s.len("AR variant", limits::MAX_CONTEXT)?);
    }
    let at = s.offset();
    let kv_dtype = kv_from_code(s.u8("KV dtype")?)
        .ok_or_else(|| s.corrupt_at(at, "unknown KV dtype code".into()))?;
    let at = s.offset();
    let weights = match s.u8("weight type")? {
        0 => WeightType::I8,
        1 => WeightType::F16,
        2 => WeightType::F32,
        3 => WeightType::I4,
        4 => WeightType::I8F16,
        c => return Err(s.corrupt_at(at, format!("unknown weight type code {c}"))),
    };
    let at = s.offset();
    let k_layout = match s.u8("K layout")? {
        0 => KLayout::Rows,
        1 => KLayout::Transposed,
        c => return Err(s.corrupt_at(at, format!("unknown K layout code {c}"))),
    };
    let at = s.offset();
    let granularity = match s.u8("granularity")? {
        0 => Granularity::PerHead,
        1 => Granularity::PerLayer,
        c => return Err(s.corrupt_at(at, format!("unknown granularity code {c}"))),
    };
    let calibration_tokens = s.len("calibration tokens", MAX_CALIBRATION_TOKENS)?;
    let last_row = version == LAST_ROW_FORMAT_VERSION;
    if last_row {
        let at = s.offset();
        let flag = s.u8("last-row graphs flag")?;
        if flag != 1 {
            return Err(s.corrupt_at(
                at,
                format!("last-row graphs flag is {flag}, expected 1 in a version-7 file"),
            ));
        }
    }
    Ok(CompileOptions {
        context,
        ar,
        last_row,
        kv_dtype,
        weights,
        k_layout,
        granularity,
        calibration_tokens,
    })
}

fn write_config(w: &mut Writer, c: &LlamaConfig) {
    for v in [
        c.n_layers,
        c.dim,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.hidden_dim,
        c.vocab_size,
        c.context_length,
    ] {
        w.len(v);
    }
    w.f32(c.rms_eps);
    w.f32(c.rope.theta);
    match &c.rope.scaling {
        None => w.u8(0),
        Some(sc) => {
            w.u8(1);
            w.f32(sc.factor);
            w.f32(sc.low_freq_factor);
            w.f32(sc.high_freq_factor);
            w.len(sc.original_context);
        }
    }
    w.u8(match c.rope.pairing {
        RopePairing::Adjacent => 0,
        RopePairing::HalfSplit => 1,
    });
    w.u8(u8::from(c.tied_output));
    w.u8(u8::from(c.block.qkv_bias));
    let sp = &c.special;
    for id in [sp.bos, sp.eos, sp.eot, sp.pad] {
        match id {
            None => w.u8(0),
            Some(t) => {
                w.u8(1);
                w.u32(t);
            }
        }
    }
}

/// A u8 that must be 0 or 1.
fn read_flag(s: &mut Reader<'_>, what: &str) -> Result<bool, FormatError> {
    let at = s.offset();
    match s.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        f => Err(s.corrupt_at(at, format!("{what} flag {f}"))),
    }
}

fn read_config(s: &mut Reader<'_>) -> Result<LlamaConfig, FormatError> {
    let at = s.offset();
    let mut size = |what: &str| s.len(what, MAX_COUNT);
    let (n_layers, dim, n_heads, n_kv_heads) = (
        size("n_layers")?,
        size("dim")?,
        size("n_heads")?,
        size("n_kv_heads")?,
    );
    let (head_dim, hidden_dim, vocab_size, context_length) = (
        size("head_dim")?,
        size("hidden_dim")?,
        size("vocab_size")?,
        size("context_length")?,
    );
    let rms_eps = s.f32("rms_eps")?;
    let theta = s.f32("rope theta")?;
    let scaling = if read_flag(s, "rope scaling")? {
        Some(Llama3Scaling {
            factor: s.f32("rope scaling factor")?,
            low_freq_factor: s.f32("rope low_freq_factor")?,
            high_freq_factor: s.f32("rope high_freq_factor")?,
            original_context: s.len("rope original context", MAX_COUNT)?,
        })
    } else {
        None
    };
    let pairing = if read_flag(s, "rope pairing")? {
        RopePairing::HalfSplit
    } else {
        RopePairing::Adjacent
    };
    let tied_output = read_flag(s, "tied output")?;
    let qkv_bias = read_flag(s, "qkv bias")?;
    let mut ids = [None; 4];
    for id in &mut ids {
        if read_flag(s, "special token")? {
            *id = Some(s.u32("special token")?);
        }
    }
    let [bos, eos, eot, pad] = ids;
    let c = LlamaConfig {
        n_layers,
        dim,
        n_heads,
        n_kv_heads,
        head_dim,
        hidden_dim,
        vocab_size,
        context_length,
        rms_eps,
        rope: RopeConfig {
            theta,
            scaling,
            pairing,
            ..RopeConfig::default()
        },
        tied_output,
        block: model::Block {
            qkv_bias,
            ..model::Block::default()
        },
        embed_scale: None,
        final_softcap: None,
        special: SpecialTokens { bos, eos, eot, pad },
        layer_windows: Vec::new(),
    };
    c.validate().map_err(|e| s.corrupt_at(at, e.to_string()))?;
    Ok(c)
}

fn read_calibration(s: &mut Reader<'_>, c: &LlamaConfig) -> Result<Vec<Vec<u32>>, FormatError> {
    let n = s.count("calibration sequence count", 8)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = s.count("calibration sequence", 4)?;
        let mut seq = Vec::with_capacity(len);
        for _ in 0..len {
            let at = s.offset();
            let t = s.u32("calibration token")?;
            if t as usize >= c.vocab_size {
                let why = format!("calibration token {t} is outside the vocabulary");
                return Err(s.corrupt_at(at, why));
            }
            seq.push(t);
        }
        out.push(seq);
    }
    Ok(out)
}

fn write_encoding(w: &mut Writer, e: &Encoding) {
    match e {
        Encoding::Float => w.u8(0),
        Encoding::PerTensor(so) => {
            w.u8(1);
            w.f32(so.scale);
            w.i32(so.offset);
        }
        Encoding::PerAxis { axis, params } => {
            w.u8(2);
            w.len(*axis);
            w.len(params.len());
            for so in params {
                w.f32(so.scale);
                w.i32(so.offset);
            }
        }
    }
}

fn read_scale_offset(s: &mut Reader<'_>) -> Result<ScaleOffset, FormatError> {
    let at = s.offset();
    let scale = s.f32("scale")?;
    let offset = s.i32("offset")?;
    ScaleOffset::new(scale, offset).map_err(|e| s.corrupt_at(at, e.to_string()))
}

fn read_encoding(s: &mut Reader<'_>) -> Result<Encoding, FormatError> {
    let at = s.offset();
    Ok(match s.u8("encoding kind")? {
        0 => Encoding::Float,
        1 => Encoding::PerTensor(read_scale_offset(s)?),
        2 => {
            let axis = s.len("encoding axis", 16)?;
            let n = s.count("per-axis encoding", 8)?;
            let mut params = Vec::with_capacity(n);
            for _ in 0..n {
                params.push(read_scale_offset(s)?);
            }
            Encoding::PerAxis { axis, params }
        }
        k => return Err(s.corrupt_at(at, format!("unknown encoding kind {k}"))),
    })
}

fn read_encodings(
    s: &mut Reader<'_>,
    c: &LlamaConfig,
    o: &CompileOptions,
) -> Result<(Vec<ScaleOffset>, Vec<QuantSpec>), FormatError> {
    let at = s.offset();
    let n = s.count("activation encodings", 8)?;
    let want = if o.weights.is_integer() {
        classifier_act_index(c.n_layers) + 1
    } else {
        0
    };
    if n != want {
        return Err(s.corrupt_at(at, format!("{n} activation encoding(s), expected {want}")));
    }
    let mut act = Vec::with_capacity(n);
    for _ in 0..n {
        act.push(read_scale_offset(s)?);
    }
    let at = s.offset();
    let n = s.count("KV encodings", 2)?;
    let want = c.n_layers * c.n_kv_heads * 2;
    if n != want {
        return Err(s.corrupt_at(at, format!("{n} KV encoding(s), expected {want}")));
    }
    let mut kv = Vec::with_capacity(n);
    for _ in 0..n {
        let at = s.offset();
        let dtype = kv_from_code(s.u8("KV dtype")?);
        let encoding = read_encoding(s)?;
        let ok = match (dtype, &encoding) {
            (Some(d), Encoding::PerTensor(_)) => d == o.kv_dtype && d.is_fixed_point(),
            (Some(d), Encoding::Float) => d == o.kv_dtype && !d.is_fixed_point(),
            _ => false,
        };
        let Some(dtype) = dtype.filter(|_| ok) else {
            return Err(s.corrupt_at(
                at,
                format!("KV encoding does not fit the KV dtype {}", o.kv_dtype),
            ));
        };
        kv.push(QuantSpec { dtype, encoding });
    }
    Ok((act, kv))
}

fn write_matrix(w: &mut Writer, m: &Matrix) {
    match m {
        Matrix::I8 {
            rows,
            cols,
            scales,
            q,
            ..
        } => {
            w.u8(0);
            w.len(*rows);
            w.len(*cols);
            for &s in scales {
                w.f32(s);
            }
            w.buf.extend(q.iter().map(|&v| v as u8));
        }
        Matrix::Half {
            rows,
            cols,
            w: data,
        } => {
            w.u8(1);
            w.len(*rows);
            w.len(*cols);
            w.bytes(data.as_flattened());
        }
        Matrix::Float {
            rows,
            cols,
            w: data,
        } => {
            w.u8(2);
            w.len(*rows);
            w.len(*cols);
            for &v in data {
                w.f32(v);
            }
        }
    }
}

/// The matrix of `t`, shaped as the description says.
fn read_tensor_matrix(
    s: &mut Reader<'_>,
    (c, wt, file): MatrixSource<'_>,
    t: Tensor,
) -> Result<Matrix, FormatError> {
    let shape = t.shape(c);
    let wt = wt.matrix_type(t);
    read_matrix(s, (&t.to_string(), wt, file), shape[0], shape[1])
}

/// The values of `n` bytes just read at `at`: read in place from `file` where they can be
/// ([`Stored::in_file`]), else `copy` of them.
fn stored<T: InPlace>(
    file: &FileBytes,
    at: u64,
    n: usize,
    copy: impl FnOnce() -> Vec<T>,
) -> Stored<T> {
    let start = at as usize;
    Stored::in_file(file, start..start + n).unwrap_or_else(|| copy().into())
}

fn read_matrix(
    s: &mut Reader<'_>,
    (name, wt, file): (&str, WeightType, &FileBytes),
    rows: usize,
    cols: usize,
) -> Result<Matrix, FormatError> {
    let at = s.offset();
    let kind = s.u8(&format!("{name} kind"))?;
    let want = match wt {
        // i4 values are stored as their products with the block multipliers (i8).
        WeightType::I8 | WeightType::I4 | WeightType::I8F16 => 0,
        WeightType::F16 => 1,
        WeightType::F32 => 2,
    };
    if kind != want {
        return Err(s.corrupt_at(
            at,
            format!(
                "matrix {name} has kind {kind}, expected {want} ({} weights)",
                wt.name()
            ),
        ));
    }
    let at = s.offset();
    let r = s.len(&format!("{name} rows"), MAX_COUNT)?;
    let c = s.len(&format!("{name} cols"), MAX_COUNT)?;
    if (r, c) != (rows, cols) {
        return Err(s.corrupt_at(
            at,
            format!("matrix {name} is {r} x {c}, expected {rows} x {cols}"),
        ));
    }
    let n = rows * cols;
    Ok(match kind {
        0 => {
            let mut scales = Vec::with_capacity(rows);
            for _ in 0..rows {
                let at = s.offset();
                let v = s.f32(&format!("{name} scale"))?;
                if !v.is_finite() {
                    return Err(non_finite(s, &format!("{name} scale"), scales.len(), at, v));
                }
                if v <= 0.0 {
                    return Err(s.corrupt_at(at, format!("matrix {name} has scale {v}")));
                }
                scales.push(v);
            }
            let at = s.offset();
            let b = s.take(n, name)?;
            let q = stored(file, at, n, || b.iter().map(|&v| v as i8).collect());
            Matrix::from_i8(rows, cols, scales, q)
        }
        1 => {
            let at = s.offset();
            let b = s.take(n * 2, name)?;
            let w = stored(file, at, n * 2, || b.as_chunks::<2>().0.to_vec());
            let value = |i: usize| kernels::widen_f16(w[i]);
            if let Some(i) = (0..w.len()).find(|&i| !value(i).is_finite()) {
                let offset = at + i as u64 * 2;
                return Err(non_finite(s, name, i, offset, value(i)));
            }
            Matrix::Half { rows, cols, w }
        }
        _ => {
            let at = s.offset();
            let b = s.take(n * 4, name)?;
            let w: Vec<f32> = b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            check_finite(s, name, at, 4, &w)?;
            Matrix::Float { rows, cols, w }
        }
    })
}

fn read_norm(s: &mut Reader<'_>, name: &str, len: usize) -> Result<Vec<f32>, FormatError> {
    let at = s.offset();
    let v = s.f32s(name)?;
    if v.len() != len {
        return Err(s.corrupt_at(
            at,
            format!("{name} has {} value(s), expected {len}", v.len()),
        ));
    }
    // The values follow the u64 count.
    check_finite(s, name, at + 8, 4, &v)?;
    Ok(v)
}

/// Refuses the first value of `values` that is NaN or infinite; `at` is the offset of the first
/// value and `width` the stored size of one.
fn check_finite(
    s: &Reader<'_>,
    name: &str,
    at: u64,
    width: u64,
    values: &[f32],
) -> Result<(), FormatError> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(non_finite(s, name, i, at + i as u64 * width, values[i])),
    }
}

fn non_finite(s: &Reader<'_>, name: &str, index: usize, offset: u64, value: f32) -> FormatError {
    FormatError::NonFinite {
        origin: s.origin.to_owned(),
        what: name.to_owned(),
        index,
        offset,
        value,
    }
}

/// The byte a file records its naming as: its position in [`Preset::ALL`] (stable, new presets
/// are appended: 0 htpkv, 1 aihub, 2 executorch).
fn naming_code(naming: Preset) -> u8 {
    let at = Preset::ALL.iter().position(|&p| p == naming);
    at.and_then(|i| u8::try_from(i).ok()).unwrap_or(u8::MAX)
}

/// The naming code of a version-3 part, which has no naming byte: AI Hub's names (1).
const V3_NAMING: u8 = 1;

fn naming_from_code(code: u8) -> Option<Preset> {
    Preset::ALL.get(usize::from(code)).copied()
}

fn write_desc(w: &mut Writer, t: &IoTensor) {
    w.str(&t.name);
    w.len(t.shape.len());
    for &d in &t.shape {
        w.len(d);
    }
    w.u8(crate::types::dtype_code(t.dtype));
    write_encoding(w, &t.encoding());
    w.u8(role_code(t.role));
    for v in [t.layer, t.head] {
        match v {
            None => w.u8(0),
            Some(x) => {
                w.u8(1);
                // Layers and heads are far below 2^32 (the compile limits).
                w.u32(u32::try_from(x).unwrap_or(u32::MAX));
            }
        }
    }
}

fn read_desc(s: &mut Reader<'_>) -> Result<IoTensor, FormatError> {
    let name = s.str("tensor name")?;
    let rank = s.count("tensor rank", 8)?;
    let mut shape = Vec::with_capacity(rank);
    for _ in 0..rank {
        shape.push(s.len("tensor dimension", MAX_COUNT)?);
    }
    let at = s.offset();
    let dtype = crate::types::dtype_from_code(s.u8("tensor dtype")?)
        .ok_or_else(|| s.corrupt_at(at, format!("tensor `{name}` has an unknown dtype code")))?;
    let encoding = read_encoding(s)?;
    let at = s.offset();
    let role = role_from_code(s.u8("tensor role")?)
        .ok_or_else(|| s.corrupt_at(at, format!("tensor `{name}` has an unknown role code")))?;
    let mut opt = |what: &str| -> Result<Option<usize>, FormatError> {
        let at = s.offset();
        match s.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(s.u32(what)? as usize)),
            f => Err(s.corrupt_at(at, format!("{what} flag {f}"))),
        }
    };
    let layer = opt("tensor layer")?;
    let head = opt("tensor head")?;
    Ok(IoTensor {
        name,
        shape,
        quant: dtype
            .is_real()
            .then_some(quant::QuantSpec { dtype, encoding }),
        dtype,
        role,
        layer,
        head,
    })
}
