//! Reading input files with a size cap, and writing output files atomically without clobbering
//! anything that is not a regular file (or an input). Every file htpkv reads or writes goes through
//! this module: [`CappedFile`] / [`read_capped`] / [`read_text_capped`] / [`open_regular`] for
//! inputs, [`check_output`] / [`write_atomic`] / [`write_atomic_verified`] for outputs.
//!
//! # Inputs: regular files only, under a cap
//! An input must be a regular file (a symlink to one is fine): it is opened with `O_NONBLOCK` and
//! checked with `fstat` on the open descriptor, so a FIFO is refused without blocking, and a
//! directory, device (`/dev/zero`), socket or FIFO is refused before a byte is read. Each kind of
//! input has a maximum size ([`FileKind`]), checked against the file's size before reading and
//! enforced while reading (a file growing under us still stops at the cap). Parsers with a header
//! read it first ([`CappedFile::read_up_to`]) and compare the size it implies with
//! [`CappedFile::len`] before reading the rest. The caps are sized for a phone (at most 16 GB of
//! memory, of which an app gets a fraction):
//!
//! | kind | cap | why |
//! |---|---|---|
//! | llama2.c checkpoint ([`FileKind::CHECKPOINT`]) | 16 GiB | read whole; more cannot be held on a phone |
//! | GGUF file ([`FileKind::GGUF`]) | 16 GiB | tensors are read at their offsets, the file is hashed for the cache key |
//! | safetensors shard ([`FileKind::SAFETENSORS`]) | 16 GiB | transformers writes shards of at most 5 GB by default |
//! | compiled model ([`FileKind::COMPILED`]) | 16 GiB | reference-backend file with all weights |
//! | QNN context binary ([`FileKind::CONTEXT_BINARY`]) | 4 GiB | the HTP maps a context in a 32-bit address space; Genie splits models into parts below this |
//! | tokenizer (llama2.c `.bin`, `tokenizer.json`; [`FileKind::TOKENIZER`]) | 64 MiB | the largest `tokenizer.json` we know (Gemma 3) is 33 MB |
//! | Hugging Face JSON (`config.json`, `tokenizer_config.json`; [`FileKind::HF_JSON`]) | 16 MiB | chat templates and added tokens live here |
//! | calibration prompts ([`FileKind::PROMPTS`]) | 16 MiB | |
//! | texts to score ([`FileKind::TEXT`]) | 16 MiB | |
//! | YAML or JSON config (`budget`/`plan` configs, conventions, `genie_config.json`; [`FileKind::CONFIG`]) | 1 MiB | |
//! | session file | what a session of the loaded model can hold | computed from the model |
//!
//! Context binaries are read, not memory-mapped: a mapped file that another process truncates
//! raises `SIGBUS` on the next access, and htpkv must end every hostile input with an error, not a
//! signal. Each binary is read under its cap and freed once QNN has made its context.
//!
//! # Output files
//! [`write_atomic`] refuses to replace anything that is not a regular file (a directory, device,
//! FIFO, socket or symlink) and a path that is one of the command's inputs (same device and
//! inode, so a hard link or another spelling is caught); it writes a temporary file created
//! exclusively (`O_EXCL`, a name with a random part, mode 0600 until renamed) in the same
//! directory, fsyncs it, lets the caller verify it, checks the target again, renames the
//! temporary file over the target and fsyncs the directory. On any failure the old file is
//! untouched and the temporary file is removed. [`AtomicDir`] does the same for a directory of
//! files (a Genie bundle).

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
    pub const CHECKPOINT: FileKind = FileKind::new("checkpoint", 16 << 30);
    /// A GGUF model file.
    pub const GGUF: FileKind = FileKind::new("GGUF file", 16 << 30);
    /// A tokenizer: llama2.c's `tokenizer.bin`, or a Hugging Face `tokenizer.json`.
    pub const TOKENIZER: FileKind = FileKind::new("tokenizer", 64 << 20);
    /// A compiled model of the reference backend.
    pub const COMPILED: FileKind = FileKind::new("compiled model", 16 << 30);
    /// A QNN context binary (a `--compiled` file for QNN, a bundle part).
    pub const CONTEXT_BINARY: FileKind = FileKind::new("context binary", 4 << 30);
    /// A calibration prompt file (one prompt per line).
    pub const PROMPTS: FileKind = FileKind::new("calibration prompt file", 16 << 20);
    /// A text to score (`htpkv eval --text`).
    pub const TEXT: FileKind = FileKind::new("text", 16 << 20);
    /// A YAML or JSON config (model configs, conventions, `genie_config.json`).
    pub const CONFIG: FileKind = FileKind::new("config", 1 << 20);
    /// A Hugging Face folder's `config.json` or `tokenizer_config.json`.
    pub const HF_JSON: FileKind = FileKind::new("JSON file", 16 << 20);
    /// A safetensors shard.
    pub const SAFETENSORS: FileKind = FileKind::new("safetensors shard", 16 << 30);

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
        /// The size, when known.
        found: Option<u64>,
    },
    /// An input path is a directory.
    #[error("{what} {} is a directory, not a file", path.display())]
    IsDirectory { what: &'static str, path: PathBuf },
    /// An input path is a device, FIFO or socket.
    #[error("{what} {} is a {found}, not a regular file", path.display())]
    NotRegularInput {
        what: &'static str,
        path: PathBuf,
        found: &'static str,
    },
    /// A text input is not UTF-8.
    #[error("{what} {} is not UTF-8 text (at byte {at})", path.display())]
    NotText {
        what: &'static str,
        path: PathBuf,
        at: usize,
    },
    /// The output path exists and is not a regular file.
    #[error("refusing to write {}: it is a {found}, not a regular file", path.display())]
    NotRegular { path: PathBuf, found: &'static str },
    /// The output path is one of the inputs.
    #[error("refusing to write {}: {}", path.display(), same_as(path, input))]
    SameAsInput { path: PathBuf, input: PathBuf },
    /// An output directory exists and is not a directory (a file, symlink, device...).
    #[error("refusing to write the directory {}: it is a {found}", path.display())]
    NotDirectory { path: PathBuf, found: &'static str },
    /// An output directory holds one of the inputs (it would be replaced whole).
    #[error("refusing to replace the directory {}: it holds the input {}", path.display(), input.display())]
    HoldsInput { path: PathBuf, input: PathBuf },
    /// The caller's check of the written temporary file failed; the target was left untouched.
    #[error("the new {} failed verification and was not written", path.display())]
    Verify {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
}

/// How an output path is an input: named once when it is spelled the same.
fn same_as(path: &Path, input: &Path) -> String {
    if path.as_os_str() == input.as_os_str() {
        "it is one of this command's inputs".to_owned()
    } else {
        format!("it is the same file as the input {}", input.display())
    }
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

/// Opens `path` for reading if it is a regular file (see the module docs): `O_NONBLOCK`, so a
/// FIFO does not block, then `fstat` of the open file. Returns the file and its size; a size
/// above `kind`'s cap is refused.
pub fn open_regular(path: &Path, kind: FileKind) -> Result<(File, u64), FileError> {
    let mut options = File::options();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(FileError::io("open", path))?;
    let meta = file.metadata().map_err(FileError::io("stat", path))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(FileError::IsDirectory {
            what: kind.what,
            path: path.to_path_buf(),
        });
    }
    if !ft.is_file() {
        return Err(FileError::NotRegularInput {
            what: kind.what,
            path: path.to_path_buf(),
            found: file_type_name(&ft),
        });
    }
    if meta.len() > kind.max_bytes {
        return Err(FileError::TooLarge {
            what: kind.what,
            path: path.to_path_buf(),
            max_bytes: kind.max_bytes,
            found: Some(meta.len()),
        });
    }
    Ok((file, meta.len()))
}

/// An input file opened for reading under its kind's cap.
#[derive(Debug)]
pub struct CappedFile {
    path: PathBuf,
    kind: FileKind,
    file: File,
    /// The size when opened.
    len: u64,
    read: u64,
}

impl CappedFile {
    /// Opens `path` with [`open_regular`].
    pub fn open(path: &Path, kind: FileKind) -> Result<CappedFile, FileError> {
        let (file, len) = open_regular(path, kind)?;
        Ok(CappedFile {
            path: path.to_path_buf(),
            kind,
            file,
            len,
            read: 0,
        })
    }

    /// The path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size when it was opened (at most the cap).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends bytes to `buf` until the file has given `total` bytes in all (fewer at its end).
    /// Never reads past the kind's cap: asking for more than the cap reads the cap plus one byte
    /// and fails with [`FileError::TooLarge`] if that byte exists (a file that grew).
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
                found: None,
            });
        }
        Ok(())
    }

    /// Reads the rest of the file (at most its cap).
    pub fn read_rest(&mut self, buf: &mut Vec<u8>) -> Result<(), FileError> {
        self.read_up_to(buf, u64::MAX)
    }
}

