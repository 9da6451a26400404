//! Qualcomm Genie (`libGenie.so`, Genie 1.21 as shipped in the `onnxruntime-qnn` 2.7.0 wheel with
//! QNN 2.51) loaded at run time with `libloading`: dialog configurations validated by Genie's own
//! JSON schema, dialogs created from them, text and token queries with a Rust callback per piece
//! of output, reset, free.
//!
//! The declarations are written here from public facts of the C ABI (function names, argument
//! order, status and sentence-code values); no Qualcomm header is used or copied:
//!
//! | function | arguments | returns |
//! |---|---|---|
//! | `GenieDialogConfig_createFromJson` | `const char* json, handle* out` | status |
//! | `GenieDialogConfig_free` | `handle` | status |
//! | `GenieDialog_create` | `config handle, handle* out` | status |
//! | `GenieDialog_query` | `dialog, const char* query, sentence code, text callback, const void* user` | status |
//! | `GenieDialog_tokenQuery` | `dialog, const uint32_t* tokens, uint32_t n, sentence code, token callback, const void* user` | status |
//! | `GenieDialog_reset` / `GenieDialog_free` | `dialog` | status |
//! | `Genie_getApi{Major,Minor,Patch}Version` | — | `uint32_t` |
//!
//! The text callback is `void(const char* response, sentence code, const void* user)`, the token
//! callback `void(const uint32_t* tokens, uint32_t n, sentence code, const void* user)`. Status
//! codes are `int32_t`: 0 success, positive warnings (4: the context size was exceeded), negative
//! errors (−8: the configuration failed Genie's JSON schema; Genie prints the schema's message to
//! standard error).
//!
//! Genie loads the QNN backend named in the configuration by its bare file name
//! (`libQnnHtp.so`): the dynamic loader finds it beside `libGenie.so` through `libGenie.so`'s own
//! RPATH (`$ORIGIN`), or on `LD_LIBRARY_PATH`. Genie can crash the process (a SIGSEGV in
//! `GenieDialog_create` on a context binary that is not an LLM was seen): run it in a child process
//! where that matters.

use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// A Genie status code (`Genie_Status_t`, an `int32_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub i32);

impl Status {
    pub const SUCCESS: Status = Status(0);
    pub const WARNING_ABORTED: Status = Status(1);
    pub const WARNING_CONTEXT_EXCEEDED: Status = Status(4);
    pub const ERROR_JSON_SCHEMA: Status = Status(-8);

    /// The code's name in Genie's documentation (without the `GENIE_STATUS_` prefix).
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "SUCCESS",
            1 => "WARNING_ABORTED",
            2 => "WARNING_BOUND_HANDLE",
            3 => "WARNING_PAUSED",
            4 => "WARNING_CONTEXT_EXCEEDED",
            -1 => "ERROR_GENERAL",
            -2 => "ERROR_INVALID_ARGUMENT",
            -3 => "ERROR_MEM_ALLOC",
            -4 => "ERROR_INVALID_CONFIG",
            -5 => "ERROR_INVALID_HANDLE",
            -6 => "ERROR_QUERY_FAILED",
            -7 => "ERROR_JSON_FORMAT",
            -8 => "ERROR_JSON_SCHEMA",
            -9 => "ERROR_JSON_VALUE",
            -10 => "ERROR_GENERATE_FAILED",
            -11 => "ERROR_GET_HANDLE_FAILED",
            -12 => "ERROR_APPLY_CONFIG_FAILED",
            -13 => "ERROR_SET_PARAMS_FAILED",
            -14 => "ERROR_BOUND_HANDLE",
            _ => "UNKNOWN",
        }
    }

    /// Negative codes are errors; zero and positive ones (warnings) are not.
    pub fn is_error(self) -> bool {
        self.0 < 0
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.0, self.name())
    }
}

/// Where a piece of output sits in a response (`GenieDialog_SentenceCode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentenceCode {
    /// The whole response at once (also what a query asks for).
    Complete,
    Begin,
    Continue,
    End,
    Abort,
    Rewind,
    Resume,
    /// A value this crate does not know.
    Other(i32),
}

impl SentenceCode {
    fn from_raw(v: i32) -> SentenceCode {
        match v {
            0 => SentenceCode::Complete,
            1 => SentenceCode::Begin,
            2 => SentenceCode::Continue,
            3 => SentenceCode::End,
            4 => SentenceCode::Abort,
            5 => SentenceCode::Rewind,
            6 => SentenceCode::Resume,
            other => SentenceCode::Other(other),
        }
    }

