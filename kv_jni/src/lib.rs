//! JNI bindings of htpkv: the native half of the `org.htpkv` Java API (`HtpkvSession`).
//!
//! Built as `libkv_jni.so`, loaded by the Java class `org.htpkv.HtpkvSession`, whose `private static
//! native` methods are the `Java_org_htpkv_HtpkvSession_*` functions below. The Java sources live in
//! `kv_jni/java/`, the JVM test program in `kv_jni/java-test/`, and `kv_jni/run-jvm-tests.sh` builds
//! and runs them.
//!
//! # Contract of every entry point
//! - The body runs inside `EnvUnowned::with_env`, which wraps it in `catch_unwind`: a Rust panic never
//!   unwinds into the JVM; it becomes an `org.htpkv.HtpkvException` of kind `panic`.
//! - A Rust error becomes a thrown `org.htpkv.HtpkvException(kind, message)` and the method returns a
//!   default value (0, false, null) that Java never sees, since the exception is pending.
//! - Sessions are `long` handles into a [`registry::Registry`], never pointers: a handle used after
//!   `close()`, 0 or a forged number gives kind `closed`; two threads using one session at once give
//!   kind `busy` to the one that came second (nobody waits, nothing races).
//! - A Java exception thrown by the token callback stops generation and propagates unchanged.
//!
//! Error kinds: those of `htpkv::engine::EngineError::kind` (`model_not_found`, `bad_model`,
//! `compile`, `bad_option`, `context_full`, `kv`, `backend`, `io`, `qnn`, `budget`) plus `closed`,
//! `busy`, `poisoned`, `panic` and `jni` (see [`error`]).

mod cancel;
pub mod error;
pub mod log;
pub mod options;
pub mod registry;

use crate::cancel::Cancels;
use crate::error::{GlueError, KIND_JNI, KIND_PANIC};
use crate::options::{
    OpenArgs, SamplerArgs, generate_options, length, stop_name, to_jint, to_jlong,
};
use crate::registry::{Registry, lock};
use htpkv::engine::{Engine, EngineOptions, Model, budget_json};
use jni::errors::ErrorPolicy;
use jni::objects::{JClass, JIntArray, JObject, JObjectArray, JString, JThrowable, JValue};
use jni::refs::Reference as _;
use jni::sys::{jboolean, jint, jlong};
use jni::{Env, EnvUnowned, jni_sig, jni_str};
use std::sync::Arc;

/// Every open session, by handle.
static SESSIONS: Registry<Engine> = Registry::new();

/// Every open model (`org.htpkv.HtpkvModel`), by handle. A session holds its model, so closing a model
/// does not end its sessions.
static MODELS: Registry<Arc<Model>> = Registry::new();
/// The cancel handles of the generations running (or waiting for their session), by session.
static CANCELS: Cancels = Cancels::new();

/// Compile-time check: an engine may move to whichever JVM thread calls.
#[allow(dead_code)]
fn assert_engine_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Engine>();
}

/// The error policy of every entry point: Rust errors and panics become a thrown
/// `org.htpkv.HtpkvException(kind, message)`; a Java exception that is already pending is left to
/// propagate; the native method returns `T::default()`.
#[derive(Debug)]
struct ThrowHtpkvException;

impl<T: Default> ErrorPolicy<T, GlueError> for ThrowHtpkvException {
    type Captures<'unowned_env_local: 'native_method, 'native_method> = ();

    fn on_error<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _captures: &mut (),
        err: GlueError,
    ) -> jni::errors::Result<T> {
        if env.exception_check() {
            // A Java exception (from the callback or a JNI call) is already on its way.
            return Ok(T::default());
        }
        let (kind, message) = match err {
            GlueError::Htpkv { kind, message } => (kind, message),
            GlueError::JavaPending => (
                KIND_JNI,
                "a Java exception was reported but none is pending".to_string(),
            ),
        };
        throw_htpkv(env, kind, &message);
        Ok(T::default())
    }

    fn on_panic<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _captures: &mut (),
        payload: Box<dyn std::any::Any + Send + 'static>,
    ) -> jni::errors::Result<T> {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic with a non-string payload".to_string()
        };
        log::line(
            log::Level::Error,
            &format!("panic in native code: {message}"),
        );
        if !env.exception_check() {
            throw_htpkv(env, KIND_PANIC, &format!("panic in native code: {message}"));
        }
        Ok(T::default())
    }
}

