#!/usr/bin/env python3
"""Does the forward gradient (--estimator jvp) need fp32 tangents? Measured in PyTorch.

The JVP estimator's one number per direction z is d = grad L . z, the directional derivative of
the batch loss. This script computes d for a set of directions on a real model and batch, in
float64 (the truth) and in the precisions a run could use, and prints each one's error against
float64 beside the error of the SPSA estimate that zof's bf16 runs already use:

- jvp fp32: torch.func.jvp in float32 (what zof's JVP walk computes, fp32 everywhere).
- jvp bf16 products: float32 with every matrix product's input, weight and their tangents rounded
  to bf16 (nearest even) before an fp32-accumulated product: zof's bf16 JVP walk (--estimator
  jvp --dtype bf16), whose attention, norms and sums stay fp32.
- spsa fp32 / spsa bf16 products: (L(theta + eps z) - L(theta - eps z)) / (2 eps), the bf16 one
  with the perturbed matrices and the products' inputs rounded to bf16 as zof's --dtype bf16
  walks do (fp32 master; zof's also round attention's inputs, which this leaves in fp32).

Errors are |d - d64| / |d64| per direction (median and largest), and over all directions
sqrt(sum (d - d64)^2 / sum d64^2). For scale: one direction's estimate d z of the gradient has a
relative error of order sqrt(parameters) whatever the precision.

  build/venv/bin/python bench/jvp_dtype.py   (~1 minute on 2 cores)
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.func import functional_call, jvp
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ASSETS = os.path.join(HERE, "..", "..", "shared", "assets")

ROUND = {"on": False}  # the bf16 emulation switch, read by the patched ops


def bf16(x):
    return x.to(torch.bfloat16).to(x.dtype) if ROUND["on"] else x


_linear = F.linear


def linear(x, w, b=None):
    return _linear(bf16(x), bf16(w), b)


torch.nn.modules.linear.F.linear = linear


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ASSETS, "models", "stories260K"))
    ap.add_argument("--data", default=os.path.join(ASSETS, "data", "tinyshakespeare", "input.txt"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--directions", type=int, default=16)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    a = ap.parse_args()
    for path in (a.model, a.data):
        if not os.path.exists(path):
            sys.exit(f"jvp_dtype.py: error: {path} does not exist; pass --model/--data")
    torch.set_num_threads(a.threads)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.model, "tokenizer.json"))
    text = open(a.data, encoding="utf-8").read()
    ids = tok(text[: a.batch * a.seq * 8])["input_ids"]
    if len(ids) < a.batch * a.seq:
        sys.exit("jvp_dtype.py: error: --data holds too few tokens for --batch x --seq")
    batch = torch.tensor(ids[: a.batch * a.seq]).view(a.batch, a.seq)

    models = {dt: AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dt,
                                                       attn_implementation="eager").eval()
              for dt in (torch.float64, torch.float32)}
    model = models[torch.float64]
    names = [n for n, _ in model.named_parameters()]
    # The float64 weights are the file's float32 values exactly: every precision starts from them.
    theta64 = {n: p.detach().clone() for n, p in model.named_parameters()}
    n_params = sum(p.numel() for p in theta64.values())
    gen = torch.Generator().manual_seed(a.seed)
    dirs = [{n: torch.randn(theta64[n].shape, generator=gen, dtype=torch.float64) for n in names}
            for _ in range(a.directions)]

    def loss(params, dtype):
        return functional_call(models[dtype], params, (batch,), {"labels": batch}).loss

    def cast(d, dtype):
        return {n: v.to(dtype) for n, v in d.items()}

    def d_jvp(z, dtype, rounded):
        ROUND["on"] = rounded
        try:
            _, t = jvp(lambda p: loss(p, dtype), (cast(theta64, dtype),), (cast(z, dtype),))
        finally:
            ROUND["on"] = False
        return float(t)

    def d_spsa(z, dtype, rounded):
        ROUND["on"] = rounded
        try:
            with torch.no_grad():
                th = cast(theta64, dtype)
                zz = cast(z, dtype)
                lp = loss({n: th[n] + a.eps * zz[n] for n in names}, dtype)
                lm = loss({n: th[n] - a.eps * zz[n] for n in names}, dtype)
        finally:
            ROUND["on"] = False
        return float((lp - lm) / (2 * a.eps))

    truth = [d_jvp(z, torch.float64, False) for z in dirs]
    methods = [
        ("jvp fp32", lambda z: d_jvp(z, torch.float32, False)),
        ("jvp bf16 products", lambda z: d_jvp(z, torch.float32, True)),
        ("spsa fp32", lambda z: d_spsa(z, torch.float32, False)),
        ("spsa bf16 products", lambda z: d_spsa(z, torch.float32, True)),
    ]
    print(f"{os.path.basename(os.path.normpath(a.model))}, {n_params} parameters, batch "
          f"{a.batch} x {a.seq}, {a.directions} directions (seed {a.seed}), spsa eps {a.eps}; "
          f"torch {torch.__version__}; |d64| median {statistics.median(abs(t) for t in truth):.4g}\n")
    print("| directional derivative | relative error, median | largest | over all directions |")
    print("|---|---:|---:|---:|")
    rows = []
    for name, f in methods:
        got = [f(z) for z in dirs]
        rel = [abs(g - t) / abs(t) for g, t in zip(got, truth)]
        agg = (sum((g - t) ** 2 for g, t in zip(got, truth)) / sum(t * t for t in truth)) ** 0.5
        print(f"| {name} | {statistics.median(rel):.2e} | {max(rel):.2e} | {agg:.2e} |")
        rows.append({"method": name, "median": statistics.median(rel), "max": max(rel), "all": agg})
    if a.json:
        print(json.dumps({"params": n_params, "directions": a.directions, "rows": rows}))


if __name__ == "__main__":
    main()