    fn raw(self) -> i32 {
        match self {
            SentenceCode::Complete => 0,
            SentenceCode::Begin => 1,
            SentenceCode::Continue => 2,
            SentenceCode::End => 3,
            SentenceCode::Abort => 4,
            SentenceCode::Rewind => 5,
            SentenceCode::Resume => 6,
            SentenceCode::Other(v) => v,
        }
    }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum GenieError {
    #[error("cannot load {}: {reason}", path.display())]
    Load { path: PathBuf, reason: String },
    #[error("{} has no `{symbol}`: {reason}", path.display())]
    Symbol {
        path: PathBuf,
        symbol: &'static str,
        reason: String,
    },
    /// A Genie call returned an error status.
    #[error("{call} failed with status {status}")]
    Status { call: &'static str, status: Status },
    /// Genie reported success but returned no handle.
    #[error("{call} returned no handle")]
    NullHandle { call: &'static str },
    #[error("the {what} contains a NUL byte")]
    Nul { what: &'static str },
    #[error("GenieDialog_tokenQuery takes at most u32::MAX tokens, got {0}")]
    TooManyTokens(usize),
    /// The Rust callback panicked (the panic stops at the FFI edge; the query result is dropped).
    #[error("the {call} callback panicked")]
    CallbackPanicked { call: &'static str },
}

/// Genie's opaque handles (pointers to its own objects), passed by value.
type Handle = *mut c_void;
type TextCallback = unsafe extern "C" fn(*const c_char, i32, *const c_void);
type TokenCallback = unsafe extern "C" fn(*const u32, u32, i32, *const c_void);

struct Fns {
    config_create: unsafe extern "C" fn(*const c_char, *mut Handle) -> i32,
    config_free: unsafe extern "C" fn(Handle) -> i32,
    dialog_create: unsafe extern "C" fn(Handle, *mut Handle) -> i32,
    dialog_query:
        unsafe extern "C" fn(Handle, *const c_char, i32, TextCallback, *const c_void) -> i32,
    dialog_token_query: Option<
        unsafe extern "C" fn(Handle, *const u32, u32, i32, TokenCallback, *const c_void) -> i32,
    >,
    dialog_reset: unsafe extern "C" fn(Handle) -> i32,
    dialog_free: unsafe extern "C" fn(Handle) -> i32,
    version: Option<[unsafe extern "C" fn() -> u32; 3]>,
}

/// A loaded `libGenie.so`.
pub struct Genie {
    fns: Fns,
    path: PathBuf,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

impl fmt::Debug for Genie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Genie").field("path", &self.path).finish()
    }
}

fn status(call: &'static str, raw: i32) -> Result<Status, GenieError> {
    let s = Status(raw);
    if s.is_error() {
        Err(GenieError::Status { call, status: s })
    } else {
        Ok(s)
    }
}

impl Genie {
    /// Loads `libGenie.so` from `path` and resolves the dialog functions.
    pub fn load(path: &Path) -> Result<Genie, GenieError> {
        qnn_ffi::elf::check_library(path).map_err(|reason| GenieError::Load {
            path: path.to_path_buf(),
            reason,
        })?;
        // SAFETY: loading runs the library's initializers; libGenie.so is an ordinary shared
        // library whose initializers have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| GenieError::Load {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let sym_err = |symbol: &'static str, e: libloading::Error| GenieError::Symbol {
            path: path.to_path_buf(),
            symbol,
            reason: e.to_string(),
        };
        macro_rules! get {
            ($name:literal) => {
                // SAFETY: the symbol is a function of the Genie C API whose signature is the type
                // of the field it is stored in (see the crate docs); the pointer is only used while
                // `lib` is alive (it is a field of the same `Genie`, dropped last).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| sym_err($name, e))?
            };
        }
        macro_rules! get_opt {
            ($name:literal) => {
                // SAFETY: as for `get!`.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|s| *s)
            };
        }
        let version = match (
            get_opt!("Genie_getApiMajorVersion"),
            get_opt!("Genie_getApiMinorVersion"),
            get_opt!("Genie_getApiPatchVersion"),
        ) {
            (Some(a), Some(b), Some(c)) => Some([a, b, c]),
            _ => None,
        };
        let fns = Fns {
            config_create: get!("GenieDialogConfig_createFromJson"),
            config_free: get!("GenieDialogConfig_free"),
            dialog_create: get!("GenieDialog_create"),
            dialog_query: get!("GenieDialog_query"),
            dialog_token_query: get_opt!("GenieDialog_tokenQuery"),
            dialog_reset: get!("GenieDialog_reset"),
            dialog_free: get!("GenieDialog_free"),
            version,
        };
        Ok(Genie {
            fns,
            path: path.to_path_buf(),
            _lib: lib,
        })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Genie's API version (major, minor, patch), when the library reports it.
    pub fn api_version(&self) -> Option<(u32, u32, u32)> {
        let [a, b, c] = self.fns.version?;
        // SAFETY: the version getters take no arguments and return a plain integer.
        Some(unsafe { (a(), b(), c()) })
    }

    /// Whether the library has `GenieDialog_tokenQuery`.
    pub fn has_token_query(&self) -> bool {
        self.fns.dialog_token_query.is_some()
    }

    /// `GenieDialogConfig_createFromJson`: Genie parses `json` and validates it against its schema
    /// (on failure Genie prints the schema's message to standard error; the status is −8).
    pub fn dialog_config(&self, json: &str) -> Result<DialogConfig<'_>, GenieError> {
        let text = CString::new(json).map_err(|_| GenieError::Nul {
            what: "configuration",
        })?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `text` is a NUL-terminated string alive for the call; `handle` is a valid place
        // for the out-parameter.
        let raw = unsafe { (self.fns.config_create)(text.as_ptr(), &mut handle) };
        status("GenieDialogConfig_createFromJson", raw)?;
        if handle.is_null() {
            return Err(GenieError::NullHandle {
                call: "GenieDialogConfig_createFromJson",
            });
        }
        Ok(DialogConfig {
            genie: self,
            handle,
        })
    }
}

/// A validated dialog configuration (`GenieDialogConfig_Handle_t`), freed on drop.
pub struct DialogConfig<'g> {
    genie: &'g Genie,
    handle: Handle,
}

impl fmt::Debug for DialogConfig<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DialogConfig").finish_non_exhaustive()
    }
}

