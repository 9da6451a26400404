//! Saving and restoring a session: [`Session::save`] and [`Session::restore`].
//!
//! A session file holds what the next step needs and nothing of the cache's layout: the valid K/V
//! rows of every buffer in logical order and in their stored (fixed-point) bytes, the buffers'
//! encodings, the token ids (their count is the length), the position offset (positions are
//! `offset + 0..len`, after slides that kept positions; 0 otherwise), the logits of the last token and
//! the model fingerprint. Restoring into a session of the same model with any strategy
//! gives bit-identical next logits to never having stopped.
//!
//! # File format (version 2, little endian; version 1 had no position offset and is still read)
//! ```text
//! offset 0   magic        8 bytes  "HTPKVSES"
//! offset 8   version      u32      2
//! offset 12  reserved     u32      0
//! offset 16  payload_len  u64      bytes after the 32-byte header (must be all of them)
//! offset 24  crc32        u32      CRC-32 (IEEE) of the payload
//! offset 28  fingerprint  u32      CRC-32 of the model's graph descriptions (see `fingerprint`)
//! payload:
//!   layers, kv_heads, head_dim  u32 each;  dtype  u8 (0 u8, 1 u16, 2 i8, 3 i16, 4 f16, 5 f32)
//!   per buffer (layer, kv-head, K then V): encoding = dtype u8, kind u8 (0 float, 1 per-tensor,
//!     2 per-axis), then scale f32 + offset i32 (per-tensor) or axis u32, count u32, count x
//!     (scale f32, offset i32) (per-axis)
//!   len u32, then len token ids u32
//!   position offset u32 (version 2 only; offset + len fits an i32)
//!   logits count u32 (0 or the vocabulary size), then that many f32
//!   per buffer: len x head_dim elements, token 0 first, channels in order
//! ```
//!
//! Reading goes through the capped reader ([`model::fsio`]): a regular file no longer than the most
//! a session of this model can take, then every count is checked against the bytes left before
//! it is used. Writing goes through the one atomic writer ([`model::fsio::write_atomic_verified`]):
//! never over a device, FIFO, socket, symlink, directory or one of the model's files; a temporary
//! file created exclusively, fsync, rename over the target, fsync of the directory. Every refusal
//! is a [`PersistError`] naming the file once, and leaves the session exactly as it was.

use crate::backend::{Backend, GraphDesc};
use crate::session::{Generation, Session, SessionError, StopReason};
use kv_manager::{KvError, KvSnapshot, RowShape};
use model::checksum::crc32;
use model::fsio::{FileError, FileKind, read_capped, write_atomic_verified};
use model::le::{LeReader, ReadError};
use quant::{DataType, Encoding, QuantSpec, ScaleOffset};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"HTPKVSES";
/// The file format version this build writes and reads.
pub const VERSION: u32 = 2;
const HEADER: usize = 32;

/// Why a session could not be saved or restored. Every error names the file once: a
/// [`FileError`] names it itself, a file that is no session of this model is
/// [`PersistError::Invalid`] with the path and what is wrong as its `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    /// Opening, reading or writing the file failed, or the path may not be read or written (a
    /// FIFO, a device, a symlink as the target, one of the model's files, past the size cap).
    #[error(transparent)]
    File(#[from] FileError),
    /// The file is no session this session can take; `problem` says why.
    #[error("cannot restore the session from {}", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        problem: Box<PersistError>,
    },
    /// The file does not start with the session magic.
    #[error("it is not an htpkv session file (it starts with {found:02x?})")]
    Magic { found: Vec<u8> },
    /// The file was written by another version of the format.
    #[error(
        "its format version {found} is not supported (this build reads versions 1 and {VERSION})"
    )]
    Version { found: u32 },
    /// The file ends before a field it announces.
    #[error("it is truncated: {field} at offset {offset} needs {needed} bytes, {available} left")]
    Truncated {
        field: &'static str,
        offset: usize,
        needed: u64,
        available: usize,
    },
    /// The payload does not match its checksum.
    #[error("it is corrupted: stored checksum {stored:08x}, computed {computed:08x}")]
    Checksum { stored: u32, computed: u32 },
    /// A field holds a value no writer produces.
    #[error("it is malformed: {0}")]
    Malformed(String),
    /// The saved K/V rows differ from this session's cache in `what`.
    #[error("it holds {what} {file}, this model's KV cache {model}")]
    Mismatch {
        what: String,
        file: String,
        model: String,
    },
    /// The K/V rows could not be put into this session's cache.
    #[error("its K/V rows cannot be imported")]
    Cache(#[source] KvError),
    /// The file was saved for another compiled model.
    #[error("it was saved for another model (fingerprint {file:08x}, this model {model:08x})")]
    OtherModel { file: u32, model: u32 },
}