/// Reads a whole input file of `kind` (a regular file, at most its cap; see the module docs).
pub fn read_capped(path: &Path, kind: FileKind) -> Result<Vec<u8>, FileError> {
    let mut f = CappedFile::open(path, kind)?;
    let mut buf = Vec::with_capacity(f.len() as usize);
    f.read_rest(&mut buf)?;
    Ok(buf)
}

/// [`read_capped`] for a UTF-8 text file.
pub fn read_text_capped(path: &Path, kind: FileKind) -> Result<String, FileError> {
    String::from_utf8(read_capped(path, kind)?).map_err(|e| FileError::NotText {
        what: kind.what,
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })
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
    let dir = parent_dir(path);
    let (mut f, tmp) = create_temp(&dir, path, |p| {
        let mut o = File::options();
        o.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        o.open(p)
    })?;
    let result = (|| {
        f.write_all(contents)
            .map_err(FileError::io("write", &tmp))?;
        f.sync_all().map_err(FileError::io("sync", &tmp))?;
        drop(f);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
                .map_err(FileError::io("set the permissions of", &tmp))?;
        }
        verify(&tmp).map_err(|source| FileError::Verify {
            path: path.to_path_buf(),
            source,
        })?;
        rename_over(&tmp, path, inputs)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(&dir);
    Ok(())
}

/// The directory `path` is in (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Makes the durable rename of a file in `dir` (best effort: some file systems refuse to sync a
/// directory).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Checks the target again (it may have changed since the first check, e.g. been replaced by a
/// symlink), then renames `tmp` over it.
fn rename_over(tmp: &Path, path: &Path, inputs: &[&Path]) -> Result<(), FileError> {
    check_output(path, inputs)?;
    std::fs::rename(tmp, path).map_err(FileError::io("rename", path))
}

/// A temporary name beside `path` in `dir` with a random part: `.NAME.tmp-PID-RANDOM`.
fn temp_name(dir: &Path, path: &Path) -> PathBuf {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS's random source once per process, then varied per call.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    dir.join(format!(
        ".{file_name}.tmp-{}-{:016x}",
        std::process::id(),
        h.finish()
    ))
}

