//! Finding a model directory, and the upstream files' identities.

use std::path::{Path, PathBuf};

use super::{Checkpoint, ModelError, Tokenizer};

/// Checkpoint file name of the upstream stories260K model.
pub const CHECKPOINT_NAME: &str = "stories260K.bin";
/// Tokenizer file name of the upstream stories260K model.
pub const TOKENIZER_NAME: &str = "tok512.bin";
/// Generic checkpoint file name also accepted in a model directory.
pub const GENERIC_CHECKPOINT_NAME: &str = "model.bin";
/// Generic tokenizer file name also accepted in a model directory.
pub const GENERIC_TOKENIZER_NAME: &str = "tokenizer.bin";
/// Size of upstream `stories260K.bin`.
pub const STORIES260K_BYTES: u64 = 1_056_540;
/// sha256 of upstream `stories260K.bin`.
pub const STORIES260K_SHA256: &str =
    "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696";
/// Size of upstream `tok512.bin`.
pub const TOK512_BYTES: u64 = 6_227;
/// sha256 of upstream `tok512.bin`.
pub const TOK512_SHA256: &str = "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312";
/// Environment variable naming a model directory.
pub const MODEL_DIR_ENV: &str = "HTPKV_MODEL_DIR";

/// A model directory with its checkpoint and tokenizer paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The directory.
    pub dir: PathBuf,
    /// The checkpoint file inside it.
    pub checkpoint: PathBuf,
    /// The tokenizer file inside it.
    pub tokenizer: PathBuf,
}

/// The embedded default model: `models/stories260K` of the source tree this crate was built
/// from (committed with its license and hashes), so a fresh clone runs from any directory.
pub const EMBEDDED_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K");

impl ModelFiles {
    /// Finds a model directory.
    ///
    /// With `explicit = Some(dir)` only that directory is tried (asking for a specific model
    /// never silently falls back to another one). Otherwise, in order: `$HTPKV_MODEL_DIR`,
    /// `./models/stories260K` (relative to the current directory), the embedded default
    /// committed in this source tree ([`EMBEDDED_MODEL_DIR`]) and `../shared/models/stories260K`. A directory qualifies when it holds `stories260K.bin` + `tok512.bin`, or else
    /// `model.bin` + `tokenizer.bin`. The [`ModelError::ModelNotFound`] error lists every
    /// directory tried with the reason, and where to download the upstream files.
    pub fn discover(explicit: Option<&Path>) -> Result<ModelFiles, ModelError> {
        ModelFiles::discover_with(explicit, &[])
    }

    /// Like [`discover`](Self::discover), trying `extra` directories after the default ones
    /// (tests pass a path derived from `CARGO_MANIFEST_DIR`).
    pub fn discover_with(
        explicit: Option<&Path>,
        extra: &[PathBuf],
    ) -> Result<ModelFiles, ModelError> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(dir) = explicit {
            candidates.push(dir.to_path_buf());
        } else {
            if let Some(env) = std::env::var_os(MODEL_DIR_ENV).filter(|v| !v.is_empty()) {
                candidates.push(PathBuf::from(env));
            }
            candidates.push(PathBuf::from("models/stories260K"));
            candidates.push(PathBuf::from(EMBEDDED_MODEL_DIR));
            candidates.push(PathBuf::from("../shared/models/stories260K"));
            candidates.extend(extra.iter().cloned());
        }
        let mut tried = Vec::new();
        for dir in candidates {
            match ModelFiles::in_dir(&dir) {
                Ok(files) => return Ok(files),
                Err(why) => tried.push((dir, why)),
            }
        }
        Err(ModelError::ModelNotFound { tried })
    }

    /// Checks one directory; the error string says what is missing.
    fn in_dir(dir: &Path) -> Result<ModelFiles, String> {
        if !dir.exists() {
            return Err("does not exist".to_owned());
        }
        if !dir.is_dir() {
            return Err("not a directory".to_owned());
        }
        for (ck, tok) in [
            (CHECKPOINT_NAME, TOKENIZER_NAME),
            (GENERIC_CHECKPOINT_NAME, GENERIC_TOKENIZER_NAME),
        ] {
            let (c, t) = (dir.join(ck), dir.join(tok));
            if c.is_file() && t.is_file() {
                return Ok(ModelFiles {
                    dir: dir.to_path_buf(),
                    checkpoint: c,
                    tokenizer: t,
                });
            }
        }
        Err(format!(
            "holds neither {CHECKPOINT_NAME} + {TOKENIZER_NAME} nor {GENERIC_CHECKPOINT_NAME} + {GENERIC_TOKENIZER_NAME}"
        ))
    }

    /// The model of one llama2.c checkpoint file: its tokenizer is `tokenizer` when given, else the
    /// file beside it that llama2.c's own tools name: `tok{N}.bin` for a vocabulary of N (as
    /// `tok512.bin` beside `stories260K.bin`), else `tokenizer.bin` (the Llama 2 vocabulary).
    /// Only the checkpoint's 28-byte header is read here; a bad header is an error naming the file.
    pub fn for_checkpoint(
        checkpoint: &Path,
        tokenizer: Option<&Path>,
    ) -> Result<ModelFiles, ModelError> {
        let dir = checkpoint.parent().unwrap_or(Path::new(".")).to_path_buf();
        let tokenizer = match tokenizer {
            Some(t) => t.to_path_buf(),
            None => tokenizer_beside(checkpoint, &dir)?,
        };
        Ok(ModelFiles {
            dir,
            checkpoint: checkpoint.to_path_buf(),
            tokenizer,
        })
    }

    /// Loads the checkpoint, then the tokenizer with the checkpoint's vocabulary size.
    pub fn load(&self) -> Result<(Checkpoint, Tokenizer), ModelError> {
        let ckpt = Checkpoint::load(&self.checkpoint)?;
        let tok = Tokenizer::load(&self.tokenizer, ckpt.config.vocab_size)?;
        Ok((ckpt, tok))
    }
}

