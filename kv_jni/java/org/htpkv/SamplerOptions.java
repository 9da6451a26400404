package org.htpkv;

/**
 * How the next token is chosen. Defaults: temperature 0 (greedy), top-p 0.9, seed 42 (the same
 * defaults as the Rust runtime). Values are checked by the native code: a bad one gives an
 * {@link HtpkvException} of kind {@code bad_option} when generating.
 */
public final class SamplerOptions {
    private final float temperature;
    private final float topP;
    private final long seed;

    private SamplerOptions(Builder b) {
        this.temperature = b.temperature;
        this.topP = b.topP;
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

    /** Seed of the random generator (all 64 bits are used). */
    public long seed() {
        return seed;
    }

    @Override
    public String toString() {
        return "SamplerOptions{temperature=" + temperature + ", topP=" + topP + ", seed=" + seed + "}";
    }

    /** Builds {@link SamplerOptions}. */
    public static final class Builder {
        private float temperature = 0.0f;
        private float topP = 0.9f;
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
