package org.htpkv;

/**
 * Receives generated text as it streams, in pieces of valid UTF-8 (a piece is usually one token).
 *
 * <p>Called on the thread that called {@link HtpkvSession#generate}. Return {@code true} to go on,
 * {@code false} to stop generation (the result's stop reason is then {@code "callback"}). An
 * exception thrown here stops generation and propagates out of {@code generate} unchanged. Calling
 * back into the same session from here fails with kind {@code busy}.
 */
@FunctionalInterface
public interface TokenCallback {
    /** Handles one piece of text; returns whether generation should go on. */
    boolean onText(String text);
}
