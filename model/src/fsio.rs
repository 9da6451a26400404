//! Reading input files with a size cap, and writing output files atomically without clobbering
//! anything that is not a regular file (or an input). Every htpkv crate that touches files goes
//! through these two functions.
//!
//! # Size caps
//! Each kind of input file has a maximum size ([`FileKind`]), checked twice: against the file's
//! metadata before reading (a regular file that is too large fails at once), and while reading (so
//! `/dev/zero`, a FIFO or a growing file stops at the cap). The caps:
//!
//! | kind | cap |
//! |---|---|
//! | llama2.c checkpoint ([`FileKind::CHECKPOINT`]) | 64 GiB (a stream also stops after the size its header implies) |
//! | llama2.c tokenizer ([`FileKind::TOKENIZER`]) | 64 MiB |
//! | compiled model ([`FileKind::COMPILED`]) | 64 GiB (a stream also stops after the size its header implies) |
//! | calibration prompts ([`FileKind::PROMPTS`]) | 16 MiB |
//! | YAML config ([`FileKind::CONFIG`]) | 1 MiB |
//! | safetensors shard ([`FileKind::SAFETENSORS`]) | 64 GiB |
//!
//! GGUF files are not read whole: their header is parsed against the file's length and every
//! tensor is read at its checked offset (`gguf`).
//!
//! # Output files
//! [`write_atomic`] refuses to replace anything that is not a regular file (a directory, device,
//! FIFO, socket or symlink) and a path that is one of the command's inputs (same device and
//! inode); it writes a temporary file in the same directory, fsyncs it, lets the caller verify it,
//! renames it over the target and fsyncs the directory. On any failure the old file is untouched
//! and the temporary file is removed.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A kind of input file and its size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKind {
    /// What the file is, for messages (`checkpoint`, `tokenizer`, ...).
    pub what: &'static str,
    /// The largest size accepted, in bytes.
    pub max_bytes: u64,
}

impl FileKind {
    /// A llama2.c checkpoint.
    pub const CHECKPOINT: FileKind = FileKind::new("checkpoint", 64 << 30);
    /// A llama2.c tokenizer.
    pub const TOKENIZER: FileKind = FileKind::new("tokenizer", 64 << 20);
    /// A compiled model (reference-backend context binary, or a QNN context binary).
    pub const COMPILED: FileKind = FileKind::new("compiled model", 64 << 30);
    /// A calibration prompt file (one prompt per line).
    pub const PROMPTS: FileKind = FileKind::new("calibration prompt file", 16 << 20);
    /// A YAML model config.
    pub const CONFIG: FileKind = FileKind::new("config", 1 << 20);
    /// A safetensors shard.
    pub const SAFETENSORS: FileKind = FileKind::new("safetensors shard", 64 << 30);

    /// A kind with its cap.
    pub const fn new(what: &'static str, max_bytes: u64) -> FileKind {
        FileKind { what, max_bytes }
    }
}

