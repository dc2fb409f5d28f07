#!/usr/bin/env python3
"""The forward of bench/forward_bench.cpp in PyTorch/transformers, for the ratio zof/PyTorch.

The same configs (random weights, float32, eval, torch.no_grad), the same random batch shape, the
same analytic FLOP count. The timed call is model(ids, labels=ids): logits of all B*T positions
and the shifted next-token loss, the counterpart of zof's Forward::next_token_nll. Also times the
logits alone. Prints one JSON line per attention implementation (sdpa, then eager unless
--attn sdpa).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

CONFIGS = {
    # Hugging Face's gpt2/config.json (124M).
    "gpt2-124m": lambda: GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        bos_token_id=50256, eos_token_id=50256),
    # LLaMA-style ~125M: GQA 12/4 heads, SwiGLU, untied LM head (as in forward_bench.cpp).
    "llama-125m": lambda: LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
        rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2),
}


def flops(cfg, B, T):
    """Same count as forward_bench.cpp: layer matmuls, causal-half attention, LM head."""
    tokens = B * T
    if cfg.model_type == "gpt2":
        C, L, H = cfg.n_embd, cfg.n_layer, cfg.n_head
        I = cfg.n_inner or 4 * C
        D = C // H
        per_layer = 4 * C * C + 2 * C * I
        V = cfg.vocab_size
    else:
        C, L, H, I = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size
        D = getattr(cfg, "head_dim", None) or C // H
        q, kv = H * D, cfg.num_key_value_heads * D
        per_layer = C * q + 2 * C * kv + q * C + 3 * C * I
        V = cfg.vocab_size
    layers = 2.0 * L * per_layer * tokens
    attention = L * 2.0 * 2.0 * B * H * D * (T * (T + 1) / 2.0)
    head = 2.0 * V * C * tokens
    return layers + attention + head


def median_seconds(warmup, iters, fn):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", default="gpt2-124m", choices=sorted(CONFIGS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--attn", choices=["sdpa", "eager", "both"], default="both")
    p.add_argument("--skip-logits", action="store_true", help="time only the forward with the loss")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    B, T = a.batch, a.seq
    impls = ["sdpa", "eager"] if a.attn == "both" else [a.attn]
    for impl in impls:
        cfg = CONFIGS[a.model_config]()
        torch.manual_seed(a.seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.float32)
        model.eval()
        g = torch.Generator().manual_seed(a.seed + 1)
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        out = {}
        with torch.no_grad():
            s_nll = median_seconds(a.warmup, a.iters, lambda: out.update(loss=model(ids, labels=ids).loss))
            s_logits = 0.0
            if not a.skip_logits:
                s_logits = median_seconds(a.warmup, a.iters, lambda: model(ids).logits)
        total = flops(cfg, B, T)
        print(json.dumps({
            "impl": "pytorch", "attn": impl, "model": a.model_config, "threads": threads,
            "batch": B, "seq": T, "params": sum(p.numel() for p in model.parameters()),
            "gflop_per_forward": total * 1e-9,
            "nll_ms": s_nll * 1e3, "nll_tokens_per_s": B * T / s_nll, "nll_gflops": total / s_nll * 1e-9,
            "logits_ms": s_logits * 1e3,
            "logits_tokens_per_s": B * T / s_logits if s_logits else 0.0,
            "logits_gflops": total / s_logits * 1e-9 if s_logits else 0.0,
            "mean_nll": float(out["loss"]),
            "torch": torch.__version__, "transformers": transformers.__version__,
        }), flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