/// Lower-case hex SHA-256 of `bytes` (FIPS 180-4; a small self-contained implementation for
/// verifying model files and keying compiled models; it hashes in place, without copying).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha256(bytes))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes` (see [`sha256_hex`]).
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let bit_len = (bytes.len() as u64).wrapping_mul(8);
    let full = bytes.len() / 64 * 64;
    // The padded tail: the last partial block, 0x80, zeros, the bit length (one or two blocks).
    let mut tail = bytes[full..].to_vec();
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&bit_len.to_be_bytes());
    let mut w = [0u32; 64];
    for block in bytes[..full].chunks_exact(64).chain(tail.chunks_exact(64)) {
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (o, v) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&v.to_be_bytes());
    }
    out
}

/// The tokenizer llama2.c's tools would pair with `checkpoint` in `dir` (see
/// [`ModelFiles::for_checkpoint`]).
fn tokenizer_beside(checkpoint: &Path, dir: &Path) -> Result<PathBuf, ModelError> {
    let origin = checkpoint.display().to_string();
    let mut file = crate::fsio::CappedFile::open(checkpoint, crate::fsio::FileKind::CHECKPOINT)?;
    let mut header = Vec::with_capacity(super::HEADER_BYTES);
    file.read_up_to(&mut header, super::HEADER_BYTES as u64)?;
    let vocab = super::Config::from_header(&header, &origin)?.vocab_size;
    let names = [format!("tok{vocab}.bin"), GENERIC_TOKENIZER_NAME.to_owned()];
    names
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
        .ok_or_else(|| ModelError::ModelNotFound {
            tried: vec![(
                dir.to_path_buf(),
                format!(
                    "holds {} but neither {} nor {} beside it (give the tokenizer with --tokenizer FILE)",
                    checkpoint.file_name().unwrap_or_default().to_string_lossy(),
                    names[0],
                    names[1]
                ),
            )],
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // Many full blocks hashed in place, then the padded tail.
        assert_eq!(
            sha256_hex(&vec![b'a'; 1_000_000]),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn explicit_missing_dir_lists_it_and_download_hint() {
        let dir = PathBuf::from("/nonexistent/htpkv-llama2c-test-dir");
        let err = ModelFiles::discover(Some(&dir)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/htpkv-llama2c-test-dir: does not exist"),
            "{msg}"
        );
        assert!(msg.contains("karpathy/tinyllamas"), "{msg}");
        assert!(
            msg.contains(STORIES260K_SHA256) && msg.contains(TOK512_SHA256),
            "{msg}"
        );
        assert!(msg.contains("1056540") && msg.contains("6227"), "{msg}");
        match err {
            ModelError::ModelNotFound { tried } => assert_eq!(tried.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn generic_names_are_accepted() {
        let dir = test_support::files::ScratchDir::new("llama2c-files");
        std::fs::write(dir.join(GENERIC_CHECKPOINT_NAME), b"x").unwrap();
        let err = ModelFiles::discover(Some(&dir)).unwrap_err().to_string();
        assert!(err.contains("holds neither"), "{err}");
        std::fs::write(dir.join(GENERIC_TOKENIZER_NAME), b"y").unwrap();
        let found = ModelFiles::discover(Some(&dir)).unwrap();
        assert_eq!(found.checkpoint, dir.join(GENERIC_CHECKPOINT_NAME));
        assert_eq!(found.tokenizer, dir.join(GENERIC_TOKENIZER_NAME));
    }
}