/// Throws `org.htpkv.HtpkvException(kind, message)`; when that class cannot be made (e.g. stripped
/// by a shrinker), throws a `java.lang.RuntimeException` carrying both instead.
fn throw_htpkv(env: &mut Env<'_>, kind: &str, message: &str) {
    let thrown = (|| -> jni::errors::Result<()> {
        let kind = env.new_string(kind)?;
        let message = env.new_string(message)?;
        let exception = env.new_object(
            jni_str!("org/htpkv/HtpkvException"),
            jni_sig!("(Ljava/lang/String;Ljava/lang/String;)V"),
            &[JValue::Object(&kind), JValue::Object(&message)],
        )?;
        let exception = env.cast_local::<JThrowable<'_>>(exception)?;
        env.throw(&exception)
    })();
    if matches!(thrown, Err(jni::errors::Error::JavaException)) && env.exception_check() {
        // `throw` reports success as "an exception is now pending". Anything else pending here would
        // be a failure to build the exception; replace it with a plain one.
        return;
    }
    env.exception_clear();
    let _ = env.throw(format!("htpkv {kind}: {message}"));
}

/// Runs one entry point's body under the error policy (and `with_env`'s `catch_unwind`).
fn entry<'local, T: Default>(
    env: &mut EnvUnowned<'local>,
    body: impl FnOnce(&mut Env<'local>) -> Result<T, GlueError>,
) -> T {
    env.with_env(body).resolve::<ThrowHtpkvException>()
}

/// A Java string argument; `None` for null.
fn optional_string(env: &Env<'_>, s: &JString<'_>) -> Result<Option<String>, GlueError> {
    if s.is_null() {
        Ok(None)
    } else {
        Ok(Some(s.try_to_string(env)?))
    }
}

/// A Java string argument that must not be null.
fn required_string(env: &Env<'_>, s: &JString<'_>, what: &str) -> Result<String, GlueError> {
    optional_string(env, s)?
        .ok_or_else(|| GlueError::bad_option(format!("{what} must not be null")))
}

/// Calls `callback.onText(piece)` in its own local frame; `Ok(false)` asks to stop.
fn call_token_callback(
    env: &mut Env<'_>,
    callback: &JObject<'_>,
    piece: &str,
) -> Result<bool, GlueError> {
    env.with_local_frame(4, |env| -> Result<bool, GlueError> {
        let text = env.new_string(piece)?;
        let keep_going = env
            .call_method(
                callback,
                jni_str!("onText"),
                jni_sig!("(Ljava/lang/String;)Z"),
                &[JValue::Object(&text)],
            )?
            .z()?;
        Ok(keep_going)
    })
}

/// The open options Java passed (a `SessionOptions`), read field by field and checked.
fn open_options(env: &mut Env<'_>, options: &JObject<'_>) -> Result<EngineOptions, GlueError> {
    open_args(env, options)?.to_engine_options()
}

/// The fields of a `SessionOptions`.
fn open_args(env: &mut Env<'_>, options: &JObject<'_>) -> Result<OpenArgs, GlueError> {
    if options.is_null() {
        return Err(GlueError::bad_option("options must not be null"));
    }
    env.with_local_frame(32, |env| -> Result<OpenArgs, GlueError> {
        let ar = env
            .get_field(options, jni_str!("arVariants"), jni_sig!("[I"))?
            .l()?;
        let ar = env.cast_local::<JIntArray<'_>>(ar)?;
        let mut ar_values = Vec::new();
        if !ar.is_null() {
            ar_values = vec![0; ar.len(env)?];
            ar.get_region(env, 0, &mut ar_values)?;
        }
        let args = OpenArgs {
            model_dir: string_field(env, options, jni_str!("modelDir"))?,
            compiled: string_field(env, options, jni_str!("compiled"))?,
            backend: string_field(env, options, jni_str!("backend"))?,
            backend_lib: string_field(env, options, jni_str!("qnnBackendLib"))?,
            system_lib: string_field(env, options, jni_str!("qnnSystemLib"))?,
            strategy: string_field(env, options, jni_str!("strategy"))?,
            kv_dtype: string_field(env, options, jni_str!("kvDtype"))?,
            weights: string_field(env, options, jni_str!("weights"))?,
            context: env
                .get_field(options, jni_str!("context"), jni_sig!("I"))?
                .i()?,
            ar: ar_values,
            cache_dir: string_field(env, options, jni_str!("cacheDir"))?,
            speculate: string_field(env, options, jni_str!("speculate"))?,
            chat_template: string_field(env, options, jni_str!("chatTemplate"))?,
        };
        Ok(args)
    })
}

