#!/usr/bin/env python3
"""Generate the golden reference data zof's C++ forward pass is checked against.

Usage (from the repository root):

    python3 tests/reference/make_golden.py [--out tests/golden] [--assets ../shared/assets]

For every model it writes <out>/<name>/ holding
  config.json, model.safetensors  (random-weight models only; written by save_pretrained)
  golden.json                     (inputs, metadata, scalar results)
  golden.safetensors              ("logits", "logits_f64", "logits_bf16", "nll"; all F32)
and for stories260K also perplexity.json (`zof eval` on a TinyStories sample, as zof windows it).
--only NAME[,NAME...] regenerates just those directories.
--add-bf16 (re)writes only the "logits_bf16" tensor of the existing goldens (with --only, of those).
--check-reload DIR... loads models that zof fine-tuned and wrote (tests/model/test_golden.cpp,
GoldenSave, with ZOF_RELOAD_OUT set) with transformers and compares the logits with zof's.
The output is deterministic: rerunning with the same torch/transformers gives identical bytes
on the same CPU (the last bits of the fp32 and bf16 logits follow the CPU's GEMM kernels).
Everything runs on the CPU.
"""

import argparse
import importlib
import json
import math
import os
import shutil
import sys
import warnings

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, Gemma2Config, Gemma3TextConfig,
                          GPT2Config, LlamaConfig, MistralConfig, OPTConfig, Phi3Config,
                          Qwen2Config, Qwen3Config)

FORMAT = 1
B = 3          # batch rows
T = 12         # padded sequence length of the random-input models
LENGTHS = [T, T - 5, T - 9]
PAD_ID = 0
SEED = 1234

# Shared tiny shapes.
H = 64
V = 320
V_ODD = 301    # GPT-2's vocabulary (50257) is odd too: catches SIMD/tiling tail bugs
POS = 128
# Gemma 2's tanh soft-caps, small enough that both saturate for these random weights.
GEMMA2_ATTN_SOFTCAP = 1.0
GEMMA2_FINAL_SOFTCAP = 2.0
# Families whose RMSNorm scales by (1 + weight) (weights initialised at 0).
GEMMA_TYPES = ("gemma2", "gemma3_text")
# The sliding-window goldens (see sliding_layers and model_mask): W = 4 < T on some or all layers.
WINDOW_MODELS = ("gemma2", "gemma3", "mistral_window", "qwen2_window")
WINDOW = 4


