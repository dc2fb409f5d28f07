"""PyTorch's matrix product at the shapes of dev/bf16_walk_timing.cpp: torch.nn.functional.linear
(x (M,K) times an nn.Linear weight (N,K), plus bias) in float32 and bfloat16, on a given number of
threads; GFLOP/s from the best of --reps, by wall time and by the process's CPU time over the
thread count (what a product would take alone on its cores: run with OMP_WAIT_POLICY=passive on a
shared machine so that waiting threads do not spin). The peer that bf16_walk_timing's oneDNN
columns are read against.

    build/venv/bin/python dev/torch_matmul_rate.py --threads 2 --reps 15
"""
import argparse
import json
import time

import torch

SHAPES = [
    ("gpt2 qkv", 1024, 2304, 768), ("gpt2 proj", 1024, 768, 768),
    ("gpt2 fc", 1024, 3072, 768), ("gpt2 fc2", 1024, 768, 3072),
    ("gpt2 head", 1016, 1344, 768), ("smol q/o", 1024, 576, 576),
    ("smol k/v", 1024, 192, 576), ("smol up", 1024, 1536, 576),
    ("smol down", 1024, 576, 1536), ("smol head", 1016, 1792, 576),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", action="store_true",
                    help="one JSON line per (shape, dtype) by wall time, as bench/libs/gemm_libs.cpp "
                         "prints them (bench/gemm_libs.sh reads both)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if not a.json:
        print(f"torch {torch.__version__}, {a.threads} threads, best of {a.reps}; GFLOP/s "
              f"(wall | CPU time / threads)")
        print(f"{'':10} {'M N K':>16} | {'f32 wall':>8} {'bf16 wall':>9} | {'f32 cpu':>8} "
              f"{'bf16 cpu':>8}")
    g = torch.Generator().manual_seed(1)
    for name, M, N, K in SHAPES:
        row = {}
        for dt in (torch.float32, torch.bfloat16):
            x = torch.rand(M, K, generator=g).to(dt) - 0.5
            w = torch.rand(N, K, generator=g).to(dt) - 0.5
            b = torch.rand(N, generator=g).to(dt)
            with torch.no_grad():
                for _ in range(2):
                    torch.nn.functional.linear(x, w, b)
                wall = cpu = 1e30
                for _ in range(a.reps):
                    t0, c0 = time.perf_counter(), time.process_time()
                    torch.nn.functional.linear(x, w, b)
                    wall = min(wall, time.perf_counter() - t0)
                    cpu = min(cpu, (time.process_time() - c0) / a.threads)
            flop = 2.0 * M * N * K
            row[dt] = (flop / wall * 1e-9, flop / max(cpu, 1e-9) * 1e-9)
        f, h = row[torch.float32], row[torch.bfloat16]
        if a.json:
            for dtype, r in (("fp32", f), ("bf16", h)):
                print(json.dumps({"lib": "PyTorch " + torch.__version__.split("+")[0],
                                  "shape": name, "M": M, "N": N, "K": K, "dtype": dtype,
                                  "threads": a.threads, "gflops": round(r[0], 1)}))
            continue
        print(f"{name:10} {M:5d} {N:5d} {K:5d} | {f[0]:8.1f} {h[0]:9.1f} | {f[1]:8.1f} {h[1]:8.1f}")


if __name__ == "__main__":
    main()