impl Drop for DialogConfig<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from createFromJson and is freed once, after every dialog made
        // from it (they borrow this value).
        unsafe { (self.genie.fns.config_free)(self.handle) };
    }
}

impl DialogConfig<'_> {
    /// `GenieDialog_create`: loads the backend and the context binaries the configuration names.
    pub fn create_dialog(&self) -> Result<Dialog<'_>, GenieError> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: the configuration handle is alive; `handle` is a valid out-parameter.
        let raw = unsafe { (self.genie.fns.dialog_create)(self.handle, &mut handle) };
        status("GenieDialog_create", raw)?;
        if handle.is_null() {
            return Err(GenieError::NullHandle {
                call: "GenieDialog_create",
            });
        }
        Ok(Dialog {
            fns: &self.genie.fns,
            handle,
        })
    }
}

/// A Genie dialog (`GenieDialog_Handle_t`), freed on drop. Not `Send`: Genie's callbacks run on
/// the calling thread.
pub struct Dialog<'c> {
    fns: &'c Fns,
    handle: Handle,
}

impl fmt::Debug for Dialog<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialog").finish_non_exhaustive()
    }
}

impl Drop for Dialog<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from GenieDialog_create and is freed once.
        unsafe { (self.fns.dialog_free)(self.handle) };
    }
}

struct TextState<'a> {
    f: &'a mut dyn FnMut(&str, SentenceCode),
    panicked: bool,
}

struct TokenState<'a> {
    f: &'a mut dyn FnMut(&[u32], SentenceCode),
    panicked: bool,
}