impl PersistError {
    /// The error's kind: `io` when the file could not be read or written, `bad_session` when it
    /// holds no session this one can take.
    pub fn kind(&self) -> &'static str {
        match self {
            PersistError::File(_) => "io",
            _ => "bad_session",
        }
    }

    /// What is wrong with the file: the `problem` of [`PersistError::Invalid`], else `self`.
    pub fn problem(&self) -> &PersistError {
        match self {
            PersistError::Invalid { problem, .. } => problem,
            other => other,
        }
    }
}

/// The cap of a session file of a model whose largest session takes `max` bytes.
fn session_kind(max: u64) -> FileKind {
    FileKind::new("session file", max)
}

/// A parsed session file.
#[derive(Debug)]
struct SavedSession {
    fingerprint: u32,
    snapshot: KvSnapshot,
    tokens: Vec<u32>,
    position_offset: usize,
    logits: Vec<f32>,
}

/// The model's identity: CRC-32 of every graph's name and tensors (name, role, layer, head, shape,
/// element type, encoding). Two compilations of one checkpoint with the same options agree; another
/// context, AR set, K/V layout, element type or calibration gives another fingerprint. Weights are not
/// part of a graph description: checkpoints of one architecture differ only through their calibrated
/// encodings, and with float K/V they share a fingerprint.
pub fn fingerprint(graphs: &[GraphDesc]) -> u32 {
    let mut w = Vec::new();
    for g in graphs {
        put_str(&mut w, &g.name);
        for t in g.inputs.iter().chain(&g.outputs) {
            put_str(&mut w, &t.name);
            put_str(
                &mut w,
                &format!("{:?} {:?} {:?} {:?}", t.role, t.layer, t.head, t.dtype),
            );
            put_u32(&mut w, t.shape.len() as u32);
            t.shape.iter().for_each(|&d| put_u32(&mut w, d as u32));
            match &t.quant {
                Some(q) => put_encoding(&mut w, q),
                None => w.push(0xff),
            }
        }
    }
    crc32(&w)
}

impl<B: Backend> Session<B> {
    /// Writes the session to `path` with the one atomic writer ([`model::fsio`]), refusing a
    /// `path` that is not a regular file (a device, FIFO, socket, symlink, directory) or is one of
    /// `inputs` (the model's files: `htpkv::engine::Model::inputs`); format: [`crate::persist`].
    pub fn save(&self, path: &Path, inputs: &[&Path]) -> Result<(), PersistError> {
        let bytes = encode(
            fingerprint(self.backend().graphs()),
            &self.cache().export_rows(),
            self.tokens(),
            self.cache().position_offset() as u32,
            self.last_logits(),
        );
        Ok(write_atomic_verified(
            path,
            &bytes,
            inputs,
            &mut |_| Ok(()),
        )?)
    }

    /// Replaces the session's tokens, K/V rows and last logits with those saved in `path`. The file
    /// must come from the same compiled model (any strategy); on any error the session is unchanged.
    pub fn restore(&mut self, path: &Path) -> Result<(), PersistError> {
        let data = read_capped(path, session_kind(self.max_file_bytes()))?;
        self.restore_bytes(&data)
            .map_err(|problem| PersistError::Invalid {
                path: path.to_path_buf(),
                problem: Box::new(problem),
            })
    }

