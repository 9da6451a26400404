//! `htpkv budget` and `htpkv plan` against hostile input (issue 14): huge dimensions, counts that
//! used to wrap, closed or full stdout, and the memory a short `plan` of a large cache touches. Every
//! run has a deadline, so a regression to a hang fails instead of hanging the suite.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

fn config(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join("configs").join(name).display().to_string()
}

/// A copy of a shipped config with `from` replaced by `to`, in this process's shared scratch
/// directory.
fn variant(name: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(config(name)).unwrap();
    assert!(text.contains(from), "{from} not in {name}");
    let dir = test_support::files::shared_dir("hostile-budget");
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path: PathBuf = dir.join(format!("{}.yaml", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, text.replace(from, to)).unwrap();
    path.display().to_string()
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Waits for `child` at most [`DEADLINE`]; kills it and fails the test past that.
fn finish(mut child: Child, what: &str) -> Run {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Run {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            };
        }
        if start.elapsed() > DEADLINE {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("htpkv {what} did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn htpkv_to(args: &[&str], stdout: Stdio) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_htpkv"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run htpkv");
    finish(child, &args.join(" "))
}

fn htpkv(args: &[&str]) -> Run {
    htpkv_to(args, Stdio::piped())
}

/// Runs htpkv, expects exit status 1 and returns the single error line.
fn error_of(args: &[&str]) -> String {
    let run = htpkv(args);
    assert_eq!(run.code, Some(1), "htpkv {args:?}: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    run.stderr.trim_end().to_string()
}

#[test]
fn huge_dimensions_are_refused_by_name_and_limit_not_allocated() {
    // Row 1: 2^40 layers used to abort allocating 351,843,720,888,320 bytes of encodings.
    let big = variant("stories260K.yaml", "layers: 5", "layers: 1099511627776");
    for command in [
        &["budget", big.as_str()][..],
        &["plan", &big, "--steps", "1"],
    ] {
        assert_eq!(
            error_of(command),
            format!(
                "error: {big}: field `model.layers`: 1099511627776 is above the limit; \
                 expected a positive integer up to 4096"
            )
        );
    }
    let heads = variant(
        "stories260K.yaml",
        "heads: 8, kv_heads: 4, head_dim: 8, vocab: 512, dim: 64",
        "heads: 1073741824, kv_heads: 1073741824, head_dim: 8, vocab: 512",
    );
    assert_eq!(
        error_of(&["budget", &heads]),
        format!(
            "error: {heads}: field `model.heads`: 1073741824 is above the limit; \
             expected a positive integer up to 4096"
        )
    );
    // Row 10: a context of 2^32 used to report wrapped copy counts.
    let ctx = variant("stories260K.yaml", "context: 512", "context: 4294967296");
    assert_eq!(
        error_of(&["budget", &ctx, "--update", "naive"]),
        format!(
            "error: {ctx}: field `graph.context`: 4294967296 is above the limit; \
             expected a positive integer up to 16777216"
        )
    );
}

#[test]
fn run_totals_that_overflow_are_reported_not_wrapped() {
    // Row 10 at the largest accepted context: naive copies more than 2^64 bytes over the run.
    let seed = config("llama-2-7b.yaml");
    assert_eq!(
        error_of(&[
            "budget",
            &seed,
            "--context",
            "16777216",
            "--update",
            "naive"
        ]),
        format!(
            "error: {seed}: update naive: bytes copied over the run overflow the 64-bit size type"
        )
    );
    // The same context with a zero-copy strategy is answered exactly.
    let run = htpkv(&[
        "budget",
        &seed,
        "--context",
        "16777216",
        "--update",
        "conveyor",
        "--json",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        doc[0]["region_bytes"].as_u64().unwrap(),
        (2047 * 16_777_216 + 2 * 16_777_215) * 256
    );
}

#[test]
fn prefill_and_steps_near_usize_max_are_refused_at_once() {
    let stories = config("stories260K.yaml");
    let max = usize::MAX.to_string();
    // Row 2 (capacity overflow) and row 4 (wrapped chunk arithmetic, a hang of 18 GB).
    for (steps, update) in [("0", "naive"), ("1", "shift")] {
        assert_eq!(
            error_of(&[
                "plan",
                &stories,
                "--steps",
                steps,
                "--prefill",
                &max,
                "--update",
                update,
            ]),
            format!(
                "error: a prefill of {max} tokens and {steps} decode steps do not fit the cache: \
                 the cache holds 511 tokens (context 512 - 1)"
            )
        );
    }
    assert_eq!(
        error_of(&["plan", &stories, "--steps", &max]),
        format!(
            "error: a prefill of 0 tokens and {max} decode steps do not fit the cache: at most 511 \
             AR-1 decode steps fit after the prefill (the cache holds 511 tokens)"
        )
    );
    assert!(error_of(&["budget", &stories, "--prefill", &max]).contains("the cache holds 511"));
}

#[test]
fn fit_budgets_are_bounded_and_the_context_limit_is_named() {
    let stories = config("stories260K.yaml");
    // Row 11: every strategy used to report the same absurd S.
    assert_eq!(
        error_of(&["budget", &stories, "--fit", &usize::MAX.to_string()]),
        "error: byte size `18446744073709551615` is above the limit of 1 PiB (1125899906842624 bytes)"
    );
    let run = htpkv(&["budget", &stories, "--fit", "1PiB", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc[0]["largest_context"], 1 << 24);
    for s in doc[0]["strategies"].as_array().unwrap() {
        assert_eq!(s["context"], 1 << 24, "{s}");
        assert_eq!(s["at_context_limit"], true, "{s}");
    }
    let text = htpkv(&["budget", &stories, "--fit", "1PiB"]);
    assert!(
        text.stdout
            .contains("S = 16,777,216 (htpkv's context limit) with"),
        "{}",
        text.stdout
    );
}

#[test]
fn huge_reservations_blame_kv_reserve_with_the_limit() {
    // Row 15: used to wrap to "reservation of 510 rows ... too small", blamed on graph.context.
    let stories = config("stories260K.yaml");
    assert_eq!(
        error_of(&["budget", &stories, "--reserve", "1e300x"]),
        format!(
            "error: the config is invalid with the command-line overrides: {stories}: field \
             `kv.reserve`: shift reservation of 1e300x exceeds the limit of 67108864 rows per \
             buffer; expected a smaller reservation, e.g. 2x (twice the largest window) or +K"
        )
    );
    let rows = variant(
        "stories260K.yaml",
        "reserve: 2x",
        "reserve: 18446744073709551615",
    );
    assert_eq!(
        error_of(&["budget", &rows]),
        format!(
            "error: {rows}: field `kv.reserve`: shift reservation of 18446744073709551615 rows \
             exceeds the limit of 67108864 rows per buffer; expected a smaller reservation, e.g. \
             2x (twice the largest window) or +K"
        )
    );
    // Even when the config's own strategy ignores the reservation (budget reports shift anyway).
    let naive = variant(
        "stories260K.yaml",
        "update: shift, reserve: 2x",
        "update: naive, reserve: +18446744073709551615",
    );
    assert!(error_of(&["budget", &naive]).contains("field `kv.reserve`"));
}

/// Row 3: every subcommand's output goes through one writer; a reader that went away ends the command
/// quietly with success, a full disk is an error.
#[test]
fn closed_and_full_stdout() {
    let stories = config("stories260K.yaml");
    let commands: [&[&str]; 4] = [
        &["budget", &stories],
        &["budget", &stories, "--json"],
        &["budget", &stories, "--fit", "1MiB"],
        &["plan", &stories, "--steps", "300", "--prefill", "40"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let run = htpkv_to(args, Stdio::from(writer));
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr, "", "{args:?}");

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let run = htpkv_to(args, Stdio::from(full));
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stderr);
        assert_eq!(
            run.stderr, "error: writing to stdout: No space left on device (os error 28)\n",
            "{args:?}"
        );
    }
}

/// The peak RSS of `htpkv ARGS` in KiB, measured by GNU time; None (the caller skips) without it.
fn max_rss_kib(args: &[&str]) -> Option<usize> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        eprintln!("skipped: /usr/bin/time (GNU time) is not installed");
        return None;
    }
    let child = Command::new(time)
        .args(["-f", "max_rss_kib=%M", env!("CARGO_BIN_EXE_htpkv")])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = finish(child, &args.join(" "));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let kib = run
        .stderr
        .rsplit("max_rss_kib=")
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no RSS in {}", run.stderr));
    Some(kib)
}

/// Row 17: a 10-step plan of Llama-2-7B (a 2 GiB region) must not fault in the whole region.
#[test]
fn a_short_plan_touches_a_small_part_of_a_large_region() {
    let seed = config("llama-2-7b.yaml");
    if let Some(kib) = max_rss_kib(&["plan", &seed, "--steps", "10"]) {
        // The region is 2,146,435,072 bytes; ten steps write 10 rows of each of 2,048 buffers.
        assert!(kib < 256 * 1024, "max RSS {kib} KiB");
    }
    // The handle bookkeeping of a long reservation with many AR variants (4 layers x 2^26 rows x 64
    // variants = 2 GiB of bits) is not touched either.
    let ar: Vec<String> = (1..=64).map(|n| n.to_string()).collect();
    let many = variant(
        "stories260K.yaml",
        "layers: 5, heads: 8, kv_heads: 4, head_dim: 8, vocab: 512, dim: 64 }\ngraph: { context: 512, ar: [1, 32] }",
        &format!(
            "layers: 4, heads: 1, kv_heads: 1, head_dim: 1, vocab: 8 }}\ngraph: {{ context: 4096, ar: [{}] }}",
            ar.join(", ")
        ),
    );
    let args = [
        "plan",
        &many,
        "--steps",
        "5",
        "--reserve",
        "67108864",
        "--dtype",
        "u8",
    ];
    if let Some(kib) = max_rss_kib(&args) {
        assert!(kib < 256 * 1024, "max RSS {kib} KiB");
    }
}

#[test]
fn long_simulations_are_refused_and_long_predictions_stay_fast() {
    // `plan` of naive over a whole Llama-2-7B context would move 2 TiB: refused with its figures.
    let seed = config("llama-2-7b.yaml");
    assert_eq!(
        error_of(&["plan", &seed, "--steps", "2047", "--update", "naive"]),
        "error: this run is too long to simulate: 2,047 steps x 2,048 K/V buffers = 4,192,256 \
         bindings and 2.00 TiB moved; `htpkv plan` simulates at most 33,554,432 bindings and \
         16.00 GiB (`htpkv budget --prefill 0` predicts the full-context run in closed form)"
    );
    // `budget` of a 4096-layer model whose shift reservation rebases every 32 steps of a 2^24-token
    // context: one prediction per distinct layer start, not per layer (4096 x 2^19 rebases).
    let deep = variant("stories260K.yaml", "layers: 5,", "layers: 4096,");
    let start = Instant::now();
    let run = htpkv(&[
        "budget",
        &deep,
        "--context",
        "16777216",
        "--reserve",
        "+32",
        "--update",
        "shift",
        "--json",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    // R = W + 32 holds one AR-32 step past the window: every layer rebases once per 32 decode steps,
    // at lengths 32, 64, ... up to the last step's 2^24 - 2.
    assert_eq!(
        doc[0]["rebases_per_context"].as_u64().unwrap(),
        4096 * (((1 << 24) - 2) / 32),
        "{}",
        doc[0]
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}
