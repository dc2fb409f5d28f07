#!/usr/bin/env python3
"""Writes tests/golden/gguf/quants.gguf: for each GGUF tensor type zof reads (F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q4_K, Q6_K), a tensor of random blocks named by the type ("Q4_K") and beside it
"<type>.expected", the F32 values gguf-py's gguf.quants.dequantize gives for them: the oracle
tests/unit/test_gguf.cpp compares zof's dequantization with, bit for bit.

The blocks are random bytes whose scale fields (the fp16 d, m, dmin) are random finite fp16
values of every exponent, negative and subnormal ones included, so every nibble, every 6-bit scale
and min of Q4_K and every int8 scale of Q6_K occurs; Q8_0, Q4_0 and Q4_1 also get blocks that
gguf-py's own quantize() made from normal data. F32/F16/BF16 are random finite values.

    build/venv/bin/python tests/reference/make_gguf_golden.py [--out FILE] [--elements N] [--seed S]

Deterministic for a given gguf and numpy version (recorded in the file's metadata).
"""
import argparse
import pathlib

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

# Where each type's fp16 scales sit in its block (byte offsets).
SCALES = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q4_K: [0, 2], Q.Q6_K: [208]}


def finite_f16(rng, n):
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    bad = (bits & 0x7C00) == 0x7C00  # Inf or NaN: exponent all ones
    bits[bad] &= np.uint16(0xBFFF)    # clear the exponent's top bit: a finite value
    return bits


def random_blocks(rng, qtype, n_blocks):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint16).astype(np.uint8)
    for at in SCALES[qtype]:
        raw[:, at:at + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = pathlib.Path(__file__).resolve().parents[2]
    ap.add_argument("--out", default=str(root / "tests/golden/gguf/quants.gguf"))
    ap.add_argument("--elements", type=int, default=4096, help="per type (a multiple of 512)")
    ap.add_argument("--seed", type=int, default=20260530)
    a = ap.parse_args()
    assert a.elements % 512 == 0
    rng = np.random.default_rng(a.seed)
    from importlib.metadata import version
    w = gguf.GGUFWriter(a.out, arch="zof-dequantize-golden")
    w.add_string("zof.gguf_version", version("gguf"))
    w.add_string("zof.numpy_version", np.__version__)
    n = a.elements
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K):
        if qtype == Q.F32:
            bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
            bits[(bits & 0x7F800000) == 0x7F800000] &= np.uint32(0xBFFFFFFF)
            raw = bits.view(np.uint8).reshape(n // 64, 256)
        elif qtype == Q.F16:
            raw = finite_f16(rng, n).view(np.uint8).reshape(n // 64, 128)
        elif qtype == Q.BF16:
            bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xBFFF)
            raw = bits.view(np.uint8).reshape(n // 64, 128)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            blocks = random_blocks(rng, qtype, n // block)
            if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):  # half of them from gguf-py's own quantizer
                half = n // block // 2
                x = rng.standard_normal(half * block).astype(np.float32) * 0.05
                blocks[:half] = gguf.quants.quantize(x.reshape(-1, block), qtype).reshape(half, size)
            raw = blocks.reshape(n // 256, -1)
        expected = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)
        assert expected.size == n and np.isfinite(expected).all(), qtype.name
        w.add_tensor(qtype.name, raw, raw_dtype=qtype)
        w.add_tensor(qtype.name + ".expected", expected.reshape(n // 256, 256))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %d elements of each of 8 types" % (a.out, n))


if __name__ == "__main__":
    main()