    /// [`Self::restore`] of a file's bytes.
    fn restore_bytes(&mut self, data: &[u8]) -> Result<(), PersistError> {
        let saved = decode_windowed(data, &self.cache().spec().geometry.windows)?;
        saved
            .snapshot
            .check_fits(self.cache())
            .map_err(|e| self.in_words(&saved.snapshot, e))?;
        let model = fingerprint(self.backend().graphs());
        if saved.fingerprint != model {
            return Err(PersistError::OtherModel {
                file: saved.fingerprint,
                model,
            });
        }
        if let Some(&t) = saved
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.vocab_size())
        {
            return Err(PersistError::Malformed(format!(
                "token {t} is outside the vocabulary of {} tokens",
                self.vocab_size()
            )));
        }
        if !saved.logits.is_empty()
            && (saved.logits.len() != self.vocab_size() || saved.tokens.is_empty())
        {
            return Err(PersistError::Malformed(format!(
                "{} logits for {} tokens and a vocabulary of {}",
                saved.logits.len(),
                saved.tokens.len(),
                self.vocab_size()
            )));
        }
        let (cache, tokens, logits) = self.state_mut();
        cache
            .import_rows(&saved.snapshot)
            .map_err(PersistError::Cache)?;
        cache.set_position_offset(saved.position_offset);
        *tokens = saved.tokens;
        *logits = saved.logits;
        Ok(())
    }

    /// Runs the last token of `generation` into the cache when `generate` sampled it without feeding it
    /// back (it stopped on the token budget or the callback), so that the cache holds the whole text and
    /// the logits of its last token: a session saved then continues exactly where the text stopped.
    /// When the context has no room left for it, the last logits are dropped instead, so continuing
    /// is refused rather than repeating that token.
    pub fn feed_last(&mut self, generation: &Generation) -> Result<(), SessionError> {
        let Some(&last) = generation.tokens.last() else {
            return Ok(());
        };
        match generation.stop {
            StopReason::EndOfText => Ok(()),
            _ if self.len() < self.capacity() => self.decode(last).map(|_| ()),
            _ => self.rollback(self.len()),
        }
    }

    /// The largest file a session of this model can be saved as.
    /// A snapshot mismatch in words (the cache's message prints encodings as Rust values).
    fn in_words(&self, snapshot: &KvSnapshot, e: KvError) -> PersistError {
        let KvError::SnapshotMismatch {
            what,
            cache,
            snapshot: saved,
        } = e
        else {
            return PersistError::Cache(e);
        };
        let g = &self.cache().spec().geometry;
        let differs = (0..snapshot
            .encodings
            .len()
            .min(self.cache().spec().encodings.len()))
            .find(|&b| snapshot.encodings[b] != *self.cache().encoding(b));
        match differs {
            Some(b) if what.ends_with("encoding") => {
                let (layer, head, _) = g.buffer_coords(b);
                PersistError::Mismatch {
                    what: format!("a {what} for layer {layer} head {head} of"),
                    file: encoding_words(&snapshot.encodings[b]),
                    model: format!("has {}", encoding_words(self.cache().encoding(b))),
                }
            }
            _ => PersistError::Mismatch {
                what: format!("a {what} of"),
                file: saved,
                model: format!("has {cache}"),
            },
        }
    }

    fn max_file_bytes(&self) -> u64 {
        let shape = RowShape::of(&self.cache().spec().geometry);
        let mut encodings = Vec::new();
        self.cache()
            .spec()
            .encodings
            .iter()
            .for_each(|q| put_encoding(&mut encodings, q));
        let capacity = self.capacity() as u64;
        let per_token = 4 + shape.buffers() as u64 * shape.row_bytes() as u64;
        (HEADER + 13 + encodings.len() + 12) as u64
            + 4 * self.vocab_size() as u64
            + capacity * per_token
    }
}

fn encode(
    fingerprint: u32,
    snapshot: &KvSnapshot,
    tokens: &[u32],
    position_offset: u32,
    logits: &[f32],
) -> Vec<u8> {
    let mut p = Vec::new();
    let shape = snapshot.shape;
    for n in [shape.layers, shape.kv_heads, shape.head_dim] {
        put_u32(&mut p, n as u32);
    }
    p.push(dtype_code(shape.dtype));
    snapshot
        .encodings
        .iter()
        .for_each(|q| put_encoding(&mut p, q));
    put_u32(&mut p, tokens.len() as u32);
    tokens.iter().for_each(|&t| put_u32(&mut p, t));
    put_u32(&mut p, position_offset);
    put_u32(&mut p, logits.len() as u32);
    logits
        .iter()
        .for_each(|x| p.extend_from_slice(&x.to_le_bytes()));
    snapshot.rows.iter().for_each(|r| p.extend_from_slice(r));
    let mut out = Vec::with_capacity(HEADER + p.len());
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, 0);
    out.extend_from_slice(&(p.len() as u64).to_le_bytes());
    put_u32(&mut out, crc32(&p));
    put_u32(&mut out, fingerprint);
    out.extend_from_slice(&p);
    out
}

