#!/usr/bin/env python3
"""The counter-anchor: AdamW back-propagation fine-tuning on MeZO's task protocol, in PyTorch.

The same protocol as bench/mezo_task.py (its templates, tokenization, classification objective,
samples and batch order for a seed), trained by back-propagation with torch.optim.AdamW instead
of MeZO-SGD, so zof's ZO runs can be held against what gradients buy: accuracy on the task's
validation file after each --eval-every steps, the wall time to it and the peak RSS. One JSON line
per evaluation, the last with the run's totals. Memory needs at other sizes are printed as a
formula, not measured (weights, gradients and AdamW's two moments in fp32: 16 bytes a parameter,
plus activations).

    build/venv/bin/python bench/adamw_anchor.py --model build/models/SmolLM2-135M-Instruct \\
        --task sst2 --data ../shared/assets/data/sst2 --steps 200 --eval-every 50 --threads 2
"""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

import mezo_task


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--task", choices=sorted(mezo_task.TASKS), required=True)
    p.add_argument("--data", required=True, help="the task's directory (../shared/assets/data/TASK)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-examples", type=int, default=1000)
    p.add_argument("--eval-examples", type=int, default=100000,
                   help="test examples from the validation file (default: all of them)")
    p.add_argument("--eval-every", type=int, default=50, help="0: only at the start and the end")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    train, _, test, rng = mezo_task.sample_examples(a.task, a.data, a.seed, a.train_examples, 0,
                                                    a.eval_examples)
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights once
    scorer = mezo_task.Scorer(model, tok, a.max_len, share_prompt=True)
    # MeZO's rule for weight decay: not on biases and norms.
    decay = [q for n, q in model.named_parameters() if q.ndim >= 2]
    rest = [q for n, q in model.named_parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=a.lr)
    common = {"impl": "pytorch-adamw", "task": a.task, "model": a.model, "params": n_params,
              "threads": torch.get_num_threads(), "seed": a.seed, "batch": a.batch, "lr": a.lr,
              "train": len(train), "test": len(test)}

    def evaluate(step, t_train, **kw):
        model.eval()
        t0 = time.perf_counter()
        acc = scorer.accuracy(test, a.batch)
        print(json.dumps(dict(common, step=step, train_seconds=round(t_train, 3),
                              test_accuracy=acc, test_seconds=round(time.perf_counter() - t0, 3),
                              rss_peak_mb=round(mezo_task.rss_peak_mb(), 1), **kw)), flush=True)

    t_train = 0.0
    evaluate(0, t_train)
    order, k, losses = [], 0, []
    for step in range(1, a.steps + 1):
        if k + a.batch > len(order):  # a reshuffled epoch, as mezo_task.py
            order, k = list(range(len(train))), 0
            rng.shuffle(order)
        batch = [train[i] for i in order[k:k + a.batch]]
        k += a.batch
        model.train()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = mezo_task.Scorer.loss_tensor(scorer.candidate_scores(batch))
        loss.backward()
        opt.step()
        t_train += time.perf_counter() - t0
        losses.append(loss.item())
        if (a.eval_every and step % a.eval_every == 0) or step == a.steps:
            evaluate(step, t_train, train_loss=sum(losses) / len(losses),
                     **({"final": True, "torch": torch.__version__,
                         "transformers": transformers.__version__} if step == a.steps else {}))
            losses = []
    # What AdamW in fp32 holds beside the activations: weights, gradients, two moments.
    for name, n in (("this model", n_params), ("7B", 7e9), ("70B", 70e9)):
        print("adamw_anchor.py: %s: AdamW fp32 holds %.1f GB (16 bytes a parameter) before "
              "activations" % (name, 16 * n / 1e9), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
