#!/usr/bin/env bash
# Decode and prefill speed of htpkv's reference executor against llama.cpp, measured in one run
# on the same machine with the same thread count, printed as one JSON object.
#
# Usage: scripts/bench-vs-llamacpp.sh <llama-bench binary> <model.gguf> [<peer.gguf>]
#   <model.gguf>  what decode_bench compiles (i8 weights by default: WEIGHTS=i8|f16|f32)
#   <peer.gguf>   what llama-bench runs (default: the same file); for the i8 comparison give
#                 llama.cpp's Q8_0 requantization of the model:
#                 llama-quantize --allow-requantize model.Q4_1.gguf model.Q8_0.gguf Q8_0
# Environment: THREADS (2), KV (u16), WEIGHTS (i8), PROMPT (128), TOKENS (128), CONTEXT (2048),
# REPS (3: decode_bench's runs, whose medians it reports, and llama-bench's repetitions),
# HTPKV_ISA (htpkv's kernel: avx512, avxvnni, avx2, sse41 or portable; default the CPU's best),
# DECODE_BENCH (a decode_bench binary to run; default: this tree's, built with cargo --release).
# The JSON records the CPU model, the load average before the run, the kernel htpkv ran and the
# x86 options llama.cpp was built with (read from the CMakeCache.txt of its build directory, so
# a like-for-like pair is visible: e.g. HTPKV_ISA=avx2 against a build with GGML_AVX512=OFF).
# llama.cpp must be built outside this repository (see docs/measurements/speed.md).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -e/{/^#/p}' "$0" >&2; exit 2; }
peer_bin=$1 model=$2 peer_model=${3:-$2}
threads=${THREADS:-2} kv=${KV:-u16} weights=${WEIGHTS:-i8}
prompt=${PROMPT:-128} tokens=${TOKENS:-128} context=${CONTEXT:-2048} reps=${REPS:-3}
[ -x "$peer_bin" ] || { echo "not an executable: $peer_bin" >&2; exit 2; }
for f in "$model" "$peer_model"; do [ -e "$f" ] || { echo "no such model: $f" >&2; exit 2; }; done

peer_bin=$(realpath "$peer_bin")
# shellcheck source=scripts/machine-facts.sh
. "$(dirname "$0")/machine-facts.sh"
machine_facts "$(dirname "$peer_bin")"

cd "$(dirname "$0")/.."
if [ -n "${DECODE_BENCH:-}" ]; then
    [ -x "$DECODE_BENCH" ] || { echo "not an executable: DECODE_BENCH=$DECODE_BENCH" >&2; exit 2; }
    bench() { "$DECODE_BENCH" "$@"; }
else
    cargo build --release --example decode_bench >&2
    bench() { cargo run -q --release --example decode_bench -- "$@"; }
fi
ours=$(RAYON_NUM_THREADS=$threads bench \
    --model "$model" --json --kv-dtype "$kv" --weights "$weights" \
    --context "$context" --prompt "$prompt" --tokens "$tokens" --runs "$reps")
# The same work as decode_bench: prefill of the prompt from an empty context, then decode with
# the prompt already in the cache (llama-bench's --n-depth; without it llama.cpp would decode
# from an empty context, which is faster).
peer_pp=$("$peer_bin" -m "$peer_model" -t "$threads" -r "$reps" -p "$prompt" -n 0 -o json)
# llama-bench builds before --n-depth (early 2025) refuse -d: they decode from an empty context
# (reported as decode_depth 0), which favours llama.cpp.
peer_tg=$("$peer_bin" -m "$peer_model" -t "$threads" -r "$reps" -p 0 -n "$tokens" -d "$prompt" -o json 2>/dev/null) ||
    peer_tg=$("$peer_bin" -m "$peer_model" -t "$threads" -r "$reps" -p 0 -n "$tokens" -o json)
peer=$(PP=$peer_pp TG=$peer_tg python3 -c 'import json, os; print(json.dumps(json.loads(os.environ["PP"]) + json.loads(os.environ["TG"])))')

OURS=$ours PEER=$peer PEER_MODEL=$peer_model CPU=$cpu LOAD=$load PEER_ISA=$peer_isa python3 - <<'PY'
import json, os
ours = json.loads(os.environ["OURS"])
peer = json.loads(os.environ["PEER"])
def rate(kind):
    # llama-bench: one entry per test; prompt tests have n_gen 0, generation tests n_prompt 0.
    for t in peer:
        if (kind == "pp" and t["n_gen"] == 0) or (kind == "tg" and t["n_prompt"] == 0):
            return t["avg_ts"]
    raise SystemExit(f"llama-bench reported no {kind} test")
pp, tg = rate("pp"), rate("tg")
print(json.dumps({
    "cpu": os.environ["CPU"],
    "load_average_before": os.environ["LOAD"],
    "htpkv_isa": ours.get("isa"),
    "llama_cpp_build_options": os.environ["PEER_ISA"],
    "htpkv": ours,
    "llama_cpp": {"model": os.environ["PEER_MODEL"], "threads": peer[0]["n_threads"],
                  "prefill_tokens_per_second": pp, "decode_tokens_per_second": tg,
                  "decode_depth": next(t.get("n_depth", 0) for t in peer if t["n_prompt"] == 0),
                  "build": peer[0].get("build_commit"), "cpu_info": peer[0].get("cpu_info")},
    "decode_ratio": ours["decode_tokens_per_second"] / tg,
    "prefill_ratio": ours["prefill_tokens_per_second"] / pp,
}, indent=2))
PY