#[cfg(test)]
fn decode(data: &[u8]) -> Result<SavedSession, PersistError> {
    decode_windowed(data, &[])
}

/// Decodes a session file of a model whose layers have the attention windows `windows` (empty:
/// all global): a sliding layer's buffers hold only their last `min(len, W - 1)` rows, as
/// [`kv_manager::KvCache::export_rows`] saves them.
fn decode_windowed(data: &[u8], windows: &[Option<usize>]) -> Result<SavedSession, PersistError> {
    let mut r = Reader::new(data);
    let magic = r.take(8, "magic")?;
    if magic != MAGIC {
        return Err(PersistError::Magic {
            found: magic.to_vec(),
        });
    }
    let version = r.u32("version")?;
    if version != VERSION && version != 1 {
        return Err(PersistError::Version { found: version });
    }
    let reserved = r.u32("reserved")?;
    if reserved != 0 {
        return Err(PersistError::Malformed(format!(
            "reserved header field is {reserved:#x}, not 0"
        )));
    }
    let payload_len = r.u64("payload length")?;
    let stored = r.u32("checksum")?;
    let fingerprint = r.u32("fingerprint")?;
    r.check(payload_len, "payload")?;
    if payload_len < (data.len() - HEADER) as u64 {
        return Err(PersistError::Malformed(format!(
            "{} bytes after the {payload_len}-byte payload",
            (data.len() - HEADER) as u64 - payload_len
        )));
    }
    let computed = crc32(&data[HEADER..]);
    if stored != computed {
        return Err(PersistError::Checksum { stored, computed });
    }
    let (snapshot, tokens, position_offset, logits) = read_payload(&mut r, version, windows)?;
    let left = r.0.remaining();
    if left != 0 {
        return Err(PersistError::Malformed(format!(
            "the payload has {left} bytes after the last row"
        )));
    }
    Ok(SavedSession {
        fingerprint,
        snapshot,
        tokens,
        position_offset,
        logits,
    })
}

type Payload = (KvSnapshot, Vec<u32>, usize, Vec<f32>);

fn read_payload(
    r: &mut Reader<'_>,
    version: u32,
    windows: &[Option<usize>],
) -> Result<Payload, PersistError> {
    let shape = RowShape {
        layers: r.u32("layers")? as usize,
        kv_heads: r.u32("kv_heads")? as usize,
        head_dim: r.u32("head_dim")? as usize,
        dtype: dtype_from(r.u8("dtype")?)?,
    };
    // Each buffer's encoding takes at least 2 bytes: the count is bounded by the file.
    let buffers = (shape.layers as u64)
        .saturating_mul(shape.kv_heads as u64)
        .saturating_mul(2);
    r.check(buffers.saturating_mul(2), "encodings")?;
    let buffers = buffers as usize;
    let encodings = (0..buffers)
        .map(|_| read_encoding(r))
        .collect::<Result<Vec<_>, _>>()?;
    let len = r.count(4, "token ids")?;
    let tokens = (0..len)
        .map(|_| r.u32("token id"))
        .collect::<Result<_, _>>()?;
    let position_offset = if version == 1 {
        0
    } else {
        r.u32("position offset")? as usize
    };
    if position_offset + len > i32::MAX as usize {
        return Err(PersistError::Malformed(format!(
            "position offset {position_offset} and {len} tokens pass the largest i32 position"
        )));
    }
    let count = r.count(4, "logits")?;
    let logits = (0..count)
        .map(|_| r.u32("logit").map(f32::from_bits))
        .collect::<Result<_, _>>()?;
    // Rows per buffer: len, or the last min(len, W - 1) of a sliding layer; their total is
    // checked against the file before anything is read.
    let held: Vec<usize> = (0..buffers)
        .map(|b| {
            let window = windows.get(b / (2 * shape.kv_heads)).copied().flatten();
            window.map_or(len, |w| len.min(w.saturating_sub(1)))
        })
        .collect();
    let total = held
        .iter()
        .fold(0u64, |sum, &h| sum.saturating_add(h as u64));
    r.check(total.saturating_mul(shape.row_bytes() as u64), "K/V rows")?;
    let rows = held
        .iter()
        .map(|&h| {
            r.take(h * shape.row_bytes(), "K/V rows")
                .map(<[u8]>::to_vec)
        })
        .collect::<Result<_, _>>()?;
    let snapshot = KvSnapshot {
        shape,
        encodings,
        len,
        rows,
    };
    Ok((snapshot, tokens, position_offset, logits))
}

