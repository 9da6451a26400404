package org.htpkv;

/**
 * An error reported by htpkv's native code.
 *
 * <p>{@link #kind()} is a stable, machine-readable category; {@link #getMessage()} says what went
 * wrong for people. Kinds include {@code closed} (the session was closed, or the handle is not a
 * live session), {@code busy} (another thread is using the session at this moment),
 * {@code bad_option}, {@code model_not_found}, {@code bad_model}, {@code compile},
 * {@code context_full}, {@code kv}, {@code backend}, {@code qnn}, {@code io}, {@code budget},
 * {@code poisoned} (an earlier call panicked inside this session: close it), {@code panic} and
 * {@code jni}.
 *
 * <p>Unchecked, so it passes through lambdas (e.g. a {@link TokenCallback}) and Kotlin code.
 */
public class HtpkvException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String kind;

    /** Creates an exception of the given kind; also called by the native code. */
    public HtpkvException(String kind, String message) {
        super(message);
        this.kind = kind == null ? "unknown" : kind;
    }

    /** The error kind, e.g. {@code "closed"}, {@code "busy"}, {@code "bad_option"}. */
    public String kind() {
        return kind;
    }

    @Override
    public String toString() {
        return "HtpkvException[" + kind + "]: " + getMessage();
    }
}
