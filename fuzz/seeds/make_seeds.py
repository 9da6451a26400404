#!/usr/bin/env python3
"""Writes the seed inputs of the chat_template, gguf_model and hf_folder fuzz targets into
fuzz/corpus/<target>/ (run from anywhere; deterministic). A tiny Llama (2 layers, dim 16, 4 heads,
2 KV heads, FFN 24, vocabulary 32, tied output) as GGUF and as a Hugging Face folder, valid and with
each disagreement issue 21 found: fewer or more layers than the tensors, an unknown tensor, a tensor
in two shards, a NaN weight, partial RoPE, hostile chat templates."""
import json, math, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")
L, D, H, KV, HD, F, V, CTX = 2, 16, 4, 2, 4, 24, 32, 16


def tensors(layers=L, nan=None):
    """(hf_name, gguf_name, shape outermost first, values) of every tensor."""
    out = []
    seed = [1]

    def vals(n):
        v = []
        for _ in range(n):
            seed[0] = (seed[0] * 1103515245 + 12345) % (1 << 31)
            v.append((seed[0] / (1 << 31) - 0.5) * 0.2)
        return v

    def add(hf, gg, shape):
        out.append((hf, gg, shape, vals(math.prod(shape))))

    add("model.embed_tokens.weight", "token_embd.weight", [V, D])
    for l in range(layers):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        add(p + "input_layernorm.weight", g + "attn_norm.weight", [D])
        add(p + "self_attn.q_proj.weight", g + "attn_q.weight", [H * HD, D])
        add(p + "self_attn.k_proj.weight", g + "attn_k.weight", [KV * HD, D])
        add(p + "self_attn.v_proj.weight", g + "attn_v.weight", [KV * HD, D])
        add(p + "self_attn.o_proj.weight", g + "attn_output.weight", [D, H * HD])
        add(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", [D])
        add(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", [F, D])
        add(p + "mlp.up_proj.weight", g + "ffn_up.weight", [F, D])
        add(p + "mlp.down_proj.weight", g + "ffn_down.weight", [D, F])
    add("model.norm.weight", "output_norm.weight", [D])
    if nan is not None:
        out[nan][3][1] = float("nan")
    return out


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(meta, ts):
    b = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(meta))
    for k, ty, v in meta:
        b += gstr(k) + struct.pack("<I", ty)
        if ty == 4:
            b += struct.pack("<I", v)
        elif ty == 6:
            b += struct.pack("<f", v)
        elif ty == 8:
            b += gstr(v)
    off, datas = 0, []
    for _, name, shape, values in ts:
        b += gstr(name) + struct.pack("<I", len(shape))
        b += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        b += struct.pack("<IQ", 0, off)
        data = struct.pack(f"<{len(values)}f", *values)
        datas.append(data)
        off += (len(data) + 31) // 32 * 32
    b += bytes((-len(b)) % 32)
    for data in datas:
        b += data + bytes((-len(data)) % 32)
    return b


def meta(blocks=L, extra=()):
    m = [
        ("general.architecture", 8, "llama"),
        ("llama.block_count", 4, blocks),
        ("llama.embedding_length", 4, D),
        ("llama.attention.head_count", 4, H),
        ("llama.attention.head_count_kv", 4, KV),
        ("llama.feed_forward_length", 4, F),
        ("llama.context_length", 4, CTX),
        ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        ("llama.rope.freq_base", 6, 10000.0),
    ]
    return m + list(extra)


def safetensors(ts):
    header, data = {}, b""
    for name, _, shape, values in ts:
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def folder(files):
    """The hf_folder target's encoding: name index, u32 length, bytes."""
    names = ["config.json", "tokenizer.json", "tokenizer_config.json",
             "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
             "model-00003-of-00003.safetensors"]
    out = b""
    for name, body in files:
        out += bytes([names.index(name)]) + struct.pack("<I", len(body)) + body
    return out


def config(**over):
    c = {"model_type": "llama", "hidden_size": D, "num_attention_heads": H,
         "num_key_value_heads": KV, "num_hidden_layers": L, "intermediate_size": F,
         "vocab_size": V, "max_position_embeddings": CTX, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
    c.update(over)
    return json.dumps(c).encode()


TOKENIZER = json.dumps({
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "unk_token": "<unk>",
              "vocab": {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "Once", "upon", "a", "time"]
                                                   + [f"w{i}" for i in range(25)])}},
}).encode()

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE = "{% for i in range(100000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}"
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    ts = tensors()
    write("gguf_model", "valid", gguf(meta(), ts))
    write("gguf_model", "block_count_below_layers", gguf(meta(blocks=1), ts))
    write("gguf_model", "block_count_1000", gguf(meta(blocks=1000), ts))
    write("gguf_model", "unknown_tensor", gguf(meta(), ts + [("x", "blk.0.mystery.weight", [2], [0.0, 0.0])]))
    write("gguf_model", "nan_weight", gguf(meta(), tensors(nan=5)))
    write("gguf_model", "partial_rope", gguf(meta(extra=[("llama.rope.dimension_count", 4, 2)]), ts))
    write("gguf_model", "rope_dim_2_pow_30", gguf(meta(extra=[("llama.rope.dimension_count", 4, 1 << 30)]), ts))
    write("gguf_model", "looping_template", gguf(meta(extra=[("tokenizer.chat_template", 8, LOOP)]), ts))

    shard1 = [t for t in ts if not t[0].startswith("model.layers.1.")]
    shard2 = [t for t in ts if t[0].startswith("model.layers.1.")]
    base = [("config.json", config()), ("tokenizer.json", TOKENIZER),
            ("model-00001-of-00003.safetensors", safetensors(shard1)),
            ("model-00002-of-00003.safetensors", safetensors(shard2))]
    write("hf_folder", "valid", folder(base))
    write("hf_folder", "chat_template", folder(base + [
        ("tokenizer_config.json", json.dumps({"chat_template": CHATML}).encode())]))
    write("hf_folder", "looping_template", folder(base + [
        ("tokenizer_config.json", json.dumps({"chat_template": LOOP}).encode())]))
    write("hf_folder", "fewer_layers", folder([("config.json", config(num_hidden_layers=1))] + base[1:]))
    write("hf_folder", "repeated_tensor", folder(base + [
        ("model-00003-of-00003.safetensors", safetensors([ts[-1]]))]))
    write("hf_folder", "unknown_tensor", folder(base + [
        ("model-00003-of-00003.safetensors", safetensors([("model.mystery", "", [2], [0.0, 0.0])]))]))
    nan = tensors(nan=3)
    write("hf_folder", "nan_weight", folder(base[:2] + [
        ("model-00001-of-00003.safetensors", safetensors([t for t in nan if not t[0].startswith("model.layers.1.")])),
        base[3]]))
    write("hf_folder", "partial_rotary_factor", folder([("config.json", config(partial_rotary_factor=0.5))] + base[1:]))
    write("hf_folder", "config_not_json", folder([("config.json", b"{")] + base[1:]))

    msgs = b"\0".join([b"What is the capital of France?", b"Paris.", b"And of Italy?"])
    for name, t in [("chatml", CHATML), ("looping", LOOP), ("huge_output", HUGE),
                    ("raise", "{{ raise_exception('no system message') }}"),
                    ("syntax_error", "{% for %}"),
                    ("recursive_macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                    ("items_and_methods", "{% for m in messages %}{{ m.items() | list | length }}"
                                          "{{ m.content.upper().split(' ') | join('_') }}{% endfor %}")]:
        write("chat_template", name, t.encode() + b"\0" + msgs)


main()