fn read_encoding(r: &mut Reader<'_>) -> Result<QuantSpec, PersistError> {
    let dtype = dtype_from(r.u8("encoding dtype")?)?;
    let scale_offset = |r: &mut Reader<'_>| -> Result<ScaleOffset, PersistError> {
        Ok(ScaleOffset {
            scale: f32::from_bits(r.u32("scale")?),
            offset: r.u32("offset")? as i32,
        })
    };
    let encoding = match r.u8("encoding kind")? {
        0 => Encoding::Float,
        1 => Encoding::PerTensor(scale_offset(r)?),
        2 => {
            let axis = r.u32("axis")? as usize;
            let count = r.count(8, "per-axis encodings")?;
            let params = (0..count)
                .map(|_| scale_offset(r))
                .collect::<Result<_, _>>()?;
            Encoding::PerAxis { axis, params }
        }
        kind => {
            return Err(PersistError::Malformed(format!(
                "unknown encoding kind {kind}"
            )));
        }
    };
    Ok(QuantSpec { dtype, encoding })
}

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    put_u32(w, s.len() as u32);
    w.extend_from_slice(s.as_bytes());
}

fn put_encoding(w: &mut Vec<u8>, q: &QuantSpec) {
    w.push(dtype_code(q.dtype));
    let put_so = |w: &mut Vec<u8>, so: &ScaleOffset| {
        put_u32(w, so.scale.to_bits());
        put_u32(w, so.offset as u32);
    };
    match &q.encoding {
        Encoding::Float => w.push(0),
        Encoding::PerTensor(so) => {
            w.push(1);
            put_so(w, so);
        }
        Encoding::PerAxis { axis, params } => {
            w.push(2);
            put_u32(w, *axis as u32);
            put_u32(w, params.len() as u32);
            params.iter().for_each(|so| put_so(w, so));
        }
    }
}

fn dtype_code(dtype: DataType) -> u8 {
    DataType::REAL
        .iter()
        .position(|&d| d == dtype)
        .expect("listed") as u8
}

fn dtype_from(code: u8) -> Result<DataType, PersistError> {
    DataType::REAL
        .get(usize::from(code))
        .copied()
        .ok_or_else(|| PersistError::Malformed(format!("unknown data type code {code}")))
}

