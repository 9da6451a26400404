#!/usr/bin/env python3
"""Records llama.cpp's reference outputs as htpkv test fixtures.

Runs llama.cpp through llama-cpp-python (installed outside this repository, e.g. in a venv:
`CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36 numpy`) and writes JSON
fixtures that htpkv's tests compare against without llama.cpp.

  toys DIR OUT          for every DIR/<family>.gguf (from
                        `cargo run -p test_support --example write-toy-ggufs -- DIR`), write
                        OUT/<family>.json: logits at a few positions and the perplexity.
  real NAME GGUF TEXT OUT
                        for a real model (already requantized to F32), write OUT/NAME.json: greedy
                        continuations of three prompts, and the perplexity over the first 512
                        tokens of TEXT with the token ids llama.cpp used.
  f32 IN OUT            requantize IN to F32 with llama.cpp (llama_model_quantize).

Every number is llama.cpp's f32 output: K/V cache in F32, flash attention off, one batch.
"""

import hashlib
import json
import math
import os
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

# The llama.cpp commit each llama-cpp-python release vendors (from its CHANGELOG).
VENDORED = {"0.3.36": "0c1e57098"}

N_TOKENS = 24
POSITIONS = [0, 5, 11, 23]
THREADS = 2
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
GREEDY = 24
HELDOUT_TOKENS = 512


def oracle():
    version = llama_cpp.__version__
    commit = os.environ.get("LLAMACPP_COMMIT") or VENDORED.get(version)
    if commit is None:
        sys.exit(f"llama-cpp-python {version}: its llama.cpp commit is unknown; set LLAMACPP_COMMIT")
    return {"llama_cpp_commit": commit, "llama_cpp_python": version}


def load(path, n_ctx):
    return Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        flash_attn=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        swa_full=True,
        verbose=False,
    )


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def splitmix64(seed):
    """The same generator as test_support's toys, seeded by a number."""
    state = seed & (2**64 - 1)
    while True:
        state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        yield z ^ (z >> 31)


def toy_tokens(llm):
    """BOS, then N_TOKENS - 1 ids drawn uniformly from the normal (non-special) tokens."""
    vocab = llm._model
    normal = [
        t for t in range(llm.n_vocab())
        if llama_cpp.llama_vocab_get_attr(llama_cpp.llama_model_get_vocab(vocab.model), t)
        & llama_cpp.LLAMA_TOKEN_ATTR_NORMAL
    ]
    rng = splitmix64(2026)
    return [llm.token_bos()] + [normal[next(rng) % len(normal)] for _ in range(N_TOKENS - 1)]


def run(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def nll(logits, tokens):
    """-log p(tokens[i+1] | tokens[..=i]) for every i, in float64 from f32 logits."""
    out = []
    for i in range(len(tokens) - 1):
        row = logits[i].astype(np.float64)
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        out.append(lse - row[tokens[i + 1]])
    return out


def f32s(row):
    return [float(str(np.float32(x))) for x in row]


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def toys(src, out):
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        if not name.endswith(".gguf"):
            continue
        family, path = name[:-5], os.path.join(src, name)
        llm = load(path, 64)
        tokens = toy_tokens(llm)
        logits = run(llm, tokens)
        losses = nll(logits, tokens)
        std = float(logits.std(axis=1).mean())
        if std < 2.0:
            sys.exit(f"{path}: logits too flat (mean std {std:.2f})")
        write_json(os.path.join(out, f"{family}.json"), {
            "family": family,
            **oracle(),
            "gguf_sha256": sha256(path),
            "n_vocab": llm.n_vocab(),
            "context": llm.n_ctx(),
            "tokens": tokens,
            "positions": POSITIONS,
            "logits": [f32s(logits[p]) for p in POSITIONS],
            "mean_logit_std": round(std, 3),
            "perplexity": math.exp(sum(losses) / len(losses)),
        })
        llm.close()


def greedy(llm, prompt):
    ids = llm.tokenize(prompt.encode(), add_bos=llm._model.add_bos_token(), special=False)
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(GREEDY):
        nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
        out.append(nxt)
        llm.eval([nxt])
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    return {"prompt": prompt, "prompt_tokens": ids, "tokens": out, "text": text}


def real(name, path, text_path, out):
    llm = load(path, 1024)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    add_bos = llm._model.add_bos_token()
    ids = llm.tokenize(text.encode(), add_bos=add_bos, special=False)[:HELDOUT_TOKENS]
    losses = nll(run(llm, ids), ids)
    runs = [greedy(llm, p) for p in PROMPTS]
    write_json(os.path.join(out, f"{name}.json"), {
        "model": name,
        **oracle(),
        "gguf": os.path.basename(path),
        "gguf_sha256": sha256(path),
        "greedy": runs,
        "heldout": {
            "text": os.path.basename(text_path),
            "bos_added": add_bos,
            "tokens": ids,
            "nll": [round(x, 6) for x in losses],
            "perplexity": math.exp(sum(losses) / len(losses)),
        },
    })
    llm.close()


def f32(src, dst):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = THREADS
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        sys.exit(f"llama_model_quantize failed on {src}")


def main(argv):
    commands = {"toys": (toys, 2), "real": (real, 4), "f32": (f32, 2)}
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        sys.exit(__doc__)
    fn, _ = commands[argv[0]]
    fn(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