def tiny_models():
    """name -> (config, stored dtype). Every config is explicit; nothing relies on defaults
    that could drift between transformers versions more than necessary."""
    common_llama = dict(vocab_size=V, hidden_size=H, intermediate_size=80, num_hidden_layers=2,
                        max_position_embeddings=POS, hidden_act="silu", bos_token_id=1,
                        eos_token_id=2, pad_token_id=None, initializer_range=0.02)
    # The newer families' goldens are smaller (each directory about 400 KB at most).
    small_llama = dict(common_llama, hidden_size=32, intermediate_size=48)
    return {
        "llama_gqa": (LlamaConfig(**common_llama, num_attention_heads=8, num_key_value_heads=2,
                                  head_dim=8, rope_theta=50000.0, rms_norm_eps=1e-6,
                                  tie_word_embeddings=False), torch.float32),
        "qwen2_bias": (Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=80,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=POS,
                                   rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
                                   tie_word_embeddings=True, use_sliding_window=False,
                                   bos_token_id=None, eos_token_id=2),
                       torch.float32),
        "mistral": (MistralConfig(vocab_size=V, hidden_size=H, intermediate_size=80,
                                  num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=8, max_position_embeddings=POS,
                                  rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu",
                                  sliding_window=None, tie_word_embeddings=True,
                                  bos_token_id=1, eos_token_id=2),
                    torch.float32),
        "opt": (OPTConfig(vocab_size=V, hidden_size=H, ffn_dim=96, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=POS,
                          word_embed_proj_dim=H, do_layer_norm_before=True,
                          activation_function="relu", enable_bias=True,
                          layer_norm_elementwise_affine=True, tie_word_embeddings=True,
                          bos_token_id=2, eos_token_id=2, pad_token_id=1),
                torch.float32),
        "opt350_shape": (OPTConfig(vocab_size=V, hidden_size=H, ffn_dim=96, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=POS,
                                   word_embed_proj_dim=32, do_layer_norm_before=False,
                                   activation_function="relu", enable_bias=True,
                                   layer_norm_elementwise_affine=True, tie_word_embeddings=True,
                                   bos_token_id=2, eos_token_id=2, pad_token_id=1),
                         torch.float32),
        "gpt2": (GPT2Config(vocab_size=V_ODD, n_embd=H, n_layer=2, n_head=4, n_positions=POS,
                            n_inner=None, activation_function="gelu_new",
                            layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                            bos_token_id=V_ODD - 1, eos_token_id=V_ODD - 1),
                 torch.float32),
        "llama_bf16": (LlamaConfig(**common_llama, num_attention_heads=4, num_key_value_heads=4,
                                   rope_theta=10000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True), torch.bfloat16),
        # Llama 3.x RoPE scaling with an original context of 32 positions, so that within the
        # golden's 12 positions all three bands differ from plain RoPE: frequency 0 (wavelength
        # 6.3 < 32/4) kept, 1 (19.9) interpolated, the rest (> 32) divided by the factor.
        "llama3_scaled": (LlamaConfig(**small_llama, num_attention_heads=2, num_key_value_heads=1,
                                      head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                      rope_parameters=dict(rope_type="llama3", rope_theta=10000.0,
                                                           factor=8.0, low_freq_factor=1.0,
                                                           high_freq_factor=4.0,
                                                           original_max_position_embeddings=32)),
                          torch.float32),
        # Linear RoPE scaling; config.json is rewritten in transformers 4's spelling
        # (top-level rope_theta, rope_scaling with "type"), which both readers must accept.
        "llama_linear": (LlamaConfig(**small_llama, num_attention_heads=4, num_key_value_heads=2,
                                     rms_norm_eps=1e-5, tie_word_embeddings=True,
                                     rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                          factor=4.0)),
                         torch.float32),
        # Qwen3: q_norm/k_norm per head, head_dim 12 != hidden / heads (8).
        "qwen3": (Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=12, max_position_embeddings=POS, rope_theta=10000.0,
                              rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
                              tie_word_embeddings=True, use_sliding_window=False,
                              sliding_window=None, bos_token_id=1, eos_token_id=2),
                  torch.float32),
        # Phi-3: fused qkv_proj and gate_up_proj, partial rotary (rotary_dim 4 of head_dim 8),
        # an untied LM head.
        "phi3": (Phi3Config(vocab_size=V, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=POS, original_max_position_embeddings=POS,
                            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                 partial_rotary_factor=0.5),
                            rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
                            sliding_window=None, bos_token_id=1, eos_token_id=2,
                            pad_token_id=None),
                 torch.float32),
        # Gemma 2: RMSNorm x * (1 + w), embeddings times sqrt(hidden), four norms per layer,
        # query_pre_attn_scalar 20 != head_dim 12 (scores scaled by 20**-0.5), gelu_pytorch_tanh,
        # sliding window 4 < T on layer 0, attention and final logit tanh soft-capping small
        # enough to saturate for these weights (see softcap_effect in golden.json).
        "gemma2": (Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=12, query_pre_attn_scalar=20,
                                hidden_activation="gelu_pytorch_tanh", max_position_embeddings=64,
                                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                                rms_norm_eps=1e-6, sliding_window=4,
                                layer_types=["sliding_attention", "full_attention"],
                                attn_logit_softcapping=GEMMA2_ATTN_SOFTCAP,
                                final_logit_softcapping=GEMMA2_FINAL_SOFTCAP,
                                attention_bias=False, tie_word_embeddings=True,
                                bos_token_id=2, eos_token_id=1, pad_token_id=0),
                   torch.float32),
        # Gemma 3 (text): as Gemma 2 plus q_norm / k_norm (before RoPE), no soft-capping (its
        # defaults), and a RoPE table per layer type: sliding layers theta 1000, full layers
        # theta 10000 with linear scaling factor 2 (Gemma 3 4B+ uses factor 8 there).
        "gemma3": (Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=48,
                                    num_hidden_layers=3, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=20,
                                    hidden_activation="gelu_pytorch_tanh",
                                    max_position_embeddings=64,
                                    rope_parameters={
                                        "full_attention": dict(rope_type="linear",
                                                               rope_theta=10000.0, factor=2.0),
                                        "sliding_attention": dict(rope_type="default",
                                                                  rope_theta=1000.0)},
                                    rms_norm_eps=1e-6, sliding_window=4,
                                    layer_types=["sliding_attention", "sliding_attention",
                                                 "full_attention"],
                                    attn_logit_softcapping=None, final_logit_softcapping=None,
                                    use_bidirectional_attention=False, attention_bias=False,
                                    tie_word_embeddings=True,
                                    bos_token_id=2, eos_token_id=1, pad_token_id=0),
                   torch.float32),
        # The sliding-window goldens below come last, so the seeds of those above are unchanged.
        # Mistral with sliding_window 4 < T: every layer slides (MistralConfig has no layer_types).
        "mistral_window": (MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8,
                                         max_position_embeddings=64, rope_theta=10000.0,
                                         rms_norm_eps=1e-5, hidden_act="silu",
                                         sliding_window=WINDOW, tie_word_embeddings=True,
                                         bos_token_id=1, eos_token_id=2),
                           torch.float32),
        # Qwen2 with use_sliding_window: transformers derives layer_types (written to config.json)
        # as sliding for layers i >= max_window_layers, so [full, sliding, sliding] here.
        "qwen2_window": (Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=3, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=64,
                                     rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
                                     tie_word_embeddings=True, use_sliding_window=True,
                                     sliding_window=WINDOW, max_window_layers=1,
                                     bos_token_id=None, eos_token_id=2),
                         torch.float32),
    }