/// Reads little-endian fields ([`model::le::LeReader`]), each failure a
/// [`PersistError::Truncated`] naming the field.
struct Reader<'a>(LeReader<&'a [u8]>);

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader(LeReader::from_slice(data))
    }

    fn check(&self, needed: u64, field: &'static str) -> Result<(), PersistError> {
        self.0.need(needed, field).map_err(truncated(field))
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], PersistError> {
        self.0.take(n, field).map_err(truncated(field))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, PersistError> {
        self.0.u8(field).map_err(truncated(field))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, PersistError> {
        self.0.u32(field).map_err(truncated(field))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, PersistError> {
        self.0.u64(field).map_err(truncated(field))
    }

    /// A u32 count of `elem` -byte items that must fit in the bytes left.
    fn count(&mut self, elem: u64, field: &'static str) -> Result<usize, PersistError> {
        let n = self.u32(field)?;
        self.check(u64::from(n) * elem, field)?;
        Ok(n as usize)
    }
}

/// A short read of `field` as the session file's error (a slice reader has no other failure).
fn truncated(field: &'static str) -> impl FnOnce(ReadError) -> PersistError {
    move |e| match e {
        ReadError::Short {
            offset,
            needed,
            available,
            ..
        } => PersistError::Truncated {
            field,
            offset: offset as usize,
            needed,
            available: available as usize,
        },
        other => PersistError::Malformed(other.to_string()),
    }
}

/// A K/V encoding in words: `u8, scale 0.0123 offset -128`, `f16 (float)`, `u8 per-axis (axis 2,
/// 64 scales)`.
fn encoding_words(q: &QuantSpec) -> String {
    match &q.encoding {
        Encoding::Float => format!("{} (float)", q.dtype),
        Encoding::PerTensor(so) => format!("{}, scale {} offset {}", q.dtype, so.scale, so.offset),
        Encoding::PerAxis { axis, params } => format!(
            "{} per-axis (axis {axis}, {} scales)",
            q.dtype,
            params.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (KvSnapshot, Vec<u32>, Vec<f32>) {
        let shape = RowShape {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
            dtype: DataType::U16,
        };
        let so = |scale, offset| ScaleOffset { scale, offset };
        let encodings = vec![
            QuantSpec {
                dtype: DataType::U16,
                encoding: Encoding::PerAxis {
                    axis: 3,
                    params: vec![so(0.5, -3), so(0.25, 7)],
                },
            },
            QuantSpec {
                dtype: DataType::U16,
                encoding: Encoding::PerTensor(so(0.125, -32768)),
            },
        ];
        let rows = vec![(0..12).collect(), (100..112).collect()];
        let snapshot = KvSnapshot {
            shape,
            encodings,
            len: 3,
            rows,
        };
        (snapshot, vec![1, 5, 9], vec![0.5, -1.0, f32::MIN_POSITIVE])
    }

    #[test]
    fn a_sliding_layer_saves_only_its_last_window_rows() {
        let (mut snapshot, tokens, logits) = sample();
        // Window 3: the last 2 of the 3 tokens' rows (4 bytes each) per buffer.
        snapshot.rows.iter_mut().for_each(|r| {
            r.drain(..4);
        });
        let bytes = encode(7, &snapshot, &tokens, 0, &logits);
        let saved = decode_windowed(&bytes, &[Some(3)]).unwrap();
        assert_eq!(saved.snapshot, snapshot);
        // Read as all-global rows, the file is too short.
        assert!(decode(&bytes).is_err());
    }

    #[test]
    fn files_round_trip_and_every_prefix_or_bit_flip_is_an_error() {
        let (snapshot, tokens, logits) = sample();
        let bytes = encode(0xabcd_ef01, &snapshot, &tokens, 17, &logits);
        let saved = decode(&bytes).unwrap();
        assert_eq!(saved.fingerprint, 0xabcd_ef01);
        assert_eq!(saved.position_offset, 17);
        assert_eq!(saved.snapshot, snapshot);
        assert_eq!((&saved.tokens, &saved.logits), (&tokens, &logits));
        // A version 1 file (no position offset) still reads, with offset 0.
        let mut v1 = encode(0xabcd_ef01, &snapshot, &tokens, 0, &logits);
        let at = v1.len() - 4 * (logits.len() + 1) - snapshot.rows.concat().len() - 4;
        v1.drain(at..at + 4);
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let payload = (v1.len() - HEADER) as u64;
        v1[16..24].copy_from_slice(&payload.to_le_bytes());
        let crc = crc32(&v1[HEADER..]);
        v1[24..28].copy_from_slice(&crc.to_le_bytes());
        let old = decode(&v1).unwrap();
        assert_eq!((old.position_offset, &old.tokens), (0, &tokens));
        assert_eq!(old.snapshot, snapshot);
        let mut far = bytes.clone();
        let at = far.len() - 4 * (logits.len() + 1) - snapshot.rows.concat().len() - 4;
        far[at..at + 4].copy_from_slice(&(i32::MAX as u32).to_le_bytes());
        let crc = crc32(&far[HEADER..]);
        far[24..28].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&far), Err(PersistError::Malformed(_))));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "prefix of {cut} bytes");
        }
        for at in (0..bytes.len()).filter(|&at| !(28..32).contains(&at)) {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x04;
            assert!(decode(&flipped).is_err(), "bit flip at {at}");
        }
    }
}
