package org.htpkv;

/**
 * How the next token is chosen: temperature, then top-k, min-p and top-p, after the repetition,
 * presence and frequency penalties; the same chain and defaults as the Rust runtime (greedy,
 * top-p 0.9, no penalties, seed 42). Values are checked by the native code: a bad one gives an
 * {@link HtpkvException} of kind {@code bad_option} when generating.
 */
public final class SamplerOptions {
    // Read by the native code by name.
    final float temperature;
    final float topP;
    final int topK;
    final float minP;
    final float repeatPenalty;
    final float presencePenalty;
    final float frequencyPenalty;
    final int penaltyLastN;
    final long seed;

    private SamplerOptions(Builder b) {
        this.temperature = b.temperature;
        this.topP = b.topP;
        this.topK = b.topK;
        this.minP = b.minP;
        this.repeatPenalty = b.repeatPenalty;
        this.presencePenalty = b.presencePenalty;
        this.frequencyPenalty = b.frequencyPenalty;
        this.penaltyLastN = b.penaltyLastN;
        this.seed = b.seed;
    }

    /** Greedy decoding (temperature 0): the same text every time. */
    public static SamplerOptions greedy() {
        return builder().build();
    }

    /** A builder starting from the defaults. */
    public static Builder builder() {
        return new Builder();
    }

    /** 0 means greedy; otherwise logits are divided by it before the softmax. */
    public float temperature() {
        return temperature;
    }

    /** Nucleus sampling threshold in (0, 1]; 1 disables it. */
    public float topP() {
        return topP;
    }

    /** Keep the K most likely tokens (0 disables it); applied before min-p and top-p. */
    public int topK() {
        return topK;
    }

    /** Keep tokens at least min-p times as likely as the most likely one (0 disables it). */
    public float minP() {
        return minP;
    }

    /** Repetition penalty over the last penaltyLastN tokens (1 disables it). */
    public float repeatPenalty() {
        return repeatPenalty;
    }

    /** Subtracted once from the logit of every token seen in the last penaltyLastN tokens. */
    public float presencePenalty() {
        return presencePenalty;
    }

    /** Subtracted from a token's logit once per time it occurs in the last penaltyLastN tokens. */
    public float frequencyPenalty() {
        return frequencyPenalty;
    }

    /** How many of the latest tokens the penalties look at. */
    public int penaltyLastN() {
        return penaltyLastN;
    }

    /** Seed of the random generator (all 64 bits are used). */
    public long seed() {
        return seed;
    }

    @Override
    public String toString() {
        return "SamplerOptions{"
            + "temperature=" + temperature
            + ", topP=" + topP
            + ", topK=" + topK
            + ", minP=" + minP
            + ", repeatPenalty=" + repeatPenalty
            + ", presencePenalty=" + presencePenalty
            + ", frequencyPenalty=" + frequencyPenalty
            + ", penaltyLastN=" + penaltyLastN
            + ", seed=" + seed
            + "}";
    }

    /** Builds {@link SamplerOptions}. */
    public static final class Builder {
        private float temperature = 0.0f;
        private float topP = 0.9f;
        private int topK = 0;
        private float minP = 0.0f;
        private float repeatPenalty = 1.0f;
        private float presencePenalty = 0.0f;
        private float frequencyPenalty = 0.0f;
        private int penaltyLastN = 64;
        private long seed = 42L;

        private Builder() {}

        /** Sets the temperature (>= 0; 0 is greedy). */
        public Builder temperature(float temperature) {
            this.temperature = temperature;
            return this;
        }

        /** Sets top-p, in (0, 1]. */
        public Builder topP(float topP) {
            this.topP = topP;
            return this;
        }

        /** Sets top-k (>= 0). */
        public Builder topK(int topK) {
            this.topK = topK;
            return this;
        }

        /** Sets min-p, in [0, 1). */
        public Builder minP(float minP) {
            this.minP = minP;
            return this;
        }

        /** Sets the repetition penalty (> 0). */
        public Builder repeatPenalty(float repeatPenalty) {
            this.repeatPenalty = repeatPenalty;
            return this;
        }

        /** Sets the presence penalty. */
        public Builder presencePenalty(float presencePenalty) {
            this.presencePenalty = presencePenalty;
            return this;
        }

        /** Sets the frequency penalty. */
        public Builder frequencyPenalty(float frequencyPenalty) {
            this.frequencyPenalty = frequencyPenalty;
            return this;
        }

        /** Sets how many tokens the penalties look at (>= 0). */
        public Builder penaltyLastN(int penaltyLastN) {
            this.penaltyLastN = penaltyLastN;
            return this;
        }

        /** Sets the seed. */
        public Builder seed(long seed) {
            this.seed = seed;
            return this;
        }

        /** The options. */
        public SamplerOptions build() {
            return new SamplerOptions(this);
        }
    }
}
