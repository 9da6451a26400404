#!/usr/bin/env python3
"""Writes the dequantization fixtures of model/src/gguf_file/types/tests.rs: random but valid blocks of
each quantized ggml type htpkv reads, dequantized by llama.cpp's own Python package `gguf`
(`gguf.quants.dequantize`, numpy), the independent oracle for htpkv's Rust dequantizers.

Usage: python3 scripts/gguf-dequant-fixtures.py [OUT_DIR]
  (default OUT_DIR: model/src/gguf_file/types/fixtures next to this script's repository root)
Needs: pip install gguf==0.19.0 numpy   (the committed fixtures were made with gguf 0.19.0 and
numpy 2.4.6; SOURCE.txt in OUT_DIR records the versions used). The output is a function of the
seed alone, so a rerun with the same versions reproduces the committed files byte for byte.

One file per type, `<type>.bin`, little-endian:
  u32 ggml type id, u32 elements per block, u32 bytes per block, u32 block count n  (gguf's values)
  n blocks as stored in a GGUF file
  n × elements-per-block f32: gguf's dequantization of those blocks

The blocks: every byte is random except the f16 fields (d, and dmin or m where the type has one),
which run through extreme values first (±0, the smallest and largest subnormals, the smallest
normal, 1, ±65504, ±inf, NaN), then random finite ones. In the first 16 blocks the non-f16 bytes
are those of the first block XORed with 0x00, 0x11, ..., 0xFF, so at every byte position each
nibble takes all 16 values and each bit both, whatever field (quants, high bits, packed scales)
the position belongs to.
"""

import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20260937

# type -> (block count, byte offsets of its f16 fields)
TYPES = {
    T.Q4_0: (48, [0]),
    T.Q4_1: (48, [0, 2]),
    T.Q5_0: (48, [0]),
    T.Q5_1: (48, [0, 2]),
    T.Q8_0: (48, [0]),
    T.Q2_K: (24, [80, 82]),
    T.Q3_K: (24, [108]),
    T.Q4_K: (24, [0, 2]),
    T.Q5_K: (24, [0, 2]),
    T.Q6_K: (24, [208]),
}

SPECIAL_F16 = [
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal
    0x83FF,  # largest subnormal, negative
    0x0400,  # smallest normal
    0x3C00,  # 1
    0x7BFF,  # 65504
    0xFBFF,  # -65504
    0x7C00,  # +inf
    0xFC00,  # -inf
    0x7E00,  # NaN
]


def random_finite_f16(rng):
    while True:
        v = int(rng.integers(0, 1 << 16))
        if (v >> 10) & 0x1F != 0x1F:
            return v


def blocks_for(qtype, rng):
    n, f16_at = TYPES[qtype]
    _, size = GGML_QUANT_SIZES[qtype]
    base = rng.integers(0, 256, size=size, dtype=np.uint8)
    out = []
    for k in range(n):
        if k < 16:
            b = base ^ np.uint8(0x11 * k)
        else:
            b = rng.integers(0, 256, size=size, dtype=np.uint8)
        b = bytearray(b.tobytes())
        for i, off in enumerate(f16_at):
            # The second field runs through the specials shifted, so d and dmin/m differ.
            s = k + 5 * i
            v = SPECIAL_F16[s] if s < len(SPECIAL_F16) else random_finite_f16(rng)
            b[off : off + 2] = struct.pack("<H", v)
        out.append(bytes(b))
    return b"".join(out)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "model/src/gguf_file/types/fixtures")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype in TYPES:
        elems, size = GGML_QUANT_SIZES[qtype]
        raw = blocks_for(qtype, rng)
        n = len(raw) // size
        with np.errstate(all="ignore"):  # inf · 0 and NaN scales are part of the test
            values = gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        values = np.asarray(values, dtype="<f4").reshape(-1)
        assert values.size == n * elems, (qtype.name, values.size)
        header = struct.pack("<4I", int(qtype), elems, size, n)
        path = os.path.join(out_dir, f"{qtype.name.lower()}.bin")
        with open(path, "wb") as f:
            f.write(header + raw + values.tobytes())
    with open(os.path.join(out_dir, "SOURCE.txt"), "w") as f:
        f.write(
            "Made by scripts/gguf-dequant-fixtures.py (seed {}) with gguf {} and numpy {}.\n"
            "Format and block contents: see the script's docstring.\n".format(
                SEED, gguf_version(), np.__version__
            )
        )


def gguf_version():
    from importlib.metadata import version

    return version("gguf")


if __name__ == "__main__":
    main()