unsafe extern "C" fn text_trampoline(response: *const c_char, code: i32, user: *const c_void) {
    // SAFETY: `user` is the `TextState` that `Dialog::query` passed, alive and not otherwise
    // borrowed during the query (Genie calls back on the querying thread, one call at a time).
    let state = unsafe { &mut *(user as *mut TextState<'_>) };
    if state.panicked {
        return;
    }
    let text = if response.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: Genie passes a NUL-terminated string valid for the duration of the callback.
        unsafe { CStr::from_ptr(response) }.to_string_lossy()
    };
    let code = SentenceCode::from_raw(code);
    if catch_unwind(AssertUnwindSafe(|| (state.f)(&text, code))).is_err() {
        state.panicked = true;
    }
}

unsafe extern "C" fn token_trampoline(tokens: *const u32, n: u32, code: i32, user: *const c_void) {
    // SAFETY: as in `text_trampoline`, for the `TokenState` of `Dialog::token_query`.
    let state = unsafe { &mut *(user as *mut TokenState<'_>) };
    if state.panicked {
        return;
    }
    let ids: &[u32] = if tokens.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: Genie passes `n` token ids at `tokens`, valid for the duration of the callback.
        unsafe { std::slice::from_raw_parts(tokens, n as usize) }
    };
    let code = SentenceCode::from_raw(code);
    if catch_unwind(AssertUnwindSafe(|| (state.f)(ids, code))).is_err() {
        state.panicked = true;
    }
}

impl Dialog<'_> {
    /// `GenieDialog_query` with a complete prompt: `on_text` receives each piece of the response
    /// as Genie decodes it. Returns the status (success, or a warning such as
    /// [`Status::WARNING_CONTEXT_EXCEEDED`]).
    pub fn query(
        &mut self,
        prompt: &str,
        on_text: &mut dyn FnMut(&str, SentenceCode),
    ) -> Result<Status, GenieError> {
        let text = CString::new(prompt).map_err(|_| GenieError::Nul { what: "prompt" })?;
        let mut state = TextState {
            f: on_text,
            panicked: false,
        };
        // SAFETY: the dialog handle is alive; `text` is NUL-terminated and alive for the call;
        // the trampoline matches Genie's text-callback signature and `state` outlives the call.
        let raw = unsafe {
            (self.fns.dialog_query)(
                self.handle,
                text.as_ptr(),
                SentenceCode::Complete.raw(),
                text_trampoline,
                &mut state as *mut TextState<'_> as *const c_void,
            )
        };
        if state.panicked {
            return Err(GenieError::CallbackPanicked {
                call: "GenieDialog_query",
            });
        }
        status("GenieDialog_query", raw)
    }

    /// `GenieDialog_tokenQuery`: the prompt as token ids; `on_tokens` receives the generated ids.
    /// `Ok(None)` when the library lacks the function.
    pub fn token_query(
        &mut self,
        tokens: &[u32],
        on_tokens: &mut dyn FnMut(&[u32], SentenceCode),
    ) -> Result<Option<Status>, GenieError> {
        let Some(f) = self.fns.dialog_token_query else {
            return Ok(None);
        };
        let n = u32::try_from(tokens.len()).map_err(|_| GenieError::TooManyTokens(tokens.len()))?;
        let mut state = TokenState {
            f: on_tokens,
            panicked: false,
        };
        // SAFETY: the dialog handle is alive; `tokens` holds `n` ids alive for the call; the
        // trampoline matches Genie's token-callback signature and `state` outlives the call.
        let raw = unsafe {
            f(
                self.handle,
                tokens.as_ptr(),
                n,
                SentenceCode::Complete.raw(),
                token_trampoline,
                &mut state as *mut TokenState<'_> as *const c_void,
            )
        };
        if state.panicked {
            return Err(GenieError::CallbackPanicked {
                call: "GenieDialog_tokenQuery",
            });
        }
        status("GenieDialog_tokenQuery", raw).map(Some)
    }

    /// `GenieDialog_reset`: forgets the conversation (the KV cache).
    pub fn reset(&mut self) -> Result<(), GenieError> {
        // SAFETY: the dialog handle is alive.
        let raw = unsafe { (self.fns.dialog_reset)(self.handle) };
        status("GenieDialog_reset", raw).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named_and_only_negative_ones_are_errors() {
        assert_eq!(Status(-8).to_string(), "-8 (ERROR_JSON_SCHEMA)");
        assert!(Status::ERROR_JSON_SCHEMA.is_error());
        assert!(!Status::WARNING_CONTEXT_EXCEEDED.is_error());
        assert_eq!(Status(99).name(), "UNKNOWN");
    }

    #[test]
    fn sentence_codes_round_trip() {
        for v in -1..8 {
            assert_eq!(SentenceCode::from_raw(v).raw(), v);
        }
    }

    #[test]
    fn a_missing_library_is_a_load_error_naming_the_path() {
        let e = Genie::load(Path::new("/nonexistent/libGenie.so")).unwrap_err();
        assert!(matches!(e, GenieError::Load { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/libGenie.so"), "{e}");
    }
}