/// One `String` field of a `SessionOptions` (`None` when null).
fn string_field(
    env: &mut Env<'_>,
    options: &JObject<'_>,
    name: &jni::strings::JNIStr,
) -> Result<Option<String>, GlueError> {
    let value = env
        .get_field(options, name, jni_sig!("Ljava/lang/String;"))?
        .l()?;
    let value = env.cast_local::<JString<'_>>(value)?;
    optional_string(env, &value)
}

/// The fields of a `SamplerOptions`.
fn sampler_args(env: &mut Env<'_>, s: &JObject<'_>) -> Result<SamplerArgs, GlueError> {
    if s.is_null() {
        return Ok(SamplerArgs::default());
    }
    let mut float =
        |name| -> Result<f32, GlueError> { Ok(env.get_field(s, name, jni_sig!("F"))?.f()?) };
    let (temperature, top_p, min_p) = (
        float(jni_str!("temperature"))?,
        float(jni_str!("topP"))?,
        float(jni_str!("minP"))?,
    );
    let (repeat_penalty, presence_penalty, frequency_penalty) = (
        float(jni_str!("repeatPenalty"))?,
        float(jni_str!("presencePenalty"))?,
        float(jni_str!("frequencyPenalty"))?,
    );
    Ok(SamplerArgs {
        temperature,
        top_p,
        top_k: env.get_field(s, jni_str!("topK"), jni_sig!("I"))?.i()?,
        min_p,
        repeat_penalty,
        presence_penalty,
        frequency_penalty,
        penalty_last_n: env
            .get_field(s, jni_str!("penaltyLastN"), jni_sig!("I"))?
            .i()?,
        seed: env.get_field(s, jni_str!("seed"), jni_sig!("J"))?.j()?,
    })
}

/// A Java `String[]` (null: empty); a null element is refused (kind `bad_option`).
fn string_array(
    env: &mut Env<'_>,
    array: &JObjectArray<'_>,
    what: &str,
) -> Result<Vec<String>, GlueError> {
    if array.is_null() {
        return Ok(Vec::new());
    }
    let len = array.len(env)?;
    if len > htpkv::session::MAX_STOPS {
        return Err(GlueError::bad_option(format!(
            "{what}: {len} strings; at most {} are accepted",
            htpkv::session::MAX_STOPS
        )));
    }
    (0..len)
        .map(|i| {
            env.with_local_frame(4, |env| -> Result<String, GlueError> {
                let item = array.get_element(env, i)?;
                let item = env.cast_local::<JString<'_>>(item)?;
                required_string(env, &item, what)
            })
        })
        .collect()
}

/// `static native void nativeCancel(long handle)`: cancels the generation running on the session,
/// or waiting for it (it stops at its next step boundary, stop reason `cancelled`); nothing when
/// none is. Never waits for the session's lock.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeCancel<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    entry(&mut env, |_env| {
        CANCELS.cancel(handle);
        Ok(())
    })
}

fn log_progress(line: &str) {
    log::line(log::Level::Info, line);
}

/// `static native long nativeOpen(...)`: opens a session (and its own model), returns its handle.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeOpen<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    options: JObject<'local>,
) -> jlong {
    entry(&mut env, |env| {
        let args = open_args(env, &options)?;
        let options = args.to_engine_options()?;
        let mut engine = Engine::open(&options, &mut log_progress)?;
        if let Some(kind) = args.speculation()? {
            engine.speculate(&kind, &options)?;
        }
        Ok(SESSIONS.insert(engine))
    })
}

/// `static native long nativeOpen(...)` of `HtpkvModel`: loads a model that sessions share.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvModel_nativeOpen<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    options: JObject<'local>,
) -> jlong {
    entry(&mut env, |env| {
        let options = open_options(env, &options)?;
        let model = Model::open(&options, &mut log_progress)?;
        Ok(MODELS.insert(Arc::new(model)))
    })
}

/// `static native long nativeNewSession(long model)`: a new session (own KV cache) on a model.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvModel_nativeNewSession<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    model: jlong,
) -> jlong {
    entry(&mut env, |_env| {
        let model = MODELS.with(model, |m| Ok(Arc::clone(m)))?;
        Ok(SESSIONS.insert(Engine::on(model)?))
    })
}

/// `static native long nativeSharedBytes(long model)`: bytes every session of the model shares.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvModel_nativeSharedBytes<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    model: jlong,
) -> jlong {
    entry(&mut env, |_env| {
        MODELS.with(model, |m| {
            Ok(i64::try_from(m.shared_bytes()).unwrap_or(i64::MAX))
        })
    })
}