/// Errors of reading or writing a file; each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// An I/O operation failed (the cause is the `source`).
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done: `open`, `read`, `create`, `write`, `sync`, `rename`, ...
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than its kind allows.
    #[error("{what} {} is larger than the {max_bytes}-byte cap for a {what}{}",
        path.display(),
        found.map(|n| format!(" ({n} bytes)")).unwrap_or_default())]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        max_bytes: u64,
        /// The size, when the metadata tells it (not for streams).
        found: Option<u64>,
    },
    /// An input path is a directory.
    #[error("{what} {} is a directory, not a file", path.display())]
    IsDirectory { what: &'static str, path: PathBuf },
    /// The output path exists and is not a regular file.
    #[error("refusing to write {}: it is a {found}, not a regular file", path.display())]
    NotRegular { path: PathBuf, found: &'static str },
    /// The output path is one of the inputs.
    #[error("refusing to write {}: it is the same file as the input {}", path.display(), input.display())]
    SameAsInput { path: PathBuf, input: PathBuf },
    /// The caller's check of the written temporary file failed; the target was left untouched.
    #[error("the new {} failed verification and was not written", path.display())]
    Verify {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
}

impl FileError {
    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FileError + 'a {
        move |source| FileError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// An input file opened for reading under its kind's cap.
#[derive(Debug)]
pub struct CappedFile {
    path: PathBuf,
    kind: FileKind,
    file: File,
    /// The metadata size of a regular file (`None` for streams and devices).
    regular_len: Option<u64>,
    read: u64,
}

impl CappedFile {
    /// Opens `path`, refusing a directory and a regular file larger than the cap.
    pub fn open(path: &Path, kind: FileKind) -> Result<CappedFile, FileError> {
        let file = File::open(path).map_err(FileError::io("open", path))?;
        let meta = file.metadata().map_err(FileError::io("stat", path))?;
        if meta.is_dir() {
            return Err(FileError::IsDirectory {
                what: kind.what,
                path: path.to_path_buf(),
            });
        }
        let regular_len = meta.is_file().then_some(meta.len());
        if let Some(len) = regular_len.filter(|&n| n > kind.max_bytes) {
            return Err(FileError::TooLarge {
                what: kind.what,
                path: path.to_path_buf(),
                max_bytes: kind.max_bytes,
                found: Some(len),
            });
        }
        Ok(CappedFile {
            path: path.to_path_buf(),
            kind,
            file,
            regular_len,
            read: 0,
        })
    }

    /// The path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends bytes to `buf` until the file has given `total` bytes in all (fewer at its end).
    /// Never reads past the kind's cap: asking for more than the cap reads the cap plus one byte
    /// and fails with [`FileError::TooLarge`] if that byte exists.
    pub fn read_up_to(&mut self, buf: &mut Vec<u8>, total: u64) -> Result<(), FileError> {
        let limit = total.min(self.kind.max_bytes.saturating_add(1));
        let want = limit.saturating_sub(self.read);
        let before = buf.len();
        (&mut self.file)
            .take(want)
            .read_to_end(buf)
            .map_err(FileError::io("read", &self.path))?;
        self.read += (buf.len() - before) as u64;
        if self.read > self.kind.max_bytes {
            return Err(FileError::TooLarge {
                what: self.kind.what,
                path: self.path.clone(),
                max_bytes: self.kind.max_bytes,
                found: self.regular_len,
            });
        }
        Ok(())
    }

    /// Reads the rest of the file. A regular file is read whole (its size was checked against
    /// the cap); a stream (FIFO, device) is read up to `stream_total` bytes in all, which a
    /// parser derives from a header it has read, plus one byte so that trailing data still shows.
    pub fn read_rest(&mut self, buf: &mut Vec<u8>, stream_total: u64) -> Result<(), FileError> {
        let total = match self.regular_len {
            Some(_) => u64::MAX,
            None => stream_total.saturating_add(1),
        };
        self.read_up_to(buf, total)
    }
}

/// Reads a whole input file of `kind` (at most its cap; see the module docs).
pub fn read_capped(path: &Path, kind: FileKind) -> Result<Vec<u8>, FileError> {
    let mut f = CappedFile::open(path, kind)?;
    let mut buf = Vec::new();
    f.read_up_to(&mut buf, u64::MAX)?;
    Ok(buf)
}

/// Checks that `path` may be written as an output: it is new or a regular file (not a symlink,
/// directory, device, FIFO or socket), and not the same file as any of `inputs`.
pub fn check_output(path: &Path, inputs: &[&Path]) -> Result<(), FileError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FileError::io("stat", path)(e)),
    };
    let ft = meta.file_type();
    if !ft.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
            found: file_type_name(&ft),
        });
    }
    for input in inputs {
        if let Ok(im) = std::fs::metadata(input)
            && same_file(&meta, &im)
        {
            return Err(FileError::SameAsInput {
                path: path.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

fn file_type_name(ft: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return "character device";
        }
        if ft.is_block_device() {
            return "block device";
        }
        if ft.is_fifo() {
            return "FIFO";
        }
        if ft.is_socket() {
            return "socket";
        }
    }
    if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// The error a verifier returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A check of the written temporary file (its path) before it replaces the target.
pub type Verifier<'a> = &'a mut dyn FnMut(&Path) -> Result<(), BoxError>;

/// Writes `contents` to `path` atomically (see the module docs) after [`check_output`].
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), FileError> {
    write_atomic_verified(path, contents, &[], &mut |_| Ok(()))
}

/// Like [`write_atomic`], refusing `path` when it is one of `inputs`, and calling `verify` on the
/// complete, fsynced temporary file before it replaces `path`: when `verify` fails, `path` keeps
/// its old contents and the error is [`FileError::Verify`].
pub fn write_atomic_verified(
    path: &Path,
    contents: &[u8],
    inputs: &[&Path],
    verify: Verifier<'_>,
) -> Result<(), FileError> {
    check_output(path, inputs)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{file_name}.tmp{}", std::process::id()));
    let result = write_verify_rename(&tmp, path, contents, verify);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn write_verify_rename(
    tmp: &Path,
    path: &Path,
    contents: &[u8],
    verify: Verifier<'_>,
) -> Result<(), FileError> {
    // create_new: never follow or reuse whatever sits at the temporary name.
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(FileError::io("create", tmp))?;
    f.write_all(contents).map_err(FileError::io("write", tmp))?;
    f.sync_all().map_err(FileError::io("sync", tmp))?;
    drop(f);
    verify(tmp).map_err(|source| FileError::Verify {
        path: path.to_path_buf(),
        source,
    })?;
    // The target may have changed since the first check (e.g. replaced by a symlink).
    check_output(path, &[])?;
    std::fs::rename(tmp, path).map_err(FileError::io("rename", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("htpkv-fsio-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn dev_zero_stops_at_the_cap() {
        let kind = FileKind::new("test file", 4096);
        match read_capped(Path::new("/dev/zero"), kind) {
            Err(FileError::TooLarge {
                max_bytes: 4096,
                found: None,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let e = read_capped(Path::new("/dev/zero"), kind).unwrap_err();
        assert_eq!(
            e.to_string(),
            "test file /dev/zero is larger than the 4096-byte cap for a test file"
        );
    }

    #[test]
    fn regular_files_are_checked_by_metadata_and_read_whole() {
        let dir = scratch("regular");
        let p = dir.join("f");
        std::fs::write(&p, vec![7u8; 100]).unwrap();
        assert_eq!(read_capped(&p, FileKind::new("x", 100)).unwrap().len(), 100);
        let e = read_capped(&p, FileKind::new("x", 99)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "x {} is larger than the 99-byte cap for a x (100 bytes)",
                p.display()
            )
        );
        let mut f = CappedFile::open(&p, FileKind::new("x", 100)).unwrap();
        let mut buf = Vec::new();
        f.read_up_to(&mut buf, 10).unwrap();
        assert_eq!(buf.len(), 10);
        f.read_rest(&mut buf, 20).unwrap();
        assert_eq!(buf.len(), 100, "a regular file is read whole");
        assert!(matches!(
            read_capped(&dir, FileKind::new("x", 100)),
            Err(FileError::IsDirectory { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn streams_stop_after_what_the_header_implies() {
        let mut f = CappedFile::open(Path::new("/dev/zero"), FileKind::new("x", 1 << 30)).unwrap();
        let mut buf = Vec::new();
        f.read_up_to(&mut buf, 8).unwrap();
        f.read_rest(&mut buf, 100).unwrap();
        assert_eq!(buf.len(), 101);
    }

    #[test]
    fn missing_file_names_it_once_and_chains_the_cause() {
        let e = read_capped(Path::new("/nonexistent/x.bin"), FileKind::TOKENIZER).unwrap_err();
        assert_eq!(e.to_string(), "cannot open /nonexistent/x.bin");
        let cause = std::error::Error::source(&e).unwrap().to_string();
        assert!(cause.contains("No such file"), "{cause}");
    }

    #[test]
    fn refuses_special_files_symlinks_and_inputs() {
        let dir = scratch("out");
        let e = write_atomic(Path::new("/dev/null"), b"x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "refusing to write /dev/null: it is a character device, not a regular file"
        );
        let target = dir.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            write_atomic(&link, b"new"),
            Err(FileError::NotRegular {
                found: "symbolic link",
                ..
            })
        ));
        assert!(matches!(
            write_atomic(&dir, b"new"),
            Err(FileError::NotRegular {
                found: "directory",
                ..
            })
        ));
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(matches!(
                write_atomic(&fifo, b"new"),
                Err(FileError::NotRegular { found: "FIFO", .. })
            ));
        }
        // The same file under another name (a hard link) is an input.
        let alias = dir.join("alias");
        std::fs::hard_link(&target, &alias).unwrap();
        let e = write_atomic_verified(&alias, b"new", &[&target], &mut |_| Ok(())).unwrap_err();
        assert!(matches!(e, FileError::SameAsInput { .. }), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_verification_keeps_the_old_file() {
        let dir = scratch("verify");
        let p = dir.join("model");
        write_atomic(&p, b"good").unwrap();
        let e = write_atomic_verified(&p, b"bad", &[], &mut |tmp| {
            assert_eq!(std::fs::read(tmp).unwrap(), b"bad");
            Err("not a model".into())
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the new {} failed verification and was not written",
                p.display()
            )
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"good");
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no leftovers");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
