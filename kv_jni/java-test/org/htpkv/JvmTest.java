package org.htpkv;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The JVM test program of htpkv's Java API: loads the real {@code libkv_jni} and runs the engine on
 * the stories260K model through it. No test framework: each check prints {@code ok NAME} or
 * {@code FAIL NAME: why}; the last line is {@code N passed, N failed, N skipped}; the exit code is 1
 * when anything failed.
 *
 * <p>Arguments: {@code --model-dir DIR} (stories260K), {@code --cli PATH} (the {@code htpkv} binary,
 * whose output is the oracle for generated text), optionally {@code --qnn-backend LIB} (a QNN
 * backend library, e.g. the reference backend's cdylib) and {@code --qnn-system LIB},
 * {@code --config FILE} (a model config YAML for the budget), {@code --compiled-cache DIR}.
 * The library is found through {@code -Dhtpkv.jni.library=/abs/path/libkv_jni.so}.
 */
public final class JvmTest {
    static final String PROMPT = "Once upon a time";
    static final int STEPS = 40;
    static final long TIMEOUT_SECONDS = 120;

    private static int passed;
    private static int failed;
    private static int skipped;

    private static String modelDir;
    private static String cli;
    private static String qnnBackend;
    private static String qnnSystem;
    private static String config;
    private static String toyDir;

    /** Thrown by the checks below. */
    static final class CheckFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        CheckFailed(String message) {
            super(message);
        }
    }

    interface Body {
        void run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < args.length; i++) {
            String value = i + 1 < args.length ? args[i + 1] : null;
            switch (args[i]) {
                case "--model-dir": modelDir = value; i++; break;
                case "--cli": cli = value; i++; break;
                case "--qnn-backend": qnnBackend = emptyToNull(value); i++; break;
                case "--qnn-system": qnnSystem = emptyToNull(value); i++; break;
                case "--config": config = value; i++; break;
                case "--toy-dir": toyDir = value; i++; break;
                default:
                    System.err.println("unknown argument " + args[i]);
                    System.exit(2);
            }
        }
        boolean haveModel = modelDir != null && Files.isDirectory(Paths.get(modelDir))
                && Files.exists(Paths.get(modelDir, "stories260K.bin"));
        if (!haveModel) {
            System.out.println("note: the stories260K model was not found at " + modelDir
                    + " (set HTPKV_MODEL_DIR; the embedded default is models/stories260K): model tests are skipped");
        }

        // Tests that need no model.
        test("panic_becomes_exception_not_abort", JvmTest::panicBecomesException);
        test("bad_model_path_is_an_exception", JvmTest::badModelPath);
        test("bad_open_options_are_bad_option", JvmTest::badOpenOptions);
        test("forged_and_zero_handles_are_closed", JvmTest::forgedHandles);
        test("budget_json_and_bad_config", JvmTest::budget);

        String expected = null;
        if (haveModel && cli != null) {
            try {
                expected = cliGenerate(false);
                System.out.println("expected (CLI, reference): " + expected);
            } catch (Exception e) {
                fail("cli_reference_oracle", e);
            }
        } else if (haveModel) {
            System.out.println("note: no --cli given: text is not compared with the CLI");
        }
        final String reference = expected;
        if (haveModel) {
            try (HtpkvSession s = HtpkvSession.open(options().build())) {
                test("reference_generate_matches_cli", () -> referenceMatchesCli(s, reference));
                test("greedy_repeats_after_reset_and_streams_all_text", () -> repeatsAfterReset(s));
                test("callback_false_stops_generation", () -> callbackStops(s));
                test("callback_exception_propagates_and_session_survives", () -> callbackThrows(s));
                test("cancel_from_another_thread_stops_and_the_session_goes_on", () -> cancelStops(s));
                test("stop_strings_end_the_text_unstreamed", () -> stopStrings(s));
                test("sampler_chain_fields_reach_the_sampler", () -> samplerFields(s));
                test("prefill_rollback_reset_length_capacity", () -> prefillRollback(s));
                test("bad_generate_options_are_bad_option", () -> badGenerateOptions(s));
                test("stats_count_the_work", () -> stats(s));
                test("concurrent_use_is_busy_not_a_crash", () -> concurrentBusy(s));
                test("reentrant_call_from_callback_is_busy", () -> reentrantBusy(s));
                test("hammering_one_session_from_threads", () -> hammer(s));
            } catch (HtpkvException e) {
                fail("open_reference_session", e);
            }
            test("strategies_give_the_same_text", () -> strategiesAgree(reference));
            test("speculation_gives_the_same_text", () -> speculationAgrees(reference));
            test("model_sessions_on_threads_give_the_same_text", () -> modelSessions(reference));
            test("chat_slides_saves_and_restores", JvmTest::chatSlidesSavesRestores);
            test("small_context_fills_up", JvmTest::smallContext);
            test("use_after_close_is_closed", JvmTest::useAfterClose);
            test("close_while_generating_on_another_thread", JvmTest::closeWhileGenerating);
            if (qnnBackend != null) {
                test("qnn_generate_matches_cli", JvmTest::qnnMatchesCli);
            } else {
                skip("qnn_generate_matches_cli", "no QNN backend library (HTPKV_QNN_BACKEND=none)");
            }
        } else {
            skip("model tests", "no model");
        }
        if (toyDir != null && Files.exists(Paths.get(toyDir, "gemma3.gguf"))) {
            test("gemma_chat_template_option", JvmTest::gemmaChatTemplate);
        } else {
            skip("gemma_chat_template_option", "no toy gemma3.gguf (--toy-dir)");
        }
        test("no_model_leaks", () -> check(HtpkvModel.nativeLiveModels() == 0,
                "live models after closing all: " + HtpkvModel.nativeLiveModels()));
        test("no_session_leaks", () -> check(HtpkvSession.nativeLiveSessions() == 0,
                "live sessions after closing all: " + HtpkvSession.nativeLiveSessions()));

        System.out.println(passed + " passed, " + failed + " failed, " + skipped + " skipped");
        System.exit(failed == 0 ? 0 : 1);
    }

    // ---- the tests ----

    static void panicBecomesException() {
        HtpkvException e = expectThrows(HtpkvException.class, HtpkvSession::nativePanicForTest);
        checkEquals("panic", e.kind());
        check(e.getMessage().contains("deliberate panic"), "message: " + e.getMessage());
        // The JVM is alive and the library still works.
        checkEquals(HtpkvSession.nativeLiveSessions(), HtpkvSession.nativeLiveSessions());
    }

    static void badModelPath() {
        String missing = "/nonexistent/htpkv-model-dir";
        HtpkvException e = expectThrows(HtpkvException.class,
                () -> HtpkvSession.open(SessionOptions.builder().modelDir(missing).build()));
        check(Set.of("model_not_found", "io").contains(e.kind()), "kind " + e.kind() + ": " + e.getMessage());
        check(e.getMessage().contains(missing), "message should name the path: " + e.getMessage());
    }

    static void badOpenOptions() {
        String dir = modelDir == null ? "/nonexistent" : modelDir;
        List<SessionOptions> bad = List.of(
                SessionOptions.builder().modelDir(dir).strategy("zigzag").build(),
                SessionOptions.builder().modelDir(dir).kvDtype("u12").build(),
                SessionOptions.builder().modelDir(dir).backend("gpu").build(),
                SessionOptions.builder().modelDir(dir).qnnBackend(null, null).build(),
                SessionOptions.builder().modelDir(dir).context(-1).build(),
                SessionOptions.builder().modelDir(dir).arVariants(1, 0).build());
        for (SessionOptions o : bad) {
            HtpkvException e = expectThrows(HtpkvException.class, () -> HtpkvSession.open(o));
            check("bad_option".equals(e.kind()), o + " gave " + e);
            check(!e.getMessage().isEmpty(), "empty message for " + o);
        }
        expectThrows(HtpkvException.class, () -> HtpkvSession.open(null));
    }

    static void forgedHandles() {
        for (long h : new long[] {0L, -1L, 123456789L, Long.MAX_VALUE}) {
            checkKind("closed", () -> HtpkvSession.nativeLength(h));
            checkKind("closed", () -> HtpkvSession.nativeGenerate(h, "x", 1, SamplerOptions.greedy(), null, null));
            checkKind("closed", () -> HtpkvSession.nativeClose(h));
        }
    }

    static void budget() throws IOException {
        checkKind("budget", () -> HtpkvSession.budget("model: [this is not: a config"));
        checkKind("budget", () -> HtpkvSession.budget("model: { name: x, layers: 0 }"));
        checkKind("bad_option", () -> HtpkvSession.budget(null));
        if (config == null) {
            return;
        }
        String yaml = new String(Files.readAllBytes(Paths.get(config)), StandardCharsets.UTF_8);
        String json = HtpkvSession.budget(yaml).trim();
        check(json.startsWith("{") || json.startsWith("["), "not JSON: " + json);
        for (String strategy : new String[] {"shift", "conveyor", "smart_mask", "naive"}) {
            check(json.contains(strategy), "budget lacks " + strategy + ": " + json);
        }
    }

    static void referenceMatchesCli(HtpkvSession s, String expected) {
        s.reset();
        StringBuilder streamed = new StringBuilder();
        Generation g = s.generate(PROMPT, STEPS, SamplerOptions.greedy(), piece -> {
            streamed.append(piece);
            return true;
        });
        System.out.println("generated (JNI, reference): " + g.text());
        check(g.generatedTokens() > 0 && g.generatedTokens() <= STEPS, "tokens: " + g);
        check(g.promptTokens() > 1, "prompt tokens: " + g);
        check(Set.of("max_tokens", "end_of_text").contains(g.stopReason()), "stop: " + g);
        checkEquals(g.text(), streamed.toString());
        if (expected == null) {
            throw new CheckFailed("no CLI oracle to compare with");
        }
        checkEquals(expected, g.text());
    }

    static void repeatsAfterReset(HtpkvSession s) {
        s.reset();
        Generation a = s.generate(PROMPT, STEPS);
        check(s.length() > 0, "cache empty after generate");
        s.reset();
        checkEquals(0, s.length());
        List<String> pieces = new ArrayList<>();
        Generation b = s.generate(PROMPT, STEPS, null, pieces::add);
        checkEquals(a.text(), b.text());
        checkEquals(a.generatedTokens(), b.generatedTokens());
        checkEquals(b.text(), String.join("", pieces));
        check(pieces.size() > 1, "expected the text in several pieces, got " + pieces.size());
    }

    static void callbackStops(HtpkvSession s) {
        s.reset();
        String full = s.generate(PROMPT, STEPS).text();
        s.reset();
        List<String> pieces = new ArrayList<>();
        Generation g = s.generate(PROMPT, STEPS, SamplerOptions.greedy(), piece -> {
            pieces.add(piece);
            return pieces.size() < 3;
        });
        checkEquals("callback", g.stopReason());
        checkEquals(3, pieces.size());
        checkEquals(String.join("", pieces), g.text());
        check(full.startsWith(g.text()) && g.text().length() < full.length(),
                "stopped text '" + g.text() + "' is not a proper prefix of '" + full + "'");
    }

    /** cancel() from another thread while text streams: stops at a step boundary, never blocks. */
    static void cancelStops(HtpkvSession s) {
        s.reset();
        String full = s.generate(PROMPT, STEPS).text();
        s.reset();
        AtomicInteger pieces = new AtomicInteger();
        Generation g = s.generate(PROMPT, STEPS, null, piece -> {
            if (pieces.incrementAndGet() == 3) {
                Thread canceller = new Thread(s::cancel);
                canceller.start();
                try {
                    canceller.join(10_000);
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
                check(!canceller.isAlive(), "cancel() blocked while the session generates");
            }
            return true;
        });
        checkEquals("cancelled", g.stopReason());
        check(full.startsWith(g.text()) && g.text().length() < full.length(),
                "cancelled text '" + g.text() + "' is not a proper prefix of '" + full + "'");
        // Every generated token but the last is cached, as after any stop; the session goes on.
        checkEquals(g.promptTokens() + g.generatedTokens() - 1, s.length());
        checkEquals("max_tokens", s.generate("", 4).stopReason());
        s.cancel(); // nothing runs: no effect on the next generation
        checkEquals("max_tokens", s.generate("", 4).stopReason());
    }

    /** A stop string ends the text where it starts; it is in neither the text nor the stream. */
    static void stopStrings(HtpkvSession s) {
        s.reset();
        String full = s.generate(PROMPT, STEPS).text();
        String[] words = full.trim().split(" ");
        String stop = " " + words[Math.min(3, words.length - 1)];
        int cut = full.indexOf(stop);
        check(cut >= 0, "no '" + stop + "' in '" + full + "'");
        s.reset();
        List<String> pieces = new ArrayList<>();
        Generation g = s.generate(PROMPT, STEPS, null, List.of("never: zq", stop), piece -> pieces.add(piece));
        checkEquals("stop_string", g.stopReason());
        checkEquals(full.substring(0, cut), g.text());
        checkEquals(g.text(), String.join("", pieces));
        s.reset();
        HtpkvException e = expectThrows(HtpkvException.class,
                () -> s.generate(PROMPT, STEPS, null, List.of(""), null));
        checkEquals("bad_option", e.kind());
    }

    /** top-k 1 at a high temperature is greedy; a bad top-k or min-p is bad_option. */
    static void samplerFields(HtpkvSession s) {
        s.reset();
        String greedy = s.generate(PROMPT, STEPS).text();
        s.reset();
        SamplerOptions topK1 = SamplerOptions.builder().temperature(1.5f).topK(1).seed(7).build();
        checkEquals(greedy, s.generate(PROMPT, STEPS, topK1, null).text());
        s.reset();
        SamplerOptions penalized = SamplerOptions.builder().repeatPenalty(1.3f).penaltyLastN(32).build();
        String repeated = s.generate(PROMPT, STEPS, penalized, null).text();
        check(!repeated.equals(greedy), "the repetition penalty changed nothing: '" + repeated + "'");
        for (SamplerOptions bad : new SamplerOptions[] {
                SamplerOptions.builder().topK(-1).build(), SamplerOptions.builder().minP(1.5f).build()}) {
            s.reset();
            HtpkvException e = expectThrows(HtpkvException.class, () -> s.generate(PROMPT, STEPS, bad, null));
            checkEquals("bad_option", e.kind());
        }
    }

    static void callbackThrows(HtpkvSession s) {
        s.reset();
        IllegalStateException thrown = new IllegalStateException("stop from the callback");
        AtomicInteger calls = new AtomicInteger();
        IllegalStateException caught = expectThrows(IllegalStateException.class,
                () -> s.generate(PROMPT, STEPS, null, piece -> {
                    if (calls.incrementAndGet() == 2) {
                        throw thrown;
                    }
                    return true;
                }));
        check(caught == thrown, "a different exception arrived: " + caught);
        checkEquals(2, calls.get());
        // The session is still usable and still correct.
        s.reset();
        String again = s.generate(PROMPT, STEPS).text();
        s.reset();
        checkEquals(again, s.generate(PROMPT, STEPS).text());
    }

    static void prefillRollback(HtpkvSession s) {
        s.reset();
        int n = s.prefill(PROMPT);
        check(n > 1, "prefill cached " + n + " tokens");
        checkEquals(n, s.length());
        s.rollback(n - 2);
        checkEquals(n - 2, s.length());
        HtpkvException e = expectThrows(HtpkvException.class, () -> s.rollback(n + 100));
        check(!e.getMessage().isEmpty(), "empty message");
        checkEquals(n - 2, s.length());
        checkKind("bad_option", () -> s.rollback(-1));
        checkKind("bad_option", () -> s.prefill(null));
        int capacity = s.capacity();
        // kv_manager's contract: capacity = S - min(AR) = 512 - 1 for stories260K (seq_len 512, AR-1).
        checkEquals(511, capacity);
        s.reset();
        checkEquals(0, s.length());
        checkEquals(capacity, s.capacity());
    }

    static void badGenerateOptions(HtpkvSession s) {
        s.reset();
        checkKind("bad_option", () -> s.generate(PROMPT, -1));
        checkKind("bad_option", () -> s.generate(null, 5));
        checkKind("bad_option", () -> s.generate(PROMPT, 5,
                SamplerOptions.builder().temperature(-1f).build(), null));
        checkKind("bad_option", () -> s.generate(PROMPT, 5,
                SamplerOptions.builder().temperature(0.8f).topP(0f).build(), null));
        // A good sampled generation is reproducible from its seed.
        SamplerOptions sampled = SamplerOptions.builder().temperature(0.9f).topP(0.95f).seed(7).build();
        s.reset();
        String a = s.generate(PROMPT, 20, sampled, null).text();
        s.reset();
        checkEquals(a, s.generate(PROMPT, 20, sampled, null).text());
    }

    static void stats(HtpkvSession s) {
        Stats before = s.stats();
        s.reset();
        Generation g = s.generate(PROMPT, STEPS);
        Stats after = s.stats();
        System.out.println("stats: " + after);
        checkEquals(before.prefillTokens() + g.promptTokens(), after.prefillTokens());
        check(after.decodeTokens() > before.decodeTokens(), "decode tokens did not grow");
        check(after.decodeSeconds() > 0 && after.prefillSeconds() > 0, "no time recorded");
        check(after.decodeTokensPerSecond() > 0, "no decode rate");
        check(after.regionBytes() > 0, "no region bytes");
        check(after.handles() > 0, "no handles");
        check(after.tokensCommitted() >= s.length(), "tokens committed < length");
        // The default strategy is shift with a 2x reservation: a whole context never copies.
        checkEquals(0L, after.bytesCopied());
        checkEquals(0L, after.rebases());
    }

    static void concurrentBusy(HtpkvSession s) throws Exception {
        s.reset();
        CountDownLatch inCallback = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
            Future<Generation> running = pool.submit(() -> s.generate(PROMPT, 8, null, piece -> {
                inCallback.countDown();
                await(release);
                return true;
            }));
            check(inCallback.await(TIMEOUT_SECONDS, TimeUnit.SECONDS), "generation never reached the callback");
            checkKind("busy", s::length);
            checkKind("busy", () -> s.generate(PROMPT, 3));
            checkKind("busy", () -> s.prefill("x"));
            checkKind("busy", s::stats);
            checkKind("busy", s::reset);
            release.countDown();
            Generation g = running.get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
            check(g.generatedTokens() > 0, "generation after the busy calls: " + g);
            check(s.length() > 0, "length after generation");
        } finally {
            release.countDown();
            pool.shutdownNow();
        }
    }

    static void reentrantBusy(HtpkvSession s) {
        s.reset();
        AtomicReference<HtpkvException> inner = new AtomicReference<>();
        Generation g = s.generate(PROMPT, 10, null, piece -> {
            try {
                s.length();
            } catch (HtpkvException e) {
                inner.set(e);
            }
            return false;
        });
        check(inner.get() != null, "a call from inside the callback did not fail");
        checkEquals("busy", inner.get().kind());
        checkEquals("callback", g.stopReason());
    }

    static void hammer(HtpkvSession s) throws Exception {
        s.reset();
        int threads = 4;
        AtomicInteger ok = new AtomicInteger();
        AtomicInteger busy = new AtomicInteger();
        AtomicReference<Throwable> unexpected = new AtomicReference<>();
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            List<Future<?>> futures = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                final int id = t;
                futures.add(pool.submit(() -> {
                    for (int i = 0; i < 25; i++) {
                        try {
                            if (id == 0 && i % 5 == 0) {
                                s.reset();
                                s.generate(PROMPT, 5);
                            } else if (i % 2 == 0) {
                                s.stats();
                            } else {
                                s.length();
                            }
                            ok.incrementAndGet();
                        } catch (HtpkvException e) {
                            if ("busy".equals(e.kind())) {
                                busy.incrementAndGet();
                            } else {
                                unexpected.compareAndSet(null, e);
                            }
                        } catch (Throwable e) {
                            unexpected.compareAndSet(null, e);
                        }
                    }
                }));
            }
            for (Future<?> f : futures) {
                f.get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        if (unexpected.get() != null) {
            throw new CheckFailed("unexpected " + unexpected.get());
        }
        checkEquals(threads * 25, ok.get() + busy.get());
        check(ok.get() > 0, "no call succeeded");
        System.out.println("hammer: " + ok.get() + " calls ran, " + busy.get() + " were busy");
        // Still consistent afterwards.
        s.reset();
        checkEquals(0, s.length());
    }

    static void strategiesAgree(String expected) {
        String shiftText;
        try (HtpkvSession s = HtpkvSession.open(options().strategy("shift").build())) {
            shiftText = s.generate(PROMPT, STEPS).text();
        }
        if (expected != null) {
            checkEquals(expected, shiftText);
        }
        for (String strategy : new String[] {"conveyor", "smart_mask", "naive"}) {
            try (HtpkvSession s = HtpkvSession.open(options().strategy(strategy).build())) {
                Generation g = s.generate(PROMPT, STEPS);
                check(shiftText.equals(g.text()), strategy + " generated '" + g.text() + "', shift '" + shiftText + "'");
                Stats st = s.stats();
                if (strategy.equals("conveyor")) {
                    checkEquals(0L, st.bytesCopied());
                } else {
                    check(st.bytesCopied() > 0, strategy + " copied no bytes: " + st);
                }
            }
        }
    }

    /** Speculative decoding (prompt lookup, lookahead) gives plain decoding's greedy text. */
    static void speculationAgrees(String expected) {
        String plain;
        try (HtpkvSession s = HtpkvSession.open(options().build())) {
            plain = s.generate(PROMPT, STEPS).text();
            checkEquals(0L, s.stats().speculationCalls());
        }
        if (expected != null) {
            checkEquals(expected, plain);
        }
        for (String spec : new String[] {"prompt-lookup", "lookahead:4,3,8"}) {
            try (HtpkvSession s = HtpkvSession.open(options().speculate(spec).build())) {
                Generation g = s.generate(PROMPT, STEPS);
                check(plain.equals(g.text()), spec + " generated '" + g.text() + "', plain '" + plain + "'");
                Stats st = s.stats();
                check(st.speculationCalls() > 0 && st.speculationTokensPerCall() >= 1.0,
                        spec + ": " + st.speculationCalls() + " calls, " + st.speculationTokens() + " tokens");
            }
        }
        try {
            HtpkvSession.open(options().speculate("guess").build()).close();
            check(false, "speculate(\"guess\") was accepted");
        } catch (HtpkvException e) {
            check("bad_option".equals(e.kind()), "kind " + e.kind() + ": " + e.getMessage());
        }
    }

    /**
     * On the toy Gemma 3 GGUF (Gemma's own template in the file): a chat turn through a template
     * file given with {@code chatTemplate} answers as plain generation of the prompt that template
     * renders, unlike the model's own template; a template file that cannot be read is an
     * exception naming it.
     */
    static void gemmaChatTemplate() throws IOException {
        String gemma = Paths.get(toyDir, "gemma3.gguf").toString();
        Path template = Files.createTempFile("htpkv-jvm", ".jinja");
        try {
            Files.writeString(template, "{% for m in messages %}{{ m.role }} says: {{ m.content }}\n{% endfor %}"
                    + "{% if add_generation_prompt %}model says:{% endif %}");
            SessionOptions.Builder toy = SessionOptions.builder().modelDir(gemma).context(64).arVariants(1, 8);
            String own;
            try (HtpkvSession s = HtpkvSession.open(toy.build())) {
                s.appendTurn("user", "Hi there");
                own = s.generate("", 8).text();
            }
            String given;
            try (HtpkvSession s = HtpkvSession.open(toy.chatTemplate(template.toString()).build())) {
                s.appendTurn("user", "Hi there");
                given = s.generate("", 8).text();
            }
            String plain;
            try (HtpkvSession s = HtpkvSession.open(toy.chatTemplate(null).build())) {
                plain = s.generate("user says: Hi there\nmodel says:", 8).text();
            }
            checkEquals(plain, given);
            check(!own.equals(given), "the given template changed nothing: '" + own + "'");
            String missing = template + ".missing";
            HtpkvException e = expectThrows(HtpkvException.class,
                    () -> HtpkvSession.open(toy.chatTemplate(missing).build()).close());
            check(e.getMessage().contains(missing), "message: " + e.getMessage());
        } finally {
            Files.deleteIfExists(template);
        }
    }

    static void smallContext() {
        try (HtpkvSession s = HtpkvSession.open(options().context(64).arVariants(1, 16).build())) {
            checkEquals(63, s.capacity());
            Generation g = s.generate(PROMPT, 200);
            checkEquals("context_full", g.stopReason());
            check(s.length() <= s.capacity(), "length " + s.length() + " > capacity " + s.capacity());
            check(g.promptTokens() + g.generatedTokens() >= s.capacity(), "stopped early: " + g);
            // A prompt that no longer fits: the engine reports it as `context_full` or, for a prompt
            // that could never fit, `bad_option`; either way the message says why.
            HtpkvException full = expectThrows(HtpkvException.class, () -> s.generate(" and then", 5));
            check(Set.of("context_full", "bad_option").contains(full.kind()), "kind: " + full);
            check(full.getMessage().contains("context"), "message: " + full.getMessage());
            s.rollback(10);
            checkEquals(10, s.length());
            check(s.generate(" and then", 5).generatedTokens() > 0, "no tokens after rollback");
        }
    }

    static void useAfterClose() {
        HtpkvSession s = HtpkvSession.open(options().build());
        int live = HtpkvSession.nativeLiveSessions();
        s.generate(PROMPT, 3);
        s.close();
        check(s.isClosed(), "isClosed after close");
        checkEquals(live - 1, HtpkvSession.nativeLiveSessions());
        checkKind("closed", () -> s.generate(PROMPT, 3));
        checkKind("closed", () -> s.prefill(PROMPT));
        checkKind("closed", s::length);
        checkKind("closed", s::capacity);
        checkKind("closed", s::stats);
        checkKind("closed", s::reset);
        checkKind("closed", () -> s.rollback(0));
        s.close(); // idempotent
    }

    static void closeWhileGenerating() throws Exception {
        HtpkvSession s = HtpkvSession.open(options().build());
        int live = HtpkvSession.nativeLiveSessions();
        CountDownLatch inCallback = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
            Future<Generation> running = pool.submit(() -> s.generate(PROMPT, 10, null, piece -> {
                inCallback.countDown();
                await(release);
                return true;
            }));
            check(inCallback.await(TIMEOUT_SECONDS, TimeUnit.SECONDS), "generation never reached the callback");
            s.close();
            checkEquals(live - 1, HtpkvSession.nativeLiveSessions());
            checkKind("closed", s::length);
            release.countDown();
            Generation g = running.get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
            check(g.generatedTokens() > 0, "the running generation should finish: " + g);
            checkKind("closed", () -> s.generate(PROMPT, 3));
        } finally {
            release.countDown();
            pool.shutdownNow();
        }
    }

    static void qnnMatchesCli() throws Exception {
        String expected = cli == null ? null : cliGenerate(true);
        System.out.println("expected (CLI, qnn): " + expected);
        SessionOptions o = options().qnnBackend(qnnBackend, qnnSystem).build();
        try (HtpkvSession s = HtpkvSession.open(o)) {
            List<String> pieces = new ArrayList<>();
            Generation g = s.generate(PROMPT, STEPS, SamplerOptions.greedy(), pieces::add);
            System.out.println("generated (JNI, qnn): " + g.text());
            checkEquals(g.text(), String.join("", pieces));
            check(g.generatedTokens() > 0, "no tokens: " + g);
            if (expected == null) {
                throw new CheckFailed("no CLI oracle to compare with");
            }
            checkEquals(expected, g.text());
            check(s.stats().handles() > 0, "qnn session registered no handles");
        }
    }

    // ---- the CLI oracle ----

    /** One model, three sessions generating at once on three threads: the same text as the CLI. */
    static void modelSessions(String expected) throws Exception {
        try (HtpkvModel model = HtpkvModel.open(options().build())) {
            check(model.sharedBytes() > 0, "shared bytes " + model.sharedBytes());
            List<HtpkvSession> sessions = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                sessions.add(model.newSession());
            }
            List<Thread> threads = new ArrayList<>();
            String[] texts = new String[sessions.size()];
            for (int i = 0; i < sessions.size(); i++) {
                final int k = i;
                Thread t = new Thread(() -> texts[k] = sessions.get(k).generate(PROMPT, STEPS).text());
                threads.add(t);
                t.start();
            }
            for (Thread t : threads) {
                t.join(TimeUnit.SECONDS.toMillis(TIMEOUT_SECONDS));
            }
            for (HtpkvSession s : sessions) {
                s.close();
            }
            for (String text : texts) {
                check(text != null && !text.isEmpty(), "a session produced no text");
                checkEquals(texts[0], text);
            }
            if (expected != null) {
                checkEquals(expected, texts[0]);
            }
        }
    }

    /**
     * A chat of turns on a 64-token context with {@code slide}: it outgrows the context more than three
     * times, is saved, restored into a new session of the same model, and both continue alike.
     */
    static void chatSlidesSavesRestores() throws Exception {
        Path file = Files.createTempFile("htpkv-chat", ".session");
        try (HtpkvModel model = HtpkvModel.open(options().context(64).arVariants(1, 8).build());
                HtpkvSession a = model.newSession();
                HtpkvSession b = model.newSession()) {
            HtpkvException bad = expectThrows(HtpkvException.class, () -> a.setOverflow("sideways", 4, 8));
            check("bad_option".equals(bad.kind()), "kind " + bad.kind());
            a.setOverflow("slide", 4, 12);
            b.setOverflow("slide", 4, 12);
            a.appendTurn("system", "The story is about a cat.");
            int generated = 0;
            for (String line : new String[] {"Tell me about the cat.", "What did it eat?", "Where did it go?"}) {
                a.appendTurn("user", line);
                generated += a.generate("", 80).generatedTokens();
                check(a.length() <= a.capacity(), "length " + a.length());
            }
            check(generated > 3 * 64 - 40, "generated only " + generated);
            check(a.slides() >= 3, "slides " + a.slides());
            a.save(file.toString());
            b.restore(file.toString());
            checkEquals(Integer.toString(a.length()), Integer.toString(b.length()));
            b.appendTurn("user", "And then?");
            a.appendTurn("user", "And then?");
            checkEquals(a.generate("", 40).text(), b.generate("", 40).text());
            Files.write(file, new byte[] {1, 2, 3});
            HtpkvException e = expectThrows(HtpkvException.class, () -> b.restore(file.toString()));
            check("bad_session".equals(e.kind()), "kind " + e.kind() + ": " + e.getMessage());
        } finally {
            Files.deleteIfExists(file);
        }
    }

    static SessionOptions.Builder options() {
        return SessionOptions.builder().modelDir(modelDir);
    }

    /** Runs {@code htpkv generate} with the settings the tests use; returns the generated text. */
    static String cliGenerate(boolean qnn) throws IOException, InterruptedException {
        List<String> command = new ArrayList<>(Arrays.asList(cli, "generate", PROMPT,
                "--model-dir", modelDir, "--steps", Integer.toString(STEPS), "--temperature", "0"));
        if (qnn) {
            command.addAll(Arrays.asList("--backend", "qnn", "--qnn-backend", qnnBackend));
            if (qnnSystem != null) {
                command.addAll(Arrays.asList("--qnn-system", qnnSystem));
            }
        }
        ProcessBuilder pb = new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT);
        Process p = pb.start();
        p.getOutputStream().close();
        String out = readAll(p.getInputStream());
        if (!p.waitFor(TIMEOUT_SECONDS, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new CheckFailed("the CLI did not finish: " + command);
        }
        if (p.exitValue() != 0) {
            throw new CheckFailed("the CLI failed (exit " + p.exitValue() + "): " + command);
        }
        // `htpkv generate` prints the prompt, then streams the generated text to stdout and ends it
        // with one newline; progress and statistics go to stderr.
        if (!out.endsWith("\n") || !out.startsWith(PROMPT)) {
            throw new CheckFailed("CLI output is not the prompt, the text and a newline: '" + out + "'");
        }
        return out.substring(PROMPT.length(), out.length() - 1);
    }

    static String readAll(InputStream in) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        in.transferTo(buf);
        return buf.toString(StandardCharsets.UTF_8);
    }

    // ---- a tiny harness ----

    static void test(String name, Body body) {
        try {
            body.run();
            passed++;
            System.out.println("ok " + name);
        } catch (Throwable e) {
            fail(name, e);
        }
    }

    static void fail(String name, Throwable e) {
        failed++;
        System.out.println("FAIL " + name + ": " + e);
        if (!(e instanceof CheckFailed)) {
            e.printStackTrace(System.out);
        }
    }

    static void skip(String name, String why) {
        skipped++;
        System.out.println("skip " + name + ": " + why);
    }

    static void check(boolean condition, String message) {
        if (!condition) {
            throw new CheckFailed(message);
        }
    }

    static void checkEquals(Object expected, Object actual) {
        if (expected == null ? actual != null : !expected.equals(actual)) {
            throw new CheckFailed("expected <" + expected + "> but got <" + actual + ">");
        }
    }

    /** Runs {@code body}, which must throw an HtpkvException of {@code kind} (any kind when null). */
    static void checkKind(String kind, Body body) {
        HtpkvException e = expectThrows(HtpkvException.class, body);
        if (kind != null && !kind.equals(e.kind())) {
            throw new CheckFailed("expected kind " + kind + " but got " + e);
        }
        check(e.getMessage() != null && !e.getMessage().isEmpty(), "empty message: " + e);
    }

    static <T extends Throwable> T expectThrows(Class<T> type, Body body) {
        try {
            body.run();
        } catch (Throwable e) {
            if (type.isInstance(e)) {
                return type.cast(e);
            }
            throw new CheckFailed("expected " + type.getSimpleName() + " but got " + e);
        }
        throw new CheckFailed("expected " + type.getSimpleName() + " but nothing was thrown");
    }

    static void await(CountDownLatch latch) {
        try {
            if (!latch.await(TIMEOUT_SECONDS, TimeUnit.SECONDS)) {
                throw new IllegalStateException("timed out waiting");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    static String emptyToNull(String s) {
        return s == null || s.isEmpty() ? null : s;
    }
}