/// `static native void nativeClose(long model)`: closes a model handle (its sessions stay usable).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvModel_nativeClose<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    model: jlong,
) {
    entry(&mut env, |_env| MODELS.remove(model))
}

/// `static native int nativeLiveModels()`: open model handles (for leak checks in tests).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvModel_nativeLiveModels<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jint {
    entry(&mut env, |_env| Ok(to_jint(MODELS.len())))
}

/// `static native void nativeSave(long handle, String path)`: saves the session atomically.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeSave<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    path: JString<'local>,
) {
    entry(&mut env, |env| {
        let path = required_string(env, &path, "path")?;
        SESSIONS.with(handle, |engine| Ok(engine.save(path.as_ref())?))
    })
}

/// `static native void nativeRestore(long handle, String path)`: restores a saved session (kind
/// `bad_session` or `io` on failure, the session unchanged).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeRestore<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    path: JString<'local>,
) {
    entry(&mut env, |env| {
        let path = required_string(env, &path, "path")?;
        SESSIONS.with(handle, |engine| Ok(engine.restore(path.as_ref())?))
    })
}

/// `static native int nativeAppendTurn(long handle, String role, String text)`: adds a chat turn
/// (see `Engine::append_turn`); returns the cached tokens.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeAppendTurn<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    role: JString<'local>,
    text: JString<'local>,
) -> jint {
    entry(&mut env, |env| {
        let role = required_string(env, &role, "role")?;
        let text = required_string(env, &text, "text")?;
        SESSIONS.with(handle, |engine| {
            Ok(to_jint(engine.append_turn(&role, &text)?))
        })
    })
}

/// `static native void nativeSetOverflow(long handle, String policy, int keep, int chunk)`: the
/// policy when the context fills (`stop`, `slide`, `slide-rerotate`, `slide-keep-positions`,
/// `restart`).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeSetOverflow<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    policy: JString<'local>,
    keep: jint,
    chunk: jint,
) {
    entry(&mut env, |env| {
        let policy = required_string(env, &policy, "policy")?;
        let (keep, chunk) = (length(keep, "keep")?, length(chunk, "chunk")?);
        SESSIONS.with(handle, |engine| {
            let overflow = htpkv::session::Overflow::parse(&policy, keep, chunk)
                .map_err(htpkv::engine::EngineError::from)?;
            Ok(engine.set_overflow(overflow)?)
        })
    })
}

/// `static native int nativeSlides(long handle)`: slides (or restarts) so far.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeSlides<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jint {
    entry(&mut env, |_env| {
        SESSIONS.with(handle, |engine| {
            Ok(to_jint(engine.session().slides().len()))
        })
    })
}

/// `static native void nativeClose(long handle)`: closes a session (kind `closed` when it is not
/// live). A call still running on another thread finishes first; the session is freed after it.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeClose<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    entry(&mut env, |_env| SESSIONS.remove(handle))
}

/// `static native Generation nativeGenerate(...)`: generates text after `prompt` with `sampler`'s
/// options (a `SamplerOptions`, never null: Java passes the greedy defaults) and `stop` strings
/// (may be null), streaming pieces to `callback` (may be null). The callback returning false stops
/// generation (stop reason `callback`); a Java exception thrown by it stops generation and
/// propagates; `nativeCancel` from another thread stops it (stop reason `cancelled`).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeGenerate<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    prompt: JString<'local>,
    max_tokens: jint,
    sampler: JObject<'local>,
    stop: JObjectArray<'local>,
    callback: JObject<'local>,
) -> JObject<'local> {
    entry(&mut env, |env| {
        let prompt = required_string(env, &prompt, "prompt")?;
        let sampler = sampler_args(env, &sampler)?;
        let stop = string_array(env, &stop, "stop")?;
        let mut options = generate_options(max_tokens, &sampler, stop)?;
        let _running = CANCELS.register(handle, &mut options);
        let session = SESSIONS.get(handle)?;
        let mut engine = lock(&session)?;
        let mut callback_error: Option<GlueError> = None;
        let result = {
            let mut on_text = |piece: &str| -> bool {
                if callback_error.is_some() {
                    return false;
                }
                if callback.is_null() {
                    return true;
                }
                match call_token_callback(env, &callback, piece) {
                    Ok(keep_going) => keep_going,
                    Err(err) => {
                        callback_error = Some(err);
                        false
                    }
                }
            };
            engine.generate(&prompt, &options, &mut on_text)
        };
        drop(engine);
        if let Some(err) = callback_error {
            return Err(err);
        }
        let generation = result?;
        let text = env.new_string(&generation.text)?;
        let stop = env.new_string(stop_name(generation.stop))?;
        Ok(env.new_object(
            jni_str!("org/htpkv/Generation"),
            jni_sig!("(Ljava/lang/String;IILjava/lang/String;)V"),
            &[
                JValue::Object(&text),
                JValue::Int(to_jint(generation.prompt_tokens.len())),
                JValue::Int(to_jint(generation.tokens.len())),
                JValue::Object(&stop),
            ],
        )?)
    })
}