STORIES_TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "The cat sat on the mat.",
    "Tom was happy.",
]


# `zof eval --model stories260K --text <this> --json` (tests/model/test_cli.cpp) is checked
# against perplexity.json.
PPL_TEXT = "data/tinystories/tinystories_sample_cs336.txt"
PPL_SEP = "<|endoftext|>"


def fmt(x, digits=8):
    """Round a float for JSON so reruns give identical text."""
    return float(f"{float(x):.{digits}g}")


def randomize_(model, gen, norm_offset=1.0):
    """Large-ish random weights so the logits depend visibly on every parameter. Norm scales are
    norm_offset + N(0, 0.1): 1 + N(0, 0.1) for x * w norms, N(0, 0.1) for Gemma's x * (1 + w)."""
    with torch.no_grad():
        for name, p in model.named_parameters():   # tied parameters are yielded once
            if p.ndim >= 2:
                std = 0.15
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1)
            else:  # norm scales
                p.copy_(norm_offset
                        + torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1)


def random_inputs(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    # Random ids avoid the first three ids and the last one (special tokens in these configs).
    ids = torch.randint(3, cfg.vocab_size - 1, (B, T), generator=g)
    bos = getattr(cfg, "bos_token_id", None)
    if bos is not None:
        ids[:, 0] = bos
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    ids[mask == 0] = PAD_ID
    return ids, mask


def sliding_layers(config):
    """Per layer, whether it uses the sliding window, as transformers 5 decides: where the config
    has layer_types (Gemma 2/3; Qwen2/3 derive it from use_sliding_window and max_window_layers)
    the layers marked sliding_attention, otherwise (Mistral, Phi-3) every layer once
    sliding_window is set. All False without a sliding_window (Qwen2/3 clear it unless
    use_sliding_window)."""
    n = config.num_hidden_layers
    if getattr(config, "sliding_window", None) is None:
        return [False] * n
    types = getattr(config, "layer_types", None)
    if types is None:
        return [True] * n
    return [t == "sliding_attention" for t in types]


def model_mask(mask, config):
    """The attention_mask given to transformers. Models with a sliding window on some layer (the
    Gemma goldens, mistral_window, qwen2_window; decided from the config, so the plain `mistral`
    and `qwen2_bias` keep theirs) get none: with right padding and causal attention the padding
    mask changes only padded query rows (a valid query sees keys 0..i, all valid), and a padded
    row under a window shorter than its distance to the last valid token would see no key at all;
    transformers' eager softmax casts the float64 model's finfo.min mask to float32 (-inf), so
    such a row is NaN, and 0 * NaN in the next layer's P.V spreads it to the whole batch row."""
    return None if any(sliding_layers(config)) else mask


def forward(model, ids, mask, model_type):
    kw = dict(input_ids=ids, attention_mask=model_mask(mask, model.config), use_cache=False)
    if model_type != "opt":
        # zof: positions are 0..len-1 per row (right padding). OPT derives the same from
        # cumsum(attention_mask).
        kw["position_ids"] = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        return model(**kw).logits


def nll_from_logits(logits, ids, mask):
    """Per-token next-token NLL (B, T-1), computed in float64 from the given logits;
    0 where the target is padding."""
    lp = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    tgt = ids[:, 1:]
    nll = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    valid = mask[:, 1:].bool()
    nll = torch.where(valid, nll, torch.zeros_like(nll))
    return nll, valid


def greedy(model, prefix, n_new, model_type):
    """Greedy decoding with the KV cache, no EOS stopping; also checked against recomputing
    the whole sequence without a cache at every step. Returns (new ids, min top1-top2 margin)."""
    ids = prefix.clone()
    out, margins = [], []
    with torch.no_grad():
        res = model(input_ids=ids, use_cache=True)
        past = res.past_key_values
        logits = res.logits[:, -1]
        for step in range(n_new):
            full = model(input_ids=ids, use_cache=False).logits[:, -1]
            if full.argmax(-1).item() != logits.argmax(-1).item():
                raise RuntimeError("greedy: cached and uncached argmax differ")
            top2 = torch.topk(logits[0].double(), 2).values
            margins.append((top2[0] - top2[1]).item())
            nxt = logits.argmax(-1, keepdim=True)
            out.append(nxt.item())
            ids = torch.cat([ids, nxt], dim=1)
            if step + 1 < n_new:
                res = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[:, -1]
    return out, min(margins)


def load(model_dir, dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    m.eval()
    return m


def bf16_logits(model_dir, ids, mask, model_type):
    """transformers' logits in bf16, as a user runs it: loaded with dtype=bfloat16, so every
    parameter, activation and the residual stream are bf16 but for transformers' own fp32 islands
    (RMSNorm statistics, the eager softmax, the RoPE table: from_pretrained keeps inv_freq fp32,
    where model.to(torch.bfloat16) would round it too). Same inputs and masks as the fp32
    forward; returned as float32, 0 at padded positions."""
    l16 = forward(load(model_dir, torch.bfloat16), ids, mask, model_type).float()
    l16 = torch.where(mask.bool().unsqueeze(-1), l16, torch.zeros_like(l16))
    if not torch.isfinite(l16).all():
        raise RuntimeError(f"{model_dir}: the bf16 forward gave non-finite logits")
    return l16.contiguous()


def golden_for(model_dir, ids, mask, model_type):
    """fp32, fp64 and bf16 forwards of the stored weights; returns tensors and scalar results
    (from the fp32 and fp64 logits only)."""
    m32 = load(model_dir, torch.float32)
    m64 = load(model_dir, torch.float64)
    l32 = forward(m32, ids, mask, model_type)
    l64 = forward(m64, ids, mask, model_type)
    l16 = bf16_logits(model_dir, ids, mask, model_type)
    valid = mask.bool()
    l32 = torch.where(valid.unsqueeze(-1), l32, torch.zeros_like(l32))
    l64 = torch.where(valid.unsqueeze(-1), l64, torch.zeros_like(l64))
    diff = (l32.double() - l64).abs()
    # Per position: max |l32 - l64| over the vocabulary divided by max |l64| over the vocabulary.
    row_rel = diff.amax(-1) / l64.abs().amax(-1).clamp_min(1e-30)
    nll, nvalid = nll_from_logits(l32, ids, mask)
    nll64, _ = nll_from_logits(l64, ids, mask)
    info = {
        "nll_mean": fmt(nll[nvalid].mean()),
        "nll_mean_f64": fmt(nll64[nvalid].mean()),
        "fp64_vs_fp32_max_abs": fmt(diff[valid].max(), 4),
        "fp64_vs_fp32_max_rel": fmt(row_rel[valid].max(), 4),
        "logits_max_abs": fmt(l64[valid].abs().max(), 6),
        "logits_std": fmt(l64[valid].std(), 6),
    }
    tensors = {
        "logits": l32.float().contiguous(),
        "logits_f64": l64.float().contiguous(),
        "logits_bf16": l16,
        "nll": nll.float().contiguous(),
    }
    return m32, tensors, info


def grad_golden(out_dir, ids, mask, model_type):
    """float64 gradient of the mean next-token NLL over valid positions, for the ZO tests
    (g of SPSA must approach grad . z as eps shrinks). Written as grad.safetensors (F32,
    Hugging Face names, tied weights once)."""
    m64 = load(out_dir, torch.float64)
    kw = dict(input_ids=ids, attention_mask=model_mask(mask, m64.config), use_cache=False)
    if model_type != "opt":
        kw["position_ids"] = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    logits = m64(**kw).logits
    nll, valid = nll_from_logits(logits, ids, mask)
    loss = nll[valid].mean()
    loss.backward()
    grads = {n: p.grad.float().contiguous() for n, p in m64.named_parameters()}
    save_file(grads, os.path.join(out_dir, "grad.safetensors"), metadata={"format": "pt"})
    return fmt(loss, 12)


def softcap_effect(model_dir, ids, mask, model_type):
    """float64: the largest |value| each tanh soft-cap sees (attention scores after the
    query_pre_attn_scalar scaling, over the pairs the mask keeps, valid queries only; logits
    before the final cap), and how far the logits move when the attention cap alone, or both
    caps, are switched off, so that the golden shows the caps matter. Gemma 3 has no caps
    (transformers 5's Gemma3Attention would not apply attn_logit_softcapping anyway); its record
    shows the uncapped magnitudes."""
    family = model_type.split("_")[0]   # gemma3_text -> gemma3
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    orig = mod.eager_attention_forward
    seen = []

    def spy(module, query, key, value, attention_mask, scaling=None, **kw):
        k = mod.repeat_kv(key, module.num_key_value_groups)
        s = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is None:
            keep = torch.ones_like(s, dtype=torch.bool)
        else:
            keep = (attention_mask == 0).expand_as(s)
        # Padded query rows are not scored; only positions < length count.
        valid_q = mask.bool()[:, None, :, None].expand_as(s)
        seen.append(s[keep & valid_q].abs().max().item())
        return orig(module, query, key, value, attention_mask, scaling=scaling, **kw)

    m = load(model_dir, torch.float64)
    valid = mask.bool()
    mod.eager_attention_forward = spy
    try:
        capped = forward(m, ids, mask, model_type)
    finally:
        mod.eager_attention_forward = orig
    final_cap, attn_cap = m.config.final_logit_softcapping, m.config.attn_logit_softcapping
    m.config.final_logit_softcapping = None
    precap = forward(m, ids, mask, model_type)
    m.config.attn_logit_softcapping = None
    for layer in m.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    uncapped = forward(m, ids, mask, model_type)
    m.config.final_logit_softcapping = final_cap
    attn_uncapped = forward(m, ids, mask, model_type)

    def dmax(a, b):
        return fmt((a - b)[valid].abs().max(), 6)
    return {
        "attn_logit_softcapping": attn_cap,
        "final_logit_softcapping": final_cap,
        "attn_scores_max_abs": fmt(max(seen), 6),
        "logits_precap_max_abs": fmt(precap[valid].abs().max(), 6),
        "logits_vs_attn_uncapped_max_abs": dmax(capped, attn_uncapped),
        "logits_vs_uncapped_max_abs": dmax(capped, uncapped),
    }


def window_effect(model_dir, ids, mask, model_type):
    """float64: how far batch row 0's logits move, per position, when the sliding window is
    switched off (sliding_window set beyond the sequence, so the window mask is plain causal),
    so that the golden shows the window matters: 0 up to position W - 1 (every key still in the
    window), nonzero after."""
    m = load(model_dir, torch.float64)
    windowed = forward(m, ids, mask, model_type)
    window = m.config.sliding_window
    m.config.sliding_window = 1 << 20
    full = forward(m, ids, mask, model_type)
    n = int(mask[0].sum())
    d = (windowed[0, :n] - full[0, :n]).abs().amax(-1)
    return {
        "sliding_window": window,
        "row": 0,
        "logits_vs_no_window_max_abs_by_pos": [fmt(x, 6) for x in d.tolist()],
    }


def write_golden(out_dir, meta, tensors):
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(meta, f, sort_keys=True, indent=1)
        f.write("\n")
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata={"format": "pt"})


def base_meta(name, model_dir_rel, cfg, ids, mask, stored, info):
    meta = {
        "format": FORMAT,
        "model": name,
        "model_dir": model_dir_rel,
        "model_type": cfg.model_type,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "dtype_stored": stored,
        "compute_dtype": "float32",
        "input_ids": ids.tolist(),
        "attention_mask": mask.tolist(),
        "lengths": [int(x) for x in mask.sum(1).tolist()],
        "pad_id": PAD_ID,
        "vocab_size": int(cfg.vocab_size),
        "seed": SEED,
    }
    meta.update(info)
    return meta


# Which goldens record greedy generation and the float64 gradient.
GREEDY = ("llama_gqa", "llama3_scaled", "llama_linear", "qwen3", "phi3", "gemma2", "gemma3",
          "mistral_window", "qwen2_window")
GRAD = ("llama_gqa", "gpt2", "llama3_scaled", "qwen3", "phi3", "gemma2", "gemma3",
        "mistral_window", "qwen2_window")
# Which goldens record transformers' RoPE frequency table (gemma3: one per layer type).
ROPE_TABLE = ("llama3_scaled", "llama_linear", "qwen3", "phi3", "gemma2", "gemma3")
# Which goldens' config.json is rewritten in transformers 4's RoPE spelling.
T4_SPELLING = ("llama_linear",)


def to_transformers4_rope(path):
    """rope_parameters {rope_type, rope_theta, ...} -> top-level rope_theta and rope_scaling
    {type, ...}, as checkpoints written by transformers 4 say it."""
    with open(path) as f:
        c = json.load(f)
    rp = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    c["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def make_tiny(name, cfg, dtype, out_root, index):
    if (name in WINDOW_MODELS) != any(sliding_layers(cfg)):
        raise RuntimeError(f"{name}: WINDOW_MODELS disagrees with the config's sliding window")
    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    torch.manual_seed(SEED + index)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomize_(model, torch.Generator().manual_seed(SEED + 100 + index),
               norm_offset=0.0 if cfg.model_type in GEMMA_TYPES else 1.0)
    model.eval()
    if dtype != torch.float32:
        model = model.to(dtype)
    model.save_pretrained(out_dir)
    gc = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    if name in T4_SPELLING:
        to_transformers4_rope(os.path.join(out_dir, "config.json"))
    # Check the round trip: reloading in float32 must give exactly the (rounded) weights.
    ref = {k: v.float() for k, v in model.state_dict().items()}
    m32 = load(out_dir, torch.float32)
    for k, v in m32.state_dict().items():
        if k in ref and not torch.equal(ref[k], v):
            raise RuntimeError(f"{name}: weight {k} changed in the save/load round trip")

    ids, mask = random_inputs(cfg, SEED + 200 + index)
    m32, tensors, info = golden_for(out_dir, ids, mask, cfg.model_type)
    stored = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    meta = base_meta(name, name, cfg, ids, mask, stored, info)
    meta["n_params"] = int(sum(p.numel() for p in m32.parameters()))
    if name in ROPE_TABLE:
        # transformers' fp32 RoPE frequencies (exact: float32 values are exact doubles in JSON).
        rot = m32.model.rotary_emb
        if hasattr(rot, "inv_freq"):
            meta["rope_inv_freq"] = [float(x) for x in rot.inv_freq.tolist()]
        else:
            # Gemma 3: one table per layer type; rope_inv_freq is the full-attention layers'.
            meta["rope_inv_freq"] = [float(x) for x in rot.full_attention_inv_freq.tolist()]
            meta["rope_inv_freq_local"] = [float(x)
                                           for x in rot.sliding_attention_inv_freq.tolist()]
    if cfg.model_type in GEMMA_TYPES:
        # Which layers use the sliding window (and, for Gemma 3, rope_inv_freq_local).
        meta["layer_types"] = list(cfg.layer_types)
        meta["softcap_effect"] = softcap_effect(out_dir, ids, mask, cfg.model_type)
    elif name in WINDOW_MODELS:
        # Which layers slide (Mistral's config.json has no layer_types: all of them do).
        meta["layer_types"] = ["sliding_attention" if s else "full_attention"
                               for s in sliding_layers(cfg)]
        meta["window_effect"] = window_effect(out_dir, ids, mask, cfg.model_type)
    if name in GREEDY:
        prefix = ids[:1, :5]
        toks, margin = greedy(m32, prefix, 10, cfg.model_type)
        meta["greedy_prefix"] = prefix[0].tolist()
        meta["greedy_from_prefix"] = toks
        meta["greedy_min_margin"] = fmt(margin, 4)
    if name in GRAD:
        meta["grad_loss_f64"] = grad_golden(out_dir, ids, mask, cfg.model_type)
    write_golden(out_dir, meta, tensors)
    return meta


def make_stories(out_root, assets):
    name = "stories260K"
    src = os.path.join(assets, "models", "stories260K")
    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    tok = AutoTokenizer.from_pretrained(src)
    enc = [tok(t)["input_ids"] for t in STORIES_TEXTS]
    for e in enc:
        if e[0] != 1:
            raise RuntimeError("stories260K tokenizer did not add BOS")
    tmax = max(len(e) for e in enc)
    ids = torch.full((len(enc), tmax), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, e in enumerate(enc):
        ids[b, :len(e)] = torch.tensor(e)
        mask[b, :len(e)] = 1
    cfg = transformers.AutoConfig.from_pretrained(src)
    m32, tensors, info = golden_for(src, ids, mask, cfg.model_type)
    meta = base_meta(name, "assets:models/stories260K", cfg, ids, mask, "float32", info)
    meta["texts"] = STORIES_TEXTS
    meta["n_params"] = int(sum(p.numel() for p in m32.parameters()))
    toks, margin = greedy(m32, torch.tensor([[1]]), 40, cfg.model_type)
    meta["greedy_from_bos"] = toks
    meta["greedy_from_bos_text"] = tok.decode([1] + toks, skip_special_tokens=True)
    meta["greedy_min_margin"] = fmt(margin, 4)
    write_golden(out_dir, meta, tensors)
    ppl = make_stories_perplexity(out_dir, assets)
    print(f"{name:14s} eval {PPL_TEXT}: nll={ppl['nll']:.6f} ppl={ppl['ppl']:.6f} "
          f"tokens={ppl['tokens']} windows={ppl['windows']}")
    return meta


def eval_windows(text, tok, bos, seq_len):
    """The windows `zof eval` scores (src/app/text.cpp, src/model/perplexity.cpp): the text split
    at <|endoftext|>, each document stripped of surrounding whitespace and encoded alone without
    special tokens, then cut into non-overlapping windows of BOS + seq_len - 1 tokens that never
    cross a document boundary."""
    windows = []
    for doc in text.split(PPL_SEP):
        doc = doc.strip(" \t\r\n")
        if not doc:
            continue
        ids = tok.encode(doc, add_special_tokens=False).ids
        body = seq_len - 1
        for i in range(0, len(ids), body):
            w = [bos] + ids[i:i + body]
            if len(w) >= 2:
                windows.append(w)
    return windows


def perplexity_golden(model_dir, text_path, seq_len):
    """Mean next-token NLL over every text token of the windows (each predicted from BOS and the
    tokens before it in its window), from the fp32 and the float64 forward."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    windows = eval_windows(text, tok, 1, seq_len)
    out = {}
    for dtype, key in ((torch.float32, "nll"), (torch.float64, "nll_f64")):
        m = load(model_dir, dtype)
        total, tokens = 0.0, 0
        for w in windows:
            ids = torch.tensor([w])
            with torch.no_grad():
                logits = m(input_ids=ids, use_cache=False).logits
            nll, _ = nll_from_logits(logits, ids, torch.ones_like(ids))
            total += nll.sum().item()
            tokens += nll.numel()
        out[key] = fmt(total / tokens, 10)
        out["tokens"] = tokens
    out["ppl"] = fmt(math.exp(out["nll"]), 10)
    out["windows"] = len(windows)
    return out


def make_stories_perplexity(out_dir, assets):
    src = os.path.join(assets, "models", "stories260K")
    seq_len = 512   # zof eval's default: the context (512), at most 512
    meta = {
        "format": FORMAT,
        "model_dir": "assets:models/stories260K",
        "text": "assets:" + PPL_TEXT,
        "seq_len": seq_len,
        "bos_id": 1,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
    }
    meta.update(perplexity_golden(src, os.path.join(assets, PPL_TEXT), seq_len))
    with open(os.path.join(out_dir, "perplexity.json"), "w") as f:
        json.dump(meta, f, sort_keys=True, indent=1)
        f.write("\n")
    return meta


def check_reload(dirs):
    """Loads each model zof wrote (tests/model/test_golden.cpp GoldenSave with ZOF_RELOAD_OUT)
    with transformers and compares its fp32 logits on the golden rows with zof's
    (zof_logits.safetensors), at the golden tests' tolerance. Returns the number of failures."""
    from safetensors.torch import load_file
    bad = 0
    for d in dirs:
        meta = json.load(open(os.path.join(d, "golden.json")))
        ids = torch.tensor(meta["input_ids"])
        mask = torch.tensor(meta["attention_mask"])
        zof_logits = load_file(os.path.join(d, "zof_logits.safetensors"))["logits"].double()
        m = load(d, torch.float32)
        ours = forward(m, ids, mask, meta["model_type"]).double()
        worst = 0.0
        for b, n in enumerate(meta["lengths"]):
            want, got = ours[b, :n], zof_logits[b, :n]
            scale = want.abs().amax(-1, keepdim=True).clamp_min(1e-6)
            worst = max(worst, ((got - want).abs() / scale).max().item())
        ok = worst < 2e-5
        bad += not ok
        print(f"{os.path.basename(d.rstrip('/')):14s} transformers {transformers.__version__} reload: "
              f"max rel |zof - transformers| = {worst:.2e} {'ok' if ok else 'FAIL'}")
    return bad


def add_bf16(out_root, names, assets):
    """--add-bf16: (re)writes only the logits_bf16 tensor of existing goldens, from the inputs in
    their golden.json, and keeps every other tensor's bytes and every other file as they are. A
    full regeneration recomputes the fp32 logits too, whose last bits depend on the CPU's fp32
    GEMM kernels: on a machine other than the goldens' own, the H = 64 goldens' fp32 logits (and
    the scalars, gradients and perplexity derived from them) move by a few ulp."""
    from safetensors.torch import load_file
    for name in names:
        out_dir = os.path.join(out_root, name)
        with open(os.path.join(out_dir, "golden.json")) as f:
            meta = json.load(f)
        md = meta["model_dir"]
        model_dir = os.path.join(assets, md[len("assets:"):]) if md.startswith("assets:") else out_dir
        ids = torch.tensor(meta["input_ids"])
        mask = torch.tensor(meta["attention_mask"])
        path = os.path.join(out_dir, "golden.safetensors")
        tensors = load_file(path)
        tensors["logits_bf16"] = bf16_logits(model_dir, ids, mask, meta["model_type"])
        save_file(tensors, path, metadata={"format": "pt"})
        print(f"{name:14s} logits_bf16 written: fp64_vs_bf16 max_rel={bf16_max_rel(out_dir):.3g}")


def bf16_max_rel(out_dir):
    """For the summary only: golden.safetensors' logits_bf16 against logits_f64, as
    fp64_vs_fp32_max_rel (padded positions are 0 in both, so they add nothing)."""
    from safetensors.torch import load_file
    g = load_file(os.path.join(out_dir, "golden.safetensors"))
    l64, l16 = g["logits_f64"].double(), g["logits_bf16"].double()
    scale = l64.abs().amax(-1).clamp_min(1e-30)
    return ((l16 - l64).abs().amax(-1) / scale).max().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--assets", default="../shared/assets")
    ap.add_argument("--only", default="", help="comma-separated directories to regenerate")
    ap.add_argument("--add-bf16", action="store_true",
                    help="only (re)write logits_bf16 in existing goldens (see add_bf16)")
    ap.add_argument("--check-reload", nargs="+", metavar="DIR",
                    help="instead: check models zof wrote (see check_reload) and exit")
    args = ap.parse_args()
    if args.check_reload:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        return 1 if check_reload(args.check_reload) else 0
    only = set(filter(None, args.only.split(",")))
    known = set(tiny_models()) | {"stories260K"}
    if only - known:
        ap.error(f"--only: unknown {sorted(only - known)}; known: {sorted(known)}")

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.add_bf16:
        add_bf16(args.out, [n for n in sorted(known) if not only or n in only], args.assets)
        return 0
    os.makedirs(args.out, exist_ok=True)

    metas = []
    for i, (name, (cfg, dtype)) in enumerate(tiny_models().items()):
        if not only or name in only:
            metas.append(make_tiny(name, cfg, dtype, args.out, i))
    if not only or "stories260K" in only:
        metas.append(make_stories(args.out, args.assets))
    for m in metas:
        print(f"{m['model']:14s} params={m['n_params']:7d} nll_mean={m['nll_mean']:.6f} "
              f"fp64_vs_fp32 max_rel={m['fp64_vs_fp32_max_rel']:.3g} "
              f"max_abs={m['fp64_vs_fp32_max_abs']:.3g} |logits|max={m['logits_max_abs']:.3g} "
              f"fp64_vs_bf16 max_rel={bf16_max_rel(os.path.join(args.out, m['model'])):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
