//! Diagnostics: Android's log (`adb logcat -s htpkv`) on Android; stderr on other hosts when the
//! environment variable `HTPKV_JNI_LOG` is set.

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Progress (model discovery, compilation, loading).
    Info,
    /// Something went wrong (a caught panic).
    Error,
}

/// Writes one line of diagnostics.
pub fn line(level: Level, message: &str) {
    imp::write(level, message);
}

#[cfg(target_os = "android")]
mod imp {
    use super::Level;
    use std::ffi::{CString, c_char, c_int};

    // Android's liblog (always present on a device).
    #[link(name = "log")]
    unsafe extern "C" {
        fn __android_log_write(prio: c_int, tag: *const c_char, text: *const c_char) -> c_int;
    }

    const ANDROID_LOG_INFO: c_int = 4;
    const ANDROID_LOG_ERROR: c_int = 6;

    pub(super) fn write(level: Level, message: &str) {
        let prio = match level {
            Level::Info => ANDROID_LOG_INFO,
            Level::Error => ANDROID_LOG_ERROR,
        };
        let Ok(text) = CString::new(message.replace('\0', " ")) else {
            return;
        };
        // SAFETY: both pointers are NUL-terminated C strings that outlive the call; liblog copies them.
        unsafe {
            __android_log_write(prio, c"htpkv".as_ptr(), text.as_ptr());
        }
    }
}

#[cfg(not(target_os = "android"))]
mod imp {
    use super::Level;

    pub(super) fn write(level: Level, message: &str) {
        if std::env::var_os("HTPKV_JNI_LOG").is_some() {
            let tag = match level {
                Level::Info => "info",
                Level::Error => "error",
            };
            eprintln!("htpkv-jni {tag}: {message}");
        }
    }
}
