package org.htpkv;

/** The result of {@link HtpkvSession#generate}. Created by the native code. */
public final class Generation {
    private final String text;
    private final int promptTokens;
    private final int generatedTokens;
    private final String stopReason;

    /** Creates a result (called by the native code). */
    public Generation(String text, int promptTokens, int generatedTokens, String stopReason) {
        this.text = text;
        this.promptTokens = promptTokens;
        this.generatedTokens = generatedTokens;
        this.stopReason = stopReason;
    }

    /** The generated text (without the prompt). */
    public String text() {
        return text;
    }

    /** Tokens of the prompt (with BOS when the cache was empty). */
    public int promptTokens() {
        return promptTokens;
    }

    /** Tokens generated. */
    public int generatedTokens() {
        return generatedTokens;
    }

    /**
     * Why generation stopped: {@code "end_of_text"}, {@code "stop_string"}, {@code "max_tokens"},
     * {@code "context_full"}, {@code "cancelled"} ({@link HtpkvSession#cancel()}) or
     * {@code "callback"}.
     */
    public String stopReason() {
        return stopReason;
    }

    @Override
    public String toString() {
        return "Generation{promptTokens=" + promptTokens + ", generatedTokens=" + generatedTokens
                + ", stopReason=" + stopReason + ", text=" + text + "}";
    }
}