/// Creates a temporary entry beside `path` with `create`, which must fail with `AlreadyExists`
/// when the name is taken (`O_EXCL`, `mkdir`): a taken name is never followed or reused.
fn create_temp<T>(
    dir: &Path,
    path: &Path,
    mut create: impl FnMut(&Path) -> std::io::Result<T>,
) -> Result<(T, PathBuf), FileError> {
    let mut tries = 0;
    loop {
        let tmp = temp_name(dir, path);
        match create(&tmp) {
            Ok(made) => return Ok((made, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            // Named by the target: the temporary name means nothing to the user.
            Err(e) => return Err(FileError::io("create a temporary file for", path)(e)),
        }
    }
}

/// A directory written as a whole (a Genie bundle): files go into a fresh temporary directory
/// beside the target, and [`AtomicDir::commit`] renames it into place. Dropping it without a
/// commit removes the temporary directory, so a failure leaves nothing half-written.
#[derive(Debug)]
pub struct AtomicDir {
    target: PathBuf,
    tmp: PathBuf,
    inputs: Vec<PathBuf>,
    committed: bool,
}

impl AtomicDir {
    /// Starts writing the directory `target`, which must be new or an existing directory (not a
    /// symlink) that holds none of `inputs`.
    pub fn create(target: &Path, inputs: &[&Path]) -> Result<AtomicDir, FileError> {
        check_output_dir(target, inputs)?;
        let (_, tmp) = create_temp(&parent_dir(target), target, |p| std::fs::create_dir(p))?;
        Ok(AtomicDir {
            target: target.to_path_buf(),
            tmp,
            inputs: inputs.iter().map(|p| p.to_path_buf()).collect(),
            committed: false,
        })
    }

    /// The path of `name` in the directory being written (inside the temporary directory).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.tmp.join(name)
    }

    /// Writes the file `name` (fsynced; it is new, so no input can be at its path).
    pub fn write(&self, name: &str, contents: &[u8]) -> Result<(), FileError> {
        let p = self.path_of(name);
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(FileError::io("create", &p))?;
        f.write_all(contents).map_err(FileError::io("write", &p))?;
        f.sync_all().map_err(FileError::io("sync", &p))
    }

    /// Puts the directory in place: an existing directory at the target is swapped out whole
    /// (renamed aside, then removed), so the target holds the old or the new directory.
    pub fn commit(mut self) -> Result<(), FileError> {
        sync_dir(&self.tmp);
        let inputs: Vec<&Path> = self.inputs.iter().map(PathBuf::as_path).collect();
        check_output_dir(&self.target, &inputs)?;
        let parent = parent_dir(&self.target);
        let old = match std::fs::symlink_metadata(&self.target) {
            Ok(_) => {
                let (_, aside) =
                    create_temp(&parent, &self.target, |p| std::fs::rename(&self.target, p))?;
                Some(aside)
            }
            Err(_) => None,
        };
        if let Err(e) = std::fs::rename(&self.tmp, &self.target) {
            if let Some(aside) = &old {
                let _ = std::fs::rename(aside, &self.target);
            }
            return Err(FileError::io("rename", &self.target)(e));
        }
        self.committed = true;
        sync_dir(&parent);
        if let Some(aside) = old {
            let _ = std::fs::remove_dir_all(aside);
        }
        Ok(())
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// [`check_output`] for a directory: new, or a real directory (not a symlink) holding none of
/// `inputs` (it is replaced whole).
pub fn check_output_dir(path: &Path, inputs: &[&Path]) -> Result<(), FileError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FileError::io("stat", path)(e)),
    };
    if !meta.is_dir() {
        return Err(FileError::NotDirectory {
            path: path.to_path_buf(),
            found: match meta.file_type() {
                ft if ft.is_file() => "regular file",
                ft => file_type_name(&ft),
            },
        });
    }
    let Ok(dir) = std::fs::canonicalize(path) else {
        return Ok(());
    };
    for input in inputs {
        if let Ok(canon) = std::fs::canonicalize(input)
            && canon.starts_with(&dir)
        {
            return Err(FileError::HoldsInput {
                path: path.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::files::ScratchDir;

    /// Issue 21 finding 5: `/dev/zero` grew to the 64 GiB cap, a FIFO blocked at `open`.
    #[test]
    fn special_files_are_refused_before_reading_and_a_fifo_does_not_block() {
        let e = read_capped(Path::new("/dev/zero"), FileKind::new("test file", 4096)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "test file /dev/zero is a character device, not a regular file"
        );
        let dir = ScratchDir::new("fsio-fifo-in");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // No writer ever opens the FIFO: a blocking open would hang here.
            let e = read_capped(&fifo, FileKind::CONFIG).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("config {} is a FIFO, not a regular file", fifo.display())
            );
        }
        let link = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(matches!(
            read_capped(&link, FileKind::CONFIG),
            Err(FileError::NotRegularInput {
                found: "character device",
                ..
            })
        ));
    }

    #[test]
    fn regular_files_are_checked_by_metadata_and_read_whole() {
        let dir = ScratchDir::new("fsio-regular");
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
        assert_eq!(f.len(), 100);
        let mut buf = Vec::new();
        f.read_up_to(&mut buf, 10).unwrap();
        assert_eq!(buf.len(), 10);
        f.read_rest(&mut buf).unwrap();
        assert_eq!(buf.len(), 100, "a regular file is read whole");
        assert!(matches!(
            read_capped(&dir, FileKind::new("x", 100)),
            Err(FileError::IsDirectory { .. })
        ));
        std::fs::write(&p, b"ok \xff").unwrap();
        let e = read_text_capped(&p, FileKind::new("x", 100)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("x {} is not UTF-8 text (at byte 3)", p.display())
        );
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
        let dir = ScratchDir::new("fsio-out");
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
    }

    /// Issue 21 finding 1: the temporary file has an unpredictable name and is created
    /// exclusively; a file planted at a predictable name is neither followed nor clobbered.
    #[test]
    fn temporary_names_are_unpredictable_and_exclusive() {
        let dir = ScratchDir::new("fsio-tmpname");
        let p = dir.join("out");
        let a = temp_name(&dir, &p);
        let b = temp_name(&dir, &p);
        assert_ne!(a, b);
        assert!(
            a.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".out.tmp-")
        );
        // The old scheme's name, planted as a symlink to a precious file.
        let precious = dir.join("precious");
        std::fs::write(&precious, b"keep").unwrap();
        let planted = dir.join(format!(".out.tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&precious, &planted).unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep");
        // A taken name is never reused: create_temp tries another.
        let mut first = true;
        let (_, made) = create_temp(&dir, &p, |t| {
            if std::mem::take(&mut first) {
                Err(std::io::ErrorKind::AlreadyExists.into())
            } else {
                std::fs::create_dir(t)
            }
        })
        .unwrap();
        assert!(made.is_dir());
    }

    /// Issue 21 finding 14: a directory written whole, or not at all.
    #[test]
    fn an_atomic_dir_replaces_the_old_one_whole_or_leaves_it() {
        let dir = ScratchDir::new("fsio-atomicdir");
        let target = dir.join("bundle");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("old"), b"old").unwrap();
        {
            let d = AtomicDir::create(&target, &[]).unwrap();
            d.write("part1", b"1").unwrap();
            // Dropped without commit (a failed compile): nothing changes, nothing is left.
        }
        assert_eq!(std::fs::read(target.join("old")).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no leftovers");
        let d = AtomicDir::create(&target, &[]).unwrap();
        d.write("part1", b"1").unwrap();
        d.commit().unwrap();
        assert!(!target.join("old").exists());
        assert_eq!(std::fs::read(target.join("part1")).unwrap(), b"1");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no leftovers");
        // A directory holding an input, a file and a symlink are refused.
        let input = target.join("part1");
        let e = AtomicDir::create(&target, &[&input]).unwrap_err();
        assert!(matches!(e, FileError::HoldsInput { .. }), "{e}");
        let e = AtomicDir::create(&input, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "refusing to write the directory {}: it is a regular file",
                input.display()
            )
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            AtomicDir::create(&link, &[]),
            Err(FileError::NotDirectory {
                found: "symbolic link",
                ..
            })
        ));
    }

    #[test]
    fn a_failed_verification_keeps_the_old_file() {
        let dir = ScratchDir::new("fsio-verify");
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
    }
}
