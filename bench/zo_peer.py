#!/usr/bin/env python3
"""MeZO's step in PyTorch/transformers on the CPU: the peer of bench/zo_step_bench.cpp.

The step as MeZO's trainer writes it (Malladi et al. 2023, `zo_step` + `zo_update`): seed a
generator, theta += eps z over every parameter, loss; theta -= 2 eps z, loss; theta += eps z
(restore); then theta -= lr (g z + wd theta) regenerating z from the same seed: four passes over
the parameters, each drawing z with torch.normal, and two forwards under torch.no_grad in eval
mode. Tied weights are one parameter (named_parameters() yields them once), as in MeZO.

Same built-in configs, random weights, batch shape and FLOP count as the zof benchmark; reports
the step time split into the forwards and the parameter passes, and peak resident memory.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forward_peer import CONFIGS, flops  # noqa: E402


def rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1]) / 1024 * 1.048576  # kB -> MB
    return 0.0


class MeZO:
    def __init__(self, model, eps, lr, weight_decay):
        self.model, self.eps, self.lr, self.wd = model, eps, lr, weight_decay
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.t_pass = 0.0
        self.t_fwd = 0.0

    def perturb(self, seed, scale):
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        for _, p in self.params:
            z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
            p.data = p.data + scale * z * self.eps
        self.t_pass += time.perf_counter() - t0

    def loss(self, ids):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model(ids, labels=ids).loss.item()
        self.t_fwd += time.perf_counter() - t0
        return out

    def update(self, seed, g):
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        for n, p in self.params:
            z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
            if "bias" not in n and "layer_norm" not in n and "layernorm" not in n:
                p.data = p.data - self.lr * (g * z + self.wd * p.data)
            else:
                p.data = p.data - self.lr * (g * z)
        self.t_pass += time.perf_counter() - t0

    def step(self, ids, seed):
        self.perturb(seed, 1)
        l1 = self.loss(ids)
        self.perturb(seed, -2)
        l2 = self.loss(ids)
        self.perturb(seed, 1)
        g = (l1 - l2) / (2 * self.eps)
        self.update(seed, g)
        return 0.5 * (l1 + l2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", default="gpt2-124m",
                   help="%s, or a model's config.json (random weights of its shape, as "
                        "zo_step_bench reads it)" % ", ".join(sorted(CONFIGS)))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the model's weights and activations (bfloat16: PyTorch's fast mode on "
                        "AMX CPUs; z drawn in the same dtype)")
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    B, T = a.batch, a.seq
    rss_base = rss_mb("VmRSS")
    if a.model_config in CONFIGS:
        cfg = CONFIGS[a.model_config]()
    elif os.path.isfile(a.model_config):
        cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(a.model_config)))
    else:
        p.error("--model-config %s: neither a built-in name (%s) nor a config.json file"
                % (a.model_config, ", ".join(sorted(CONFIGS))))
    torch.manual_seed(a.seed)
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=a.attn, dtype=dtype)
    model.eval()
    nparams = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    mezo = MeZO(model, eps=1e-3, lr=1e-6, weight_decay=0.0)
    for s in range(a.warmup):
        mezo.step(ids, 1000 + s)
    steps, fwds, passes = [], [], []
    loss = 0.0
    for s in range(a.iters):
        mezo.t_pass = mezo.t_fwd = 0.0
        t0 = time.perf_counter()
        loss = mezo.step(ids, 2000 + s)
        steps.append(time.perf_counter() - t0)
        fwds.append(mezo.t_fwd)
        passes.append(mezo.t_pass)
    step, fwd, pas = (statistics.median(x) for x in (steps, fwds, passes))
    flop_step = 2 * flops(cfg, B, T)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 * 1.048576  # kB -> MB
    print(json.dumps({
        "impl": "pytorch", "dtype": {"float32": "fp32", "bfloat16": "bf16"}[a.dtype],
        "attn": a.attn, "model": a.model_config, "threads": threads,
        "batch": B, "seq": T, "queries": 1, "params": nparams,
        "step_ms": step * 1e3, "forward_ms": fwd * 1e3, "param_pass_ms": pas * 1e3,
        "rest_ms": (step - fwd - pas) * 1e3, "tokens_per_s": B * T / step,
        "gflop_per_step": flop_step * 1e-9, "step_gflops": flop_step / step * 1e-9,
        "forward_gflops": flop_step / fwd * 1e-9,
        "model_mb": (4 if a.dtype == "float32" else 2) * nparams / 1e6, "rss_base_mb": rss_base, "rss_peak_mb": peak,
        "loss": loss, "torch": torch.__version__, "transformers": transformers.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
