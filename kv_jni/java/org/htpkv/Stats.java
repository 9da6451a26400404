package org.htpkv;

/**
 * Timings and KV cache counters of a session since it was opened. Created by the native code;
 * see {@link HtpkvSession#stats()}.
 */
public final class Stats {
    private final long prefillTokens;
    private final double prefillSeconds;
    private final long decodeTokens;
    private final double decodeSeconds;
    private final long steps;
    private final long tokensCommitted;
    private final long bytesCopied;
    private final long rebases;
    private final long handles;
    private final long maxWindowOffsetsPerBuffer;
    private final long worstStepBytesCopied;
    private final long peakBytesInUse;
    private final long regionBytes;
    private final long speculationCalls;
    private final long speculationTokens;
    private final long speculationAccepted;

    /** Creates the stats (called by the native code; the argument order is part of the JNI glue). */
    public Stats(long prefillTokens, double prefillSeconds, long decodeTokens, double decodeSeconds,
            long steps, long tokensCommitted, long bytesCopied, long rebases, long handles,
            long maxWindowOffsetsPerBuffer, long worstStepBytesCopied, long peakBytesInUse,
            long regionBytes, long speculationCalls, long speculationTokens,
            long speculationAccepted) {
        this.prefillTokens = prefillTokens;
        this.prefillSeconds = prefillSeconds;
        this.decodeTokens = decodeTokens;
        this.decodeSeconds = decodeSeconds;
        this.steps = steps;
        this.tokensCommitted = tokensCommitted;
        this.bytesCopied = bytesCopied;
        this.rebases = rebases;
        this.handles = handles;
        this.maxWindowOffsetsPerBuffer = maxWindowOffsetsPerBuffer;
        this.worstStepBytesCopied = worstStepBytesCopied;
        this.peakBytesInUse = peakBytesInUse;
        this.regionBytes = regionBytes;
        this.speculationCalls = speculationCalls;
        this.speculationTokens = speculationTokens;
        this.speculationAccepted = speculationAccepted;
    }

    /** Prompt tokens processed. */
    public long prefillTokens() { return prefillTokens; }
    /** Wall time spent on prompts, in seconds. */
    public double prefillSeconds() { return prefillSeconds; }
    /** Tokens generated (decode steps). */
    public long decodeTokens() { return decodeTokens; }
    /** Wall time spent decoding, in seconds. */
    public double decodeSeconds() { return decodeSeconds; }
    /** Graph steps planned by the KV manager. */
    public long steps() { return steps; }
    /** Tokens committed to the KV cache. */
    public long tokensCommitted() { return tokensCommitted; }
    /** Bytes the KV manager copied (0 for the zero-copy strategies without rebases). */
    public long bytesCopied() { return bytesCopied; }
    /** Rebases of the {@code shift} strategy. */
    public long rebases() { return rebases; }
    /** Distinct buffer bindings: the memory handles a QNN HTP backend needs. */
    public long handles() { return handles; }
    /** The largest number of distinct past-window offsets of one buffer. */
    public long maxWindowOffsetsPerBuffer() { return maxWindowOffsetsPerBuffer; }
    /** The most bytes copied by one step. */
    public long worstStepBytesCopied() { return worstStepBytesCopied; }
    /** The highest byte of the KV region any binding reached. */
    public long peakBytesInUse() { return peakBytesInUse; }
    /** Size of the KV region in bytes. */
    public long regionBytes() { return regionBytes; }
    /** Target model calls of speculative decoding (verifications and plain steps; 0 without it). */
    public long speculationCalls() { return speculationCalls; }
    /** Tokens generated with speculative decoding. */
    public long speculationTokens() { return speculationTokens; }
    /** Proposed tokens accepted by verification. */
    public long speculationAccepted() { return speculationAccepted; }

    /** Tokens per target call of speculative decoding (0 without it). */
    public double speculationTokensPerCall() {
        return speculationCalls > 0 ? (double) speculationTokens / speculationCalls : 0.0;
    }

    /** Prompt tokens per second (0 before any prompt). */
    public double prefillTokensPerSecond() {
        return prefillSeconds > 0 ? prefillTokens / prefillSeconds : 0.0;
    }

    /** Generated tokens per second (0 before any decode step). */
    public double decodeTokensPerSecond() {
        return decodeSeconds > 0 ? decodeTokens / decodeSeconds : 0.0;
    }

    @Override
    public String toString() {
        return String.format(java.util.Locale.ROOT,
                "Stats{prefill %d tok %.1f tok/s, decode %d tok %.1f tok/s, steps=%d, bytesCopied=%d,"
                        + " rebases=%d, handles=%d, regionBytes=%d}",
                prefillTokens, prefillTokensPerSecond(), decodeTokens, decodeTokensPerSecond(), steps,
                bytesCopied, rebases, handles, regionBytes);
    }
}
