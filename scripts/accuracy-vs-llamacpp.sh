#!/usr/bin/env bash
# Quantized accuracy of htpkv beside llama.cpp's own quantizations, in one run on the same text and
# the same positions, printed as one JSON object.
#
# Usage: scripts/accuracy-vs-llamacpp.sh <llama.cpp bin dir> <model.gguf> <text file>
#   <llama.cpp bin dir>  holds llama-quantize and llama-perplexity (built outside this repository)
#   <text file>          at least 1024 tokens (llama-perplexity's minimum for -c 512), e.g.
#                        ref_backend/examples/data/heldout.txt (public-domain texts)
#   <model.gguf>         the model; llama.cpp's reference is its F32 requantization (the dequantized
#                        weights, which are also what htpkv's f32 forward computes with); any
#                        architecture both read (e.g. SmolLM2-135M-Instruct, Gemma 3 270M)
# Environment: CONFIGS ("KV:WEIGHTS ...", default "u16:i8 u16:i8f16 u8:i8 f16:i8 u16:i4 u16:f16"), PEERS ("Q8_0 Q4_K_M Q4_0"),
# THREADS (2), HTPKV (an htpkv binary to run; default: this tree's, built with cargo --release),
# WORK (a scratch directory; default: a new one under /tmp; GGUF files llama-quantize already
# wrote there are reused), HTPKV_ISA (htpkv's kernel; every kernel is exact, so the scores
# do not depend on it). The JSON records the CPU model, the load average before the run, the kernel
# asked for, llama.cpp's build options (its CMakeCache.txt) and every file's size in bytes (the
# GGUF files llama-quantize wrote; htpkv's compiled file of each configuration).
#
# Positions: llama-perplexity --kl-divergence scores positions n_ctx/2 .. n_ctx-2 of each chunk; with
# -c 512 --chunks 1 that is positions 256..510 of the text's first 512 tokens, and `htpkv eval
# --tokens 511 --skip 256` scores exactly those. Both tokenize the whole text the same way (the
# GGUF's tokenizer and its add-BOS flag).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,/^set -e/{/^#/p}' "$0" >&2; exit 2; }
bin=$1 model=$2 text=$3
threads=${THREADS:-2}
configs=${CONFIGS:-"u16:i8 u16:i8f16 u8:i8 f16:i8 u16:i4 u16:f16"}
peers=${PEERS:-"Q8_0 Q4_K_M Q4_0"}
work=${WORK:-$(mktemp -d /tmp/htpkv-acc-XXXXXX)}
mkdir -p "$work"
for tool in llama-quantize llama-perplexity; do
    [ -x "$bin/$tool" ] || { echo "not an executable: $bin/$tool" >&2; exit 2; }
done
for f in "$model" "$text"; do [ -f "$f" ] || { echo "no such file: $f" >&2; exit 2; }; done
model=$(realpath "$model") text=$(realpath "$text")

# shellcheck source=scripts/machine-facts.sh
. "$(dirname "$0")/machine-facts.sh"
machine_facts "$bin"
size() { stat -c %s "$1"; }
quantize() { [ -s "$2" ] || "$bin/llama-quantize" --allow-requantize "$1" "$2" "$3" >/dev/null 2>&1; }
ppl() { "$bin/llama-perplexity" -t "$threads" -c 512 -b 512 --chunks 1 -f "$text" "$@" 2>&1; }
quantize "$model" "$work/f32.gguf" F32
ppl -m "$work/f32.gguf" --kl-divergence-base "$work/base.kld" >"$work/base.log"
peer_json="{}"
for q in $peers; do
    quantize "$work/f32.gguf" "$work/$q.gguf" "$q"
    ppl -m "$work/$q.gguf" --kl-divergence-base "$work/base.kld" --kl-divergence >"$work/$q.log"
    kld=$(grep -m1 '^Mean    KLD:' "$work/$q.log" | awk '{print $3}')
    top=$(grep -m1 '^Same top p:' "$work/$q.log" | awk '{print $4}')
    peer_json=$(Q=$q K=$kld T=$top B=$(size "$work/$q.gguf") P=$peer_json python3 -c 'import json, os
p = json.loads(os.environ["P"])
p[os.environ["Q"]] = {"mean_kl": float(os.environ["K"]), "top1_agreement": float(os.environ["T"]) / 100,
                      "file_bytes": int(os.environ["B"])}
print(json.dumps(p))')
done

cd "$(dirname "$0")/.."
if [ -n "${HTPKV:-}" ]; then
    [ -x "$HTPKV" ] || { echo "not an executable: HTPKV=$HTPKV" >&2; exit 2; }
    htpkv() { "$HTPKV" "$@"; }
else
    cargo build -q --locked --release -p htpkv-cli
    htpkv() { cargo run -q --locked --release -p htpkv-cli -- "$@"; }
fi
ours="{}"
for c in $configs; do
    kv=${c%%:*} w=${c##*:}
    # One cache directory per configuration: what it holds afterwards is that build's file.
    dir="$work/cache-$kv-$w"
    doc=$(HTPKV_CACHE_DIR="$dir" RAYON_NUM_THREADS=$threads htpkv \
        eval --model "$model" --text "$text" --tokens 511 --skip 256 --context 1024 \
        --kv-dtype "$kv" --weights "$w" --json 2>/dev/null)
    bytes=$(find "$dir" -type f -printf '%s\n' | sort -n | tail -1)
    ours=$(C="$kv/$w" D=$doc B=${bytes:-0} O=$ours python3 -c 'import json, os
o = json.loads(os.environ["O"]); d = json.loads(os.environ["D"])
o[os.environ["C"]] = {k: d[k] for k in ("positions", "mean_kl", "top1_agreement", "perplexity", "f32_perplexity")}
o[os.environ["C"]]["file_bytes"] = int(os.environ["B"])
print(json.dumps(o))')
done
build=$(cd "$bin" && (git -C "$(dirname "$(realpath "$bin/llama-perplexity")")" rev-parse --short HEAD 2>/dev/null || echo unknown))
PEER=$peer_json OURS=$ours MODEL=$model TEXT=$text BUILD=$build CPU=$cpu LOAD=$load PEER_ISA=$peer_isa \
    ISA=${HTPKV_ISA:-the CPU best} python3 -c 'import json, os
print(json.dumps({"model": os.environ["MODEL"], "text": os.environ["TEXT"],
                  "cpu": os.environ["CPU"], "load_average_before": os.environ["LOAD"],
                  "htpkv_isa": os.environ["ISA"], "llama_cpp_build_options": os.environ["PEER_ISA"],
                  "positions": "256..510 of the first 512 tokens",
                  "llama_cpp": {"build": os.environ["BUILD"], "against": "its F32 requantization",
                                **json.loads(os.environ["PEER"])},
                  "htpkv": {"against": "the f32 forward (model::FloatModel)", **json.loads(os.environ["OURS"])}},
                 indent=2))'
