package org.htpkv;

import java.util.concurrent.atomic.AtomicLong;

/**
 * A loaded model (weights, compiled graphs, tokenizer) that serves several sessions, each with its own
 * KV cache, from any threads: {@code HtpkvModel.open(options)} once, then {@link #newSession()} per
 * conversation. Closing the model releases this handle; sessions already opened keep the model alive
 * until they are closed.
 *
 * <p>With the reference backend the sessions share the compiled model; with the QNN backend each
 * session opens its own QNN context from the same binary.
 */
public final class HtpkvModel implements AutoCloseable {
    static {
        // The native library is loaded by HtpkvSession's initializer.
        HtpkvSession.nativeLiveSessions();
    }

    private final AtomicLong handle;

    private HtpkvModel(long handle) {
        this.handle = new AtomicLong(handle);
    }

    /**
     * Loads a model (compiling and caching it on first use) with the options a session would use.
     *
     * @throws HtpkvException e.g. kind {@code model_not_found}, {@code bad_option}, {@code compile}
     */
    public static HtpkvModel open(SessionOptions options) {
        // The native side refuses null options (kind bad_option), with every other option check.
        return new HtpkvModel(nativeOpen(options));
    }

    /** A new session on this model, with its own KV cache; close it when done. */
    public HtpkvSession newSession() {
        return new HtpkvSession(nativeNewSession(live()));
    }

    /** Bytes every session of this model shares (the compiled model; 0 with QNN). */
    public long sharedBytes() {
        return nativeSharedBytes(live());
    }

    /** Releases this model handle. Idempotent. */
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
            throw new HtpkvException("closed", "model is closed");
        }
        return h;
    }

    static native long nativeOpen(SessionOptions options);

    static native long nativeNewSession(long model);

    static native long nativeSharedBytes(long model);

    static native void nativeClose(long model);

    static native int nativeLiveModels();
}
