#!/usr/bin/env bash
# Quantized accuracy of htpkv beside llama.cpp's own quantizations, in one run on the same text and
# the same positions, printed as one JSON object.
#
# Usage: scripts/accuracy-vs-llamacpp.sh <llama.cpp bin dir> <model.gguf> <text file>
#   <llama.cpp bin dir>  holds llama-quantize and llama-perplexity (built outside this repository)
#   <text file>          at least 1024 tokens (llama-perplexity's minimum for -c 512), e.g.
#                        ref_backend/examples/data/heldout.txt (public-domain texts)
#   <model.gguf>         the model; llama.cpp's reference is its F32 requantization (the dequantized
#                        weights, which are also what htpkv's f32 forward computes with)
# Environment: CONFIGS ("KV:WEIGHTS ...", default "u16:i8 u16:i8f16 u8:i8 f16:i8 u16:i4 u16:f16"), PEERS ("Q8_0 Q4_K_M Q4_0"),
# THREADS (2), WORK (a scratch directory; default: a new one under /tmp).
#
# Positions: llama-perplexity --kl-divergence scores positions n_ctx/2 .. n_ctx-2 of each chunk; with
# -c 512 --chunks 1 that is positions 256..510 of the text's first 512 tokens, and `htpkv eval
# --tokens 511 --skip 256` scores exactly those. Both tokenize the whole text the same way (the
# GGUF's tokenizer and its add-BOS flag).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
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

ppl() { "$bin/llama-perplexity" -t "$threads" -c 512 -b 512 --chunks 1 -f "$text" "$@" 2>&1; }
"$bin/llama-quantize" --allow-requantize "$model" "$work/f32.gguf" F32 >/dev/null 2>&1
ppl -m "$work/f32.gguf" --kl-divergence-base "$work/base.kld" >"$work/base.log"
peer_json="{}"
for q in $peers; do
    "$bin/llama-quantize" --allow-requantize "$work/f32.gguf" "$work/$q.gguf" "$q" >/dev/null 2>&1
    ppl -m "$work/$q.gguf" --kl-divergence-base "$work/base.kld" --kl-divergence >"$work/$q.log"
    kld=$(grep -m1 '^Mean    KLD:' "$work/$q.log" | awk '{print $3}')
    top=$(grep -m1 '^Same top p:' "$work/$q.log" | awk '{print $4}')
    peer_json=$(Q=$q K=$kld T=$top P=$peer_json python3 -c 'import json, os
p = json.loads(os.environ["P"])
p[os.environ["Q"]] = {"mean_kl": float(os.environ["K"]), "top1_agreement": float(os.environ["T"]) / 100}
print(json.dumps(p))')
done

cd "$(dirname "$0")/.."
cargo build -q --locked --release -p htpkv-cli
ours="{}"
for c in $configs; do
    kv=${c%%:*} w=${c##*:}
    doc=$(HTPKV_CACHE_DIR="$work/cache" RAYON_NUM_THREADS=$threads cargo run -q --locked --release -p htpkv-cli -- \
        eval --model "$model" --text "$text" --tokens 511 --skip 256 --context 1024 \
        --kv-dtype "$kv" --weights "$w" --json 2>/dev/null)
    ours=$(C="$kv/$w" D=$doc O=$ours python3 -c 'import json, os
o = json.loads(os.environ["O"]); d = json.loads(os.environ["D"])
o[os.environ["C"]] = {k: d[k] for k in ("positions", "mean_kl", "top1_agreement", "perplexity", "f32_perplexity")}
print(json.dumps(o))')
done
build=$(cd "$bin" && (git -C "$(dirname "$(realpath "$bin/llama-perplexity")")" rev-parse --short HEAD 2>/dev/null || echo unknown))
PEER=$peer_json OURS=$ours MODEL=$model TEXT=$text BUILD=$build python3 -c 'import json, os
print(json.dumps({"model": os.environ["MODEL"], "text": os.environ["TEXT"],
                  "positions": "256..510 of the first 512 tokens",
                  "llama_cpp": {"build": os.environ["BUILD"], "against": "its F32 requantization",
                                **json.loads(os.environ["PEER"])},
                  "htpkv": {"against": "the f32 forward (model::FloatModel)", **json.loads(os.environ["OURS"])}},
                 indent=2))'
