package org.htpkv;

import java.util.Arrays;

/**
 * How to open a {@link HtpkvSession}: which model, which backend, how the KV cache is managed.
 * Anything left unset uses the engine's default (reference backend, model discovery, strategy
 * {@code shift} with a 2x reservation, KV dtype {@code u16}, weights {@code i8}, the model's context,
 * AR variants 1 and 32). Values are checked by the native code when the session opens: a bad one
 * gives an {@link HtpkvException} of kind {@code bad_option}.
 */
public final class SessionOptions {
    final String modelDir;
    final String compiled;
    final String backend;
    final String qnnBackendLib;
    final String qnnSystemLib;
    final String strategy;
    final String kvDtype;
    final String weights;
    final int context;
    final int[] arVariants;
    final String cacheDir;
    final String speculate;
    final String chatTemplate;

    private SessionOptions(Builder b) {
        this.modelDir = b.modelDir;
        this.compiled = b.compiled;
        this.backend = b.backend;
        this.qnnBackendLib = b.qnnBackendLib;
        this.qnnSystemLib = b.qnnSystemLib;
        this.strategy = b.strategy;
        this.kvDtype = b.kvDtype;
        this.weights = b.weights;
        this.context = b.context;
        this.arVariants = b.arVariants == null ? null : b.arVariants.clone();
        this.cacheDir = b.cacheDir;
        this.speculate = b.speculate;
        this.chatTemplate = b.chatTemplate;
    }

    /** A builder with everything unset (the engine's defaults). */
    public static Builder builder() {
        return new Builder();
    }

    @Override
    public String toString() {
        return "SessionOptions{modelDir=" + modelDir + ", compiled=" + compiled + ", backend=" + backend
                + ", qnnBackendLib=" + qnnBackendLib + ", qnnSystemLib=" + qnnSystemLib
                + ", strategy=" + strategy + ", kvDtype=" + kvDtype + ", weights=" + weights
                + ", context=" + context + ", arVariants=" + Arrays.toString(arVariants)
                + ", cacheDir=" + cacheDir + ", speculate=" + speculate + ", chatTemplate=" + chatTemplate + "}";
    }

    /** Builds {@link SessionOptions}. */
    public static final class Builder {
        private String modelDir;
        private String compiled;
        private String backend;
        private String qnnBackendLib;
        private String qnnSystemLib;
        private String strategy;
        private String kvDtype;
        private String weights;
        private int context;
        private int[] arVariants;
        private String cacheDir;
        private String speculate;
        private String chatTemplate;

        private Builder() {}

        /**
         * A chat template file (Jinja, as Hugging Face's {@code chat_template}) used instead of the
         * model's own, as the CLI's {@code --chat-template}: a base model without one (Gemma 3
         * 270M) refuses chat turns until given one. A file that cannot be read or compiled gives
         * an {@link HtpkvException} naming it when the session opens.
         */
        public Builder chatTemplate(String chatTemplate) {
            this.chatTemplate = chatTemplate;
            return this;
        }

        /**
         * Speculative decoding, spelled as the CLI's {@code --speculate}: {@code prompt-lookup[:K]},
         * {@code lookahead[:W,N,G]} or {@code draft:PATH[:K]}. Greedy text is unchanged; the
         * verification AR variant joins the default ones when {@link #arVariants} is not set.
         * {@link Stats#speculationTokensPerCall()} shows what it bought.
         */
        public Builder speculate(String speculate) {
            this.speculate = speculate;
            return this;
        }

        /** Directory holding the model checkpoint and tokenizer (e.g. stories260K). */
        public Builder modelDir(String modelDir) {
            this.modelDir = modelDir;
            return this;
        }

        /** A compiled model (context binary) to load instead of compiling the checkpoint. */
        public Builder compiled(String compiled) {
            this.compiled = compiled;
            return this;
        }

        /** Uses the in-process reference CPU backend (the default). */
        public Builder referenceBackend() {
            this.backend = "reference";
            this.qnnBackendLib = null;
            this.qnnSystemLib = null;
            return this;
        }

        /**
         * Uses a QNN backend library through the QNN C API: {@code libQnnHtp.so} on a phone. The
         * system library ({@code libQnnSystem.so}) may be null.
         */
        public Builder qnnBackend(String backendLib, String systemLib) {
            this.backend = "qnn";
            this.qnnBackendLib = backendLib;
            this.qnnSystemLib = systemLib;
            return this;
        }

        /** Backend by name ({@code "reference"} or {@code "qnn"}), for apps that read it from settings. */
        public Builder backend(String backend) {
            this.backend = backend;
            return this;
        }

        /** KV update strategy: {@code shift}, {@code conveyor}, {@code smart_mask} or {@code naive}. */
        public Builder strategy(String strategy) {
            this.strategy = strategy;
            return this;
        }

        /** KV cache element type: {@code u8}, {@code u16}, {@code f16} or {@code f32}. */
        public Builder kvDtype(String kvDtype) {
            this.kvDtype = kvDtype;
            return this;
        }

        /** Weight type used when compiling: {@code i8}, {@code i4}, {@code i8f16}, {@code f16} or {@code f32}. */
        public Builder weights(String weights) {
            this.weights = weights;
            return this;
        }

        /** Context length in tokens; 0 (the default) means the model's own. */
        public Builder context(int context) {
            this.context = context;
            return this;
        }

        /** Tokens per step of the graph variants, e.g. {@code 1, 32} (decode and prompt). */
        public Builder arVariants(int... arVariants) {
            this.arVariants = arVariants == null ? null : arVariants.clone();
            return this;
        }

        /**
         * Directory where compiled models are cached (default: {@code $HTPKV_CACHE_DIR}, then
         * {@code $XDG_CACHE_HOME/htpkv}, then {@code $HOME/.cache/htpkv}). On Android pass the app's
         * {@code context.getCacheDir()} path.
         */
        public Builder cacheDir(String cacheDir) {
            this.cacheDir = cacheDir;
            return this;
        }

        /** The options. */
        public SessionOptions build() {
            return new SessionOptions(this);
        }
    }
}
