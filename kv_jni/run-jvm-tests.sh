#!/usr/bin/env bash
# Runs the Java API of htpkv in a real JVM: builds libkv_jni (and the htpkv CLI, the oracle for the
# generated text) in the workspace's dev profile, compiles the Java sources and the test program
# with javac, and runs it against stories260K through the reference backend and through the qnn
# backend (by default with the reference backend's QNN library, libhtpkv_ref_qnn.so, built here),
# and against test_support's toy Gemma 3 GGUF (written by its write-toy-ggufs example).
# The last line is "N passed, N failed, N skipped"; the exit code is non-zero on failure.
#
# Environment: HTPKV_MODEL_DIR (default: the embedded <workspace>/models/stories260K);
# HTPKV_QNN_BACKEND (a QNN backend library for the qnn tests; unset: build and use
# libhtpkv_ref_qnn.so; `none`: skip the qnn tests) and HTPKV_QNN_SYSTEM; JAVA_OPTS (extra JVM flags).
# With CI set, any skipped test fails the run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

for tool in cargo javac java; do
    command -v "$tool" >/dev/null || { echo "run-jvm-tests: $tool is required (JDK 17+ for javac/java)" >&2; exit 1; }
done

model_dir="${HTPKV_MODEL_DIR:-$root/models/stories260K}"
qnn_backend="${HTPKV_QNN_BACKEND:-}"
target_dir="$(cargo metadata --format-version 1 --no-deps | grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)"
if [ -n "${CI:-}" ]; then
    # CI's test step has built the libraries with the workspace's features (`cargo test
    # --workspace`); a `-p` build resolves features differently and would rebuild half the
    # workspace. Take that build's artifacts (cargo rebuilds nothing it finds fresh).
    echo "run-jvm-tests: the libraries of the workspace's test build (CI)"
    built=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null)
    artifact() {
        jq -r --arg t "$1" 'select(.reason == "compiler-artifact" and .target.name == $t
            and .profile.test == false) | .filenames[] | select(test("\\.(so|dylib)$"))' <<<"$built"
    }
    lib=$(artifact kv_jni)
    toys=$(jq -r 'select(.reason == "compiler-artifact" and .target.name == "write-toy-ggufs")
        | .executable // empty' <<<"$built")
    if [ -z "$qnn_backend" ]; then qnn_backend=$(artifact htpkv_ref_qnn); fi
else
    packages=(-p kv_jni -p htpkv-cli)
    if [ -z "$qnn_backend" ]; then packages+=(-p ref_backend_qnn); fi
    echo "run-jvm-tests: cargo build ${packages[*]} (dev profile)"
    cargo build "${packages[@]}"
    cargo build -p test_support --example write-toy-ggufs
    toys="$target_dir/debug/examples/write-toy-ggufs"
    case "$(uname -s)" in
        Darwin) lib="$target_dir/debug/libkv_jni.dylib" ;;
        *) lib="$target_dir/debug/libkv_jni.so" ;;
    esac
    if [ -z "$qnn_backend" ]; then
        case "$(uname -s)" in
            Darwin) qnn_backend="$target_dir/debug/libhtpkv_ref_qnn.dylib" ;;
            *) qnn_backend="$target_dir/debug/libhtpkv_ref_qnn.so" ;;
        esac
    fi
fi
[ -f "$lib" ] || { echo "run-jvm-tests: $lib was not built" >&2; exit 1; }
[ -x "$target_dir/debug/htpkv" ] || { echo "run-jvm-tests: no $target_dir/debug/htpkv" >&2; exit 1; }

classes="$(mktemp -d)"
trap 'rm -rf "$classes"' EXIT
echo "run-jvm-tests: javac"
javac -Xlint:all -Werror -encoding UTF-8 -d "$classes" \
    "$here"/java/org/htpkv/*.java "$here"/java-test/org/htpkv/*.java

# The toy GGUF files of test_support (the toy Gemma 3 among them), written for this run.
[ -x "$toys" ] || { echo "run-jvm-tests: write-toy-ggufs was not built" >&2; exit 1; }
"$toys" "$classes/toys" >/dev/null

args=(--model-dir "$model_dir" --cli "$target_dir/debug/htpkv" --config "$root/configs/stories260K.yaml"
    --toy-dir "$classes/toys")
if [ "$qnn_backend" != none ]; then
    args+=(--qnn-backend "$qnn_backend")
    if [ -n "${HTPKV_QNN_SYSTEM:-}" ]; then args+=(--qnn-system "$HTPKV_QNN_SYSTEM"); fi
fi

echo "run-jvm-tests: java org.htpkv.JvmTest"
# -Xcheck:jni makes the JVM verify every JNI call the native code makes. Panics are turned into
# exceptions by design (one test makes one): keep their report short.
# shellcheck disable=SC2086
set +e
RUST_BACKTRACE=0 java -Xcheck:jni ${JAVA_OPTS:-} -Dhtpkv.jni.library="$lib" -cp "$classes" org.htpkv.JvmTest "${args[@]}" \
    | tee "$classes/report.txt"
status=${PIPESTATUS[0]}
set -e
# A skip follows the tests' one rule (test_support's fetched files): it says why, and in CI, which
# provides the model and the libraries, it is a failure.
if [ -n "${CI:-}" ] && grep -q '^skip ' "$classes/report.txt"; then
    echo "run-jvm-tests: tests were skipped, and CI is set: what they need must be there in CI" >&2
    exit 1
fi
exit "$status"
