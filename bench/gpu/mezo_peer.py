#!/usr/bin/env python3
"""The peer of bench/gpu/zo_bench: PyTorch/transformers' MeZO step (Malladi et al. 2023, the
reference implementation's in-place perturb / restore / update with z regenerated from a seed)
on the same config and batch shape, random weights, resident on the GPU. One JSON line per dtype:
step seconds, tokens/s, and a plain forward's seconds. fp32 runs with TF32 off, as zof's fp32."""
import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-config", default=os.path.join(here, "tinyllama_1b.json"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(args.model_config) as f:
        cfg = LlamaConfig(**json.load(f))
    cfg._attn_implementation = "sdpa"
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for name in args.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        torch.manual_seed(0)
        with dev:
            model = LlamaForCausalLM(cfg).to(dtype)
        model.eval()
        params = [p for p in model.parameters() if p.requires_grad]
        n_params = sum(p.numel() for p in params)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=dev)

        def perturb(seed, scale):
            torch.manual_seed(seed)
            for p in params:
                z = torch.normal(mean=0, std=1, size=p.size(), device=p.device, dtype=p.dtype)
                p.data.add_(z, alpha=scale)

        @torch.inference_mode()
        def loss():
            return model(input_ids=ids, labels=ids).loss.item()

        def step(i, lr=1e-6):
            seed = 1000 + i
            perturb(seed, args.eps)
            lp = loss()
            perturb(seed, -2 * args.eps)
            lm = loss()
            perturb(seed, args.eps)
            g = (lp - lm) / (2 * args.eps)
            torch.manual_seed(seed)
            for p in params:
                z = torch.normal(mean=0, std=1, size=p.size(), device=p.device, dtype=p.dtype)
                p.data.add_(z, alpha=-lr * g)
            return lp

        step(0)
        sync()
        t0 = time.perf_counter()
        for i in range(1, args.steps + 1):
            lp = step(i)
        sync()
        step_s = (time.perf_counter() - t0) / args.steps
        loss()
        t1 = time.perf_counter()
        for _ in range(args.steps):
            loss()
        fwd_s = (time.perf_counter() - t1) / args.steps
        tokens = args.batch * args.seq
        print(json.dumps({"impl": "pytorch", "dtype": name, "params": n_params, "batch": args.batch,
                          "seq": args.seq, "step_s": round(step_s, 4),
                          "tokens_per_s": round(tokens / step_s, 1), "forward_s": round(fwd_s, 4),
                          "loss": round(lp, 4), "torch": torch.__version__}), flush=True)
        del model, params
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
