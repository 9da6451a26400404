#!/usr/bin/env python3
"""A plain numpy forward (float64) of the toy families, written from the architecture facts that
test_support's `families` module lists, compared with llama.cpp's recorded fixtures.

It is the families' layout stated as code, and evidence that the facts are the ones llama.cpp
applies: it agrees with every fixture to about 1e-6 of the largest logit, except gemma3 (about
1e-4), because llama.cpp's CPU GELU rounds its input to f16 and reads an f16 table; `gelu_f16`
emulates that and brings gemma3 to about 2e-6.

  pip install numpy gguf
  cargo run -p test_support --example write-toy-ggufs -- /tmp/toys
  python3 scripts/toy-forward-reference.py /tmp/toys model/tests/fixtures/llamacpp [gelu_f16]
"""
import json, sys, math
import numpy as np
from gguf import GGUFReader

def load(path):
    r = GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        try: meta[k] = f.contents()
        except Exception: pass
    t = {x.name: np.array(x.data, dtype=np.float64).reshape(list(reversed([int(d) for d in x.shape]))) for x in r.tensors}
    return meta, t

def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

def rope(x, pos, n_rot, base, neox, factors):
    # x: [T, H, D]
    out = x.copy()
    i = np.arange(n_rot // 2)
    inv = base ** (-2.0 * i / n_rot)
    if factors is not None:
        inv = inv / factors
    ang = pos[:, None] * inv[None, :]  # T, n_rot/2
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2 : n_rot]
        out[..., : n_rot // 2] = a * c - b * s
        out[..., n_rot // 2 : n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * c - b * s
        out[..., 1:n_rot:2] = a * s + b * c
    return out

def forward(path, tokens, opts=()):
    m, t = load(path)
    a = m["general.architecture"]
    g = lambda k, d=None: m.get(f"{a}.{k}", d)
    dim, nl, nh, nkv = g("embedding_length"), g("block_count"), g("attention.head_count"), g("attention.head_count_kv")
    hd = g("attention.key_length", dim // nh); n_rot = g("rope.dimension_count", hd)
    eps = g("attention.layer_norm_rms_epsilon"); base = g("rope.freq_base", 10000.0)
    window = g("attention.sliding_window")
    neox = a != "llama"
    T = len(tokens); pos = np.arange(T, dtype=np.float64)
    x = t["token_embd.weight"][tokens]
    if a == "gemma3":
        x = x * math.sqrt(dim)
    factors = t.get("rope_freqs.weight")
    out_w = t.get("output.weight", t["token_embd.weight"])
    for l in range(nl):
        p = f"blk.{l}."
        W = lambda n: t[p + n]
        # gemma3: every layer but each sixth is local (llama.cpp's default pattern of 6), with
        # rope base 10000 (llama.cpp's default local base) instead of rope.freq_base.
        swa = a == "gemma3" and window and (l % 6 < 5)
        lbase = 10000.0 if swa else base
        h = rms(x, W("attn_norm.weight"), eps)
        if p + "attn_qkv.weight" in t:
            qkv = h @ W("attn_qkv.weight").T
            q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=1)
        else:
            q, k, v = h @ W("attn_q.weight").T, h @ W("attn_k.weight").T, h @ W("attn_v.weight").T
            if p + "attn_q.bias" in t:
                q, k, v = q + W("attn_q.bias"), k + W("attn_k.bias"), v + W("attn_v.bias")
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if p + "attn_q_norm.weight" in t:
            q, k = rms(q, W("attn_q_norm.weight"), eps), rms(k, W("attn_k_norm.weight"), eps)
        q, k = rope(q, pos, n_rot, lbase, neox, factors), rope(k, pos, n_rot, lbase, neox, factors)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        mask = np.tril(np.ones((T, T), bool))
        if swa:
            d = pos[:, None] - pos[None, :]
            mask &= d < window
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd) @ W("attn_output.weight").T
        if p + "post_attention_norm.weight" in t:
            o = rms(o, W("post_attention_norm.weight"), eps)
        x = x + o
        h = rms(x, W("ffn_norm.weight"), eps)
        if p + "ffn_gate.weight" in t:
            gt, up = h @ W("ffn_gate.weight").T, h @ W("ffn_up.weight").T
        else:
            gt, up = np.split(h @ W("ffn_up.weight").T, 2, axis=1)
        if a == "gemma3":
            act = gelu_tanh(gt)
            if "gelu_f16" in opts:
                act = gelu_tanh(gt.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
        else:
            act = gt / (1 + np.exp(-gt))
        f = (act * up) @ W("ffn_down.weight").T
        if p + "post_ffw_norm.weight" in t:
            f = rms(f, W("post_ffw_norm.weight"), eps)
        x = x + f
    x = rms(x, t["output_norm.weight"], eps)
    return x @ out_w.T

if __name__ == "__main__":
    toys, fixtures = sys.argv[1], sys.argv[2]
    opts = sys.argv[3:]
    for fam in ["llama", "llama3", "mistral", "qwen2", "qwen3", "gemma3", "phi3"]:
        with open(f"{fixtures}/{fam}.json") as f:
            fx = json.load(f)
        logits = forward(f"{toys}/{fam}.gguf", fx["tokens"], opts)
        worst = 0
        for p, row in zip(fx["positions"], fx["logits"]):
            row = np.array(row)
            worst = max(worst, np.abs(logits[p] - row).max() / np.abs(row).max())
        print(f"{fam:8s} max |numpy - llama.cpp| / max|logit| = {worst:.2e}")