/// `static native int nativePrefill(long handle, String text)`: runs `text` into the cache; returns
/// the number of cached tokens.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativePrefill<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    text: JString<'local>,
) -> jint {
    entry(&mut env, |env| {
        let text = required_string(env, &text, "text")?;
        SESSIONS.with(handle, |engine| Ok(to_jint(engine.prefill(&text)?)))
    })
}

/// `static native void nativeReset(long handle)`: empties the cache.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeReset<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    entry(&mut env, |_env| {
        SESSIONS.with(handle, |engine| {
            engine.reset();
            Ok(())
        })
    })
}

/// `static native void nativeRollback(long handle, int length)`: truncates the cache to `length`
/// tokens.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeRollback<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    len: jint,
) {
    entry(&mut env, |_env| {
        let len = length(len, "rollback length")?;
        SESSIONS.with(handle, |engine| Ok(engine.rollback(len)?))
    })
}

/// `static native int nativeLength(long handle)`: tokens in the cache.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeLength<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jint {
    entry(&mut env, |_env| {
        SESSIONS.with(handle, |engine| Ok(to_jint(engine.len())))
    })
}

/// `static native int nativeCapacity(long handle)`: tokens the cache can hold.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeCapacity<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jint {
    entry(&mut env, |_env| {
        SESSIONS.with(handle, |engine| Ok(to_jint(engine.capacity())))
    })
}

/// `static native Stats nativeStats(long handle)`: timings and KV counters.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeStats<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> JObject<'local> {
    entry(&mut env, |env| {
        let (s, spec) = SESSIONS.with(handle, |engine| {
            let spec = engine.speculation().map(|x| x.stats().clone());
            Ok((engine.stats(), spec.unwrap_or_default()))
        })?;
        let kv = &s.kv;
        Ok(env.new_object(
            jni_str!("org/htpkv/Stats"),
            jni_sig!("(JDJDJJJJJJJJJJJJ)V"),
            &[
                JValue::Long(to_jlong(s.prefill_tokens)),
                JValue::Double(s.prefill_seconds),
                JValue::Long(to_jlong(s.decode_tokens)),
                JValue::Double(s.decode_seconds),
                JValue::Long(to_jlong(kv.steps)),
                JValue::Long(to_jlong(kv.tokens_committed)),
                JValue::Long(to_jlong(kv.bytes_copied)),
                JValue::Long(to_jlong(kv.rebases)),
                JValue::Long(to_jlong(kv.handles)),
                JValue::Long(to_jlong(kv.max_window_offsets_per_buffer)),
                JValue::Long(to_jlong(kv.worst_step_bytes_copied)),
                JValue::Long(to_jlong(kv.peak_bytes_in_use)),
                JValue::Long(to_jlong(kv.region_bytes)),
                JValue::Long(to_jlong(spec.calls)),
                JValue::Long(to_jlong(spec.tokens)),
                JValue::Long(to_jlong(spec.accepted)),
            ],
        )?)
    })
}

/// `static native String nativeBudget(String configYaml)`: the KV budget of a config, as JSON.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeBudget<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    config_yaml: JString<'local>,
) -> JObject<'local> {
    entry(&mut env, |env| {
        let yaml = required_string(env, &config_yaml, "configYaml")?;
        let json = budget_json(&yaml)?;
        Ok(env.new_string(json)?.into())
    })
}

/// `static native int nativeLiveSessions()`: number of open sessions (for leak checks in tests).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativeLiveSessions<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jint {
    entry(&mut env, |_env| Ok(to_jint(SESSIONS.len())))
}

/// `static native boolean nativePanicForTest()`: panics, so tests can check that a panic becomes an
/// `HtpkvException` of kind `panic` instead of aborting the JVM.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_htpkv_HtpkvSession_nativePanicForTest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jboolean {
    entry(&mut env, |_env| -> Result<jboolean, GlueError> {
        panic!("deliberate panic (nativePanicForTest)")
    })
}
