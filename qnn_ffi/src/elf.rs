//! The check every library path passes before `dlopen` (QNN's backend and system libraries,
//! `libGenie.so`): a truncated copy of a library is mapped by the dynamic loader past the file's
//! end, and touching that page raises `SIGBUS`; a FIFO blocks `dlopen`'s `open` for ever. So the
//! path must be a regular file (opened with `O_NONBLOCK` and checked with `fstat`), an ELF shared
//! object (or position-independent executable) whose program headers, and every segment they
//! describe, lie within the file's size.
//!
//! The file can still change between this check and `dlopen`; the check covers what is there when
//! htpkv starts, which is what a user passes by mistake.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest library checked whole: 4 GiB (Qualcomm's largest is about 100 MB).
const MAX_LIBRARY_BYTES: u64 = 4 << 30;

/// Checks that `path` is a library `dlopen` can map without a signal (see the module docs); the
/// error is the reason, for the caller to put in its own error naming the path. A bare name (no
/// `/`) is left to the loader, which searches its own path.
pub fn check_library(path: &Path) -> Result<(), String> {
    if path.components().count() == 1 && !path.has_root() {
        return Ok(());
    }
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open it: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let found = if kind.is_dir() {
            "directory"
        } else if kind.is_fifo() {
            "FIFO"
        } else if kind.is_socket() {
            "socket"
        } else {
            "device"
        };
        return Err(format!("it is a {found}, not a regular file"));
    }
    let len = meta.len();
    if len > MAX_LIBRARY_BYTES {
        return Err(format!(
            "it is {len} bytes, above the {MAX_LIBRARY_BYTES}-byte cap"
        ));
    }
    let mut head = [0u8; 64];
    let got = read_at_most(&mut file, &mut head)?;
    let elf = Elf::of(&head[..got])?;
    elf.check_segments(&mut file, len)
}

fn read_at_most(file: &mut File, buf: &mut [u8]) -> Result<usize, String> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("cannot read it: {e}")),
        }
    }
    Ok(got)
}

/// What the ELF header says about the program headers.
struct Elf {
    wide: bool,
    little: bool,
    phoff: u64,
    phentsize: u64,
    phnum: u64,
}

impl Elf {
    fn of(head: &[u8]) -> Result<Elf, String> {
        if head.len() < 52 || &head[..4] != b"\x7fELF" {
            return Err("it is not an ELF file (a shared library)".into());
        }
        let wide = match head[4] {
            1 => false,
            2 if head.len() >= 64 => true,
            c => return Err(format!("its ELF class {c} is neither 32 nor 64 bits")),
        };
        let little = match head[5] {
            1 => true,
            2 => false,
            d => return Err(format!("its ELF byte order {d} is unknown")),
        };
        let f = Fields {
            bytes: head,
            little,
        };
        let kind = f.u16(16);
        if kind != 3 {
            return Err(format!("its ELF type is {kind}, not a shared object (3)"));
        }
        let (phoff, phentsize, phnum) = if wide {
            (f.u64(32), u64::from(f.u16(54)), u64::from(f.u16(56)))
        } else {
            (
                u64::from(f.u32(28)),
                u64::from(f.u16(42)),
                u64::from(f.u16(44)),
            )
        };
        let least = if wide { 56 } else { 32 };
        if phnum > 0 && phentsize < least {
            return Err(format!(
                "its program header size {phentsize} is below {least}"
            ));
        }
        Ok(Elf {
            wide,
            little,
            phoff,
            phentsize,
            phnum,
        })
    }

    /// The program headers, and each segment they place in the file, lie within `len` bytes.
    fn check_segments(&self, file: &mut File, len: u64) -> Result<(), String> {
        use std::io::{Seek, SeekFrom};
        let table = self.phentsize * self.phnum;
        let end = self.phoff.checked_add(table).filter(|&e| e <= len);
        let Some(_) = end else {
            return Err(format!(
                "its program headers (bytes {}..+{table}) lie past its end ({len} bytes): a truncated copy?",
                self.phoff
            ));
        };
        file.seek(SeekFrom::Start(self.phoff))
            .map_err(|e| format!("cannot read its program headers: {e}"))?;
        let mut bytes = vec![0u8; table as usize];
        if read_at_most(file, &mut bytes)? != bytes.len() {
            return Err("its program headers end early (the file shrank?)".into());
        }
        for (i, entry) in bytes.chunks_exact(self.phentsize as usize).enumerate() {
            let f = Fields {
                bytes: entry,
                little: self.little,
            };
            let (offset, size) = if self.wide {
                (f.u64(8), f.u64(32))
            } else {
                (u64::from(f.u32(4)), u64::from(f.u32(16)))
            };
            if size > 0 && offset.checked_add(size).is_none_or(|e| e > len) {
                return Err(format!(
                    "its segment {i} (type {}, bytes {offset}..+{size}) lies past its end ({len} bytes): a truncated copy?",
                    f.u32(0)
                ));
            }
        }
        Ok(())
    }
}

/// Integers of an ELF structure in its byte order.
struct Fields<'a> {
    bytes: &'a [u8],
    little: bool,
}

impl Fields<'_> {
    fn take<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[at..at + N]);
        out
    }
    fn u16(&self, at: usize) -> u16 {
        let b = self.take::<2>(at);
        if self.little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    }
    fn u32(&self, at: usize) -> u32 {
        let b = self.take::<4>(at);
        if self.little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    }
    fn u64(&self, at: usize) -> u64 {
        let b = self.take::<8>(at);
        if self.little {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_library;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("htpkv-elf-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The test binary itself is a position-independent ELF: whole it passes, truncated inside a
    /// segment it is refused, and a FIFO, a directory and a text are refused at once.
    #[test]
    fn truncated_fifo_and_non_elf_files_are_refused_before_dlopen() {
        let exe = std::env::current_exe().unwrap();
        check_library(&exe).unwrap();
        let dir = scratch("check");
        let bytes = std::fs::read(&exe).unwrap();
        let cut = dir.join("cut.so");
        // Cut inside the first loaded segment, and inside the program headers (a cut past every
        // segment, in the debug sections, is harmless to the loader and passes).
        for keep in [4096, 100] {
            std::fs::write(&cut, &bytes[..keep]).unwrap();
            let reason = check_library(&cut).unwrap_err();
            assert!(reason.contains("past its end"), "{keep}: {reason}");
        }
        std::fs::write(&cut, &bytes[..40]).unwrap();
        assert!(check_library(&cut).unwrap_err().contains("not an ELF"));
        let fifo = dir.join("fifo.so");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(check_library(&fifo).unwrap_err().contains("FIFO"));
        assert!(check_library(&dir).unwrap_err().contains("directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
