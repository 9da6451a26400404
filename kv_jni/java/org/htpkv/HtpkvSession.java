package org.htpkv;

import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A model loaded on a backend with its KV cache: the Java face of htpkv's engine.
 *
 * <pre>{@code
 * try (HtpkvSession s = HtpkvSession.open(SessionOptions.builder().modelDir(dir).build())) {
 *     Generation g = s.generate("Once upon a time", 64, SamplerOptions.greedy(), piece -> {
 *         System.out.print(piece);
 *         return true; // false stops generation
 *     });
 * }
 * }</pre>
 *
 * <p><b>Threads.</b> A session serves one call at a time. A call made while another thread (or the
 * token callback) is inside a call on the same session fails at once with an
 * {@link HtpkvException} of kind {@code busy}; it never blocks and never corrupts the session.
 * Different sessions are independent.
 *
 * <p><b>Closing.</b> {@link #close()} frees the native session; it is idempotent. Any call after it
 * fails with kind {@code closed}. Closing while another thread is generating is allowed: that
 * generation finishes and the native memory is freed when it returns.
 *
 * <p><b>Native library.</b> Loaded on first use: from the absolute path in the system property
 * {@code htpkv.jni.library} when set, otherwise with {@code System.loadLibrary("kv_jni")} (on
 * Android, {@code libkv_jni.so} from the app's {@code jniLibs}).
 */
public final class HtpkvSession implements AutoCloseable {
    static {
        String path = System.getProperty("htpkv.jni.library");
        if (path != null && !path.isEmpty()) {
            System.load(path);
        } else {
            System.loadLibrary("kv_jni");
        }
    }

    /** The native handle; 0 once closed. */
    private final AtomicLong handle;

    HtpkvSession(long handle) {
        this.handle = new AtomicLong(handle);
    }

    /**
     * Opens a session: finds the model, compiles and caches it when needed, loads it on the chosen
     * backend and allocates the KV cache. Can take a while on first use of a model.
     *
     * @throws HtpkvException e.g. kind {@code model_not_found}, {@code bad_option}, {@code bad_model},
     *     {@code compile}, {@code qnn}, {@code io}
     */
    public static HtpkvSession open(SessionOptions options) {
        // The native side refuses null options (kind bad_option), with every other option check.
        return new HtpkvSession(nativeOpen(options));
    }

    /**
     * Generates text after {@code prompt}. When the cache is empty the prompt starts a new text (with
     * BOS); otherwise it continues the cached text.
     *
     * @param maxTokens most tokens to generate (>= 0)
     * @param sampler how tokens are chosen (null: greedy)
     * @param callback receives text pieces as they stream (may be null); returning false stops
     * @throws HtpkvException e.g. kind {@code closed}, {@code busy}, {@code bad_option},
     *     {@code context_full}; an exception thrown by {@code callback} propagates unchanged
     */
    public Generation generate(String prompt, int maxTokens, SamplerOptions sampler, TokenCallback callback) {
        return generate(prompt, maxTokens, sampler, null, callback);
    }

    /**
     * {@link #generate(String, int, SamplerOptions, TokenCallback)} that also stops when the text
     * contains one of {@code stop} (at most 16 strings of 1 to 1024 bytes; matched across tokens and
     * never part of the text or of a streamed piece; stop reason {@code stop_string}).
     */
    public Generation generate(
            String prompt, int maxTokens, SamplerOptions sampler, List<String> stop, TokenCallback callback) {
        SamplerOptions s = sampler == null ? SamplerOptions.greedy() : sampler;
        String[] stops = stop == null ? null : stop.toArray(new String[0]);
        return nativeGenerate(live(), prompt, maxTokens, s, stops, callback);
    }

    /**
     * Cancels the generation running on this session (or waiting for it), from any thread: it stops
     * at its next step boundary with stop reason {@code cancelled}, the cache holding exactly the
     * tokens it committed, so the session can go on or be saved. Does nothing when no generation
     * runs; never blocks.
     */
    public void cancel() {
        long h = handle.get();
        if (h != 0) {
            nativeCancel(h);
        }
    }

    /** Greedy generation without streaming. */
    public Generation generate(String prompt, int maxTokens) {
        return generate(prompt, maxTokens, null, null);
    }

    /**
     * Runs {@code text} through the model into the cache without generating (e.g. a system prompt).
     *
     * @return the number of tokens now in the cache
     */
    public int prefill(String text) {
        return nativePrefill(live(), text);
    }

    /** Empties the cache. */
    public void reset() {
        nativeReset(live());
    }

    /**
     * Truncates the cache to its first {@code length} tokens.
     *
     * @throws HtpkvException kind {@code kv} (or {@code bad_option}) when {@code length} is more than
     *     the cache holds or negative
     */
    public void rollback(int length) {
        nativeRollback(live(), length);
    }

    /** Tokens in the cache. */
    public int length() {
        return nativeLength(live());
    }

    /** Tokens the cache can hold (the context length). */
    public int capacity() {
        return nativeCapacity(live());
    }

    /** Timings and KV counters since the session opened. */
    public Stats stats() {
        return nativeStats(live());
    }

    /**
     * The KV cache memory budget of a model config (YAML, as in the project's {@code configs/}) for
     * each update strategy, as JSON text. Needs no session.
     *
     * @throws HtpkvException kind {@code budget} for a config that cannot be read or budgeted,
     *     {@code bad_option} for null
     */
    public static String budget(String configYaml) {
        return nativeBudget(configYaml);
    }

    /** True once {@link #close()} was called. */
    public boolean isClosed() {
        return handle.get() == 0;
    }

    /** Frees the native session. Idempotent; calls after it fail with kind {@code closed}. */
    @Override
    public void close() {
        long h = handle.getAndSet(0);
        if (h != 0) {
            nativeClose(h);
        }
    }

    private long live() {
        long h = handle.get();
        if (h == 0) {
            throw new HtpkvException("closed", "session is closed");
        }
        return h;
    }

    /**
     * Saves the session (tokens, K/V rows, positions, last logits) to {@code path}, atomically.
     *
     * @throws HtpkvException kind {@code io} when the file cannot be written
     */
    public void save(String path) {
        nativeSave(live(), path);
    }

    /**
     * Replaces the session's contents with a file written by {@link #save} for the same model (any
     * strategy); later turns and generations continue after its text. On failure the session is
     * unchanged.
     *
     * @throws HtpkvException kind {@code bad_session} (not a session, corrupted, another model) or
     *     {@code io}
     */
    public void restore(String path) {
        nativeRestore(live(), path);
    }

    /**
     * Adds a chat turn ({@code system}, {@code user}, {@code assistant}) and prefills only what it adds
     * to the conversation: rendered with the model's chat template when it has one, else as the plain
     * {@code "<role>: <text>\n"} lines with {@code "assistant: "} after a user turn.
     * {@code generate("", n)} then answers, and the answer is recorded as the assistant's turn.
     *
     * @return tokens cached
     */
    public int appendTurn(String role, String text) {
        return nativeAppendTurn(live(), role, text);
    }

    /**
     * Sets what happens when the context is full: {@code stop} (the default), {@code slide} (keep the
     * first {@code keep} tokens, drop at least {@code chunk} of the oldest others, re-rotate the kept
     * keys), {@code slide-rerotate}, {@code slide-keep-positions} or {@code restart}.
     *
     * @throws HtpkvException kind {@code bad_option} for an unknown policy or a keep/chunk that leaves
     *     no room
     */
    public void setOverflow(String policy, int keep, int chunk) {
        nativeSetOverflow(live(), policy, keep, chunk);
    }

    /** Slides (or restarts) so far. */
    public int slides() {
        return nativeSlides(live());
    }

    // The native half (kv_jni). Package-private so tests in org.htpkv can pass forged handles.
    static native long nativeOpen(SessionOptions options);

    static native void nativeClose(long handle);

    static native Generation nativeGenerate(long handle, String prompt, int maxTokens, SamplerOptions sampler,
            String[] stop, TokenCallback callback);

    static native void nativeCancel(long handle);

    static native int nativePrefill(long handle, String text);

    static native void nativeReset(long handle);

    static native void nativeRollback(long handle, int length);

    static native int nativeLength(long handle);

    static native int nativeCapacity(long handle);

    static native Stats nativeStats(long handle);

    static native String nativeBudget(String configYaml);

    static native int nativeLiveSessions();

    static native void nativeSave(long handle, String path);

    static native void nativeRestore(long handle, String path);

    static native int nativeAppendTurn(long handle, String role, String text);

    static native void nativeSetOverflow(long handle, String policy, int keep, int chunk);

    static native int nativeSlides(long handle);

    static native boolean nativePanicForTest();
}
