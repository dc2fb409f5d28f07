"""Counts what a PNG screenshot shows, for tests/model/test_report.cpp: prints one JSON object
with the image size, the fraction of pixels that are not near-white, and the fraction in the
report's first curve colour (#1f77b4). Decodes the PNG itself (zlib + the five filters)."""
import json
import struct
import sys
import zlib

import numpy as np


def average_or_paeth(f, line, prev, bpp):
    cur = [0] * len(line)
    for x, v in enumerate(line):
        a = cur[x - bpp] if x >= bpp else 0
        b = prev[x]
        if f == 3:
            cur[x] = (v + (a + b) // 2) & 255
            continue
        c = prev[x - bpp] if x >= bpp else 0
        pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
        cur[x] = (v + (a if pa <= pb and pa <= pc else (b if pb <= pc else c))) & 255
    return cur


def decode(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG {hdr}"
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), dtype=np.int32)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 1:  # sub: a running sum along the row, per channel
            cur = (np.cumsum(line.reshape(w, bpp), axis=0) & 255).reshape(-1)
        elif f == 2:
            cur = (line + prev) & 255
        else:  # average, paeth: depend on the byte to the left, so byte by byte
            cur = average_or_paeth(f, line.tolist(), prev.tolist(), bpp)
        out[y], prev = cur, np.asarray(cur, dtype=np.int32)
    return out.reshape(h, w, bpp)[:, :, :3]


img = decode(sys.argv[1])
ink = (img < 235).any(axis=2)
blue = (np.abs(img - np.array([0x1f, 0x77, 0xb4])) < 40).all(axis=2)
print(json.dumps({"width": img.shape[1], "height": img.shape[0],
                  "ink": float(ink.mean()), "curve": float(blue.mean())}))
