#!/usr/bin/env python3
"""MeZO's protocol in PyTorch/transformers: the peer zof's task fine-tuning is held against.

A plain implementation of Malladi et al. 2023 (MeZO), written from the paper and FIELD.md, on a
Hugging Face model directory and the task files of ../shared/assets/data:

- data: --train-examples (1000) training and --val-examples (500) validation examples sampled
  from the task's training file, --eval-examples (1000, or all there are) test examples from its
  validation file (SST-2's dev.tsv, val.jsonl), each sample seeded by --seed;
- prompts and verbalizers: MeZO's templates (SST-2, RTE, CB, COPA), as zof's src/data/tasks.cpp;
  a sequence is prompt + candidate tokenized whole, the candidate's tokens being those after the
  longest common prefix with the prompt's own tokens (with the tokenizer's BOS where it adds one);
- objective: the classification objective (MeZO's --train_as_classification): for each example
  every candidate's score is the mean log-likelihood of its tokens, and the loss is the
  cross-entropy over the candidates' scores with the correct one as the label;
- step: MeZO-SGD with one perturbation: seed a generator, theta += eps z, loss; theta -= 2 eps z,
  loss; theta += eps z; theta -= lr ((l+ - l-) / 2 eps) z (+ weight decay on matrices), z
  regenerated from the seed, over every parameter (tied ones once), under torch.no_grad, model in
  eval mode; batches of --batch examples drawn from a reshuffled epoch order;
- evaluation: accuracy (the best-scoring candidate) on the validation sample every --eval-every
  steps (and at step 0: zero-shot), on the test sample at the end (and at every evaluation with
  --curve-on-test).

Prints a JSON line per evaluation and a last line with the run's totals (forward passes, wall
time, peak RSS). z and the batch order are torch's, not zof's: a comparison is statistical (the
same protocol, seeds' spread), never bit for bit.
"""
import argparse
import csv
import json
import os
import random
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


# ---- MeZO's templates ------------------------------------------------------------------------

def sst2(row):
    return row["sentence"].strip() + " It was", [" terrible", " great"], int(row["label"])


def rte(j):
    labels = ["entailment", "not_entailment"]
    return (j["premise"] + "\nDoes this mean that \"" + j["hypothesis"] + "\" is true? Yes or No?\n",
            ["Yes", "No"], label_of(j["label"], labels))


def cb(j):
    labels = ["entailment", "contradiction", "neutral"]
    return ("Suppose " + j["premise"] + " Can we infer that \"" + j["hypothesis"] +
            "\"? Yes, No, or Maybe?\n", ["Yes", "No", "Maybe"], label_of(j["label"], labels))


def copa_choice(c):
    first, sep, rest = c.partition(" ")
    return (first if first == "I" else first.lower()) + sep + rest


def copa(j):
    p = j["premise"].rstrip()
    if p.endswith("."):
        p = p[:-1]
    joiner = " so " if j["question"] == "effect" else " because "
    return p + joiner, [copa_choice(j["choice1"]), copa_choice(j["choice2"])], int(j["label"])


def label_of(v, names):
    return v if isinstance(v, int) else names.index(v)


TASKS = {"sst2": (sst2, "train.tsv", "dev.tsv"), "rte": (rte, "train.jsonl", "val.jsonl"),
         "cb": (cb, "train.jsonl", "val.jsonl"), "copa": (copa, "train.jsonl", "val.jsonl")}


def read_examples(task, path):
    make = TASKS[task][0]
    if path.endswith(".tsv"):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    else:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return [make(r) for r in rows]


# ---- tokenization ----------------------------------------------------------------------------

def tokenize(tok, prompt, cand, max_len):
    # MeZO's .strip(' '): spaces only, so the newline ending RTE's and CB's prompts stays there.
    full = tok((prompt + cand).strip(" "), add_special_tokens=True)["input_ids"]
    head = tok(prompt.strip(" "), add_special_tokens=True)["input_ids"]
    lcp = 0
    while lcp < min(len(full), len(head)) and full[lcp] == head[lcp]:
        lcp += 1
    if lcp >= len(full):
        raise SystemExit("mezo_task.py: the answer %r has no tokens of its own after the prompt"
                         % cand)
    if len(full) > max_len:  # cut the prompt on the left, keeping BOS
        bos = tok.bos_token_id is not None and full[0] == tok.bos_token_id
        cut = len(full) - max_len
        full = ([full[0]] if bos else []) + full[len(full) - (max_len - (1 if bos else 0)):]
        lcp -= cut
    return full, max(lcp, 1)  # a cut that reaches the answer still scores from position 1


class Scorer:
    """Mean log-likelihood of each candidate's tokens, all candidates of a batch padded together.

    With share_prompt, candidates that differ only in one last token (SST-2's " terrible" /
    " great", RTE's and CB's "Yes" / "No" / "Maybe" with most tokenizers) run as one sequence of
    the shared tokens, every candidate scored at its last position: the same log-probabilities
    (a position sees only the tokens before it) in a forward of one sequence instead of one per
    candidate, as zof does. Either way only the scored positions go through the LM head."""

    def __init__(self, model, tok, max_len, share_prompt=False):
        self.model, self.tok, self.max_len = model, tok, max_len
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.share = share_prompt
        self.forwards = 0
        # Gemma 2's final soft-cap, which the model's own forward applies after its LM head.
        self.cap = getattr(model.config, "final_logit_softcapping", None)
        if getattr(model.config, "logit_scale", None) or getattr(model.config, "logits_scaling", None):
            raise SystemExit("mezo_task.py: this scorer does not scale logits after the LM head")

    def rows(self, prompt, cands, first_unit):
        """The sequences an example runs as, each with its (position, target, unit) pairs."""
        toks = [tokenize(self.tok, prompt, c, self.max_len) for c in cands]
        L = len(toks[0][0])
        if (self.share and len(toks) > 1 and L >= 2 and
                all(len(s) == L and start == L - 1 and s[:-1] == toks[0][0][:-1]
                    for s, start in toks)):
            return [(toks[0][0][:-1], [(L - 2, s[-1], first_unit + k)
                                       for k, (s, _) in enumerate(toks)])]
        return [(s, [(q - 1, s[q], first_unit + k) for q in range(start, len(s))])
                for k, (s, start) in enumerate(toks)]

    def scores(self, examples):
        with torch.no_grad():
            return self.candidate_scores(examples)

    def candidate_scores(self, examples):
        """scores() with autograd wherever the caller has it on (bench/adamw_anchor.py)."""
        seqs, units = [], 0
        for prompt, cands, _ in examples:
            seqs += self.rows(prompt, cands, units)
            units += len(cands)
        T = max(len(ids) for ids, _ in seqs)
        ids = torch.full((len(seqs), T), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), T), dtype=torch.long)
        b, t, target, unit = [], [], [], []
        for r, (s, pairs) in enumerate(seqs):
            ids[r, :len(s)] = torch.tensor(s)
            mask[r, :len(s)] = 1
            for q, y, u in pairs:
                b.append(r), t.append(q), target.append(y), unit.append(u)
        h = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        # Only the scored positions' distributions (not B x T x V logits).
        logits = self.model.get_output_embeddings()(h[torch.tensor(b), torch.tensor(t)])
        if self.cap:
            logits = torch.tanh(logits / self.cap) * self.cap
        self.forwards += 1
        logp = torch.log_softmax(logits.float(), dim=-1)
        tok_lp = logp.gather(-1, torch.tensor(target)[:, None]).squeeze(-1).double()
        unit = torch.tensor(unit)
        per_cand = (torch.zeros(units, dtype=torch.double).index_add_(0, unit, tok_lp) /
                    torch.bincount(unit, minlength=units))
        out, k = [], 0
        for prompt, cands, label in examples:
            out.append((per_cand[k:k + len(cands)].float(), label))
            k += len(cands)
        return out

    def loss(self, examples):
        return float(self.loss_tensor(self.scores(examples)))

    @staticmethod
    def loss_tensor(scored):
        """MeZO's classification objective: the mean cross-entropy over each example's
        candidates' scores, the correct one as the label."""
        return sum(torch.nn.functional.cross_entropy(v[None], torch.tensor([l]))
                   for v, l in scored) / len(scored)

    def accuracy(self, examples, batch):
        if not examples:
            return None
        right = 0
        for i in range(0, len(examples), batch):
            for v, l in self.scores(examples[i:i + batch]):
                right += int(torch.argmax(v)) == l
        return right / len(examples)


# ---- MeZO-SGD --------------------------------------------------------------------------------

class MeZO:
    def __init__(self, model, eps, lr, weight_decay):
        self.eps, self.lr, self.wd = eps, lr, weight_decay
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def perturb(self, seed, scale):
        g = torch.Generator().manual_seed(seed)
        for _, p in self.params:
            z = torch.normal(0, 1, size=p.shape, generator=g, dtype=p.dtype)
            p.data.add_(z, alpha=scale * self.eps)

    def update(self, seed, grad):
        g = torch.Generator().manual_seed(seed)
        for n, p in self.params:
            z = torch.normal(0, 1, size=p.shape, generator=g, dtype=p.dtype)
            # MeZO's rule: no decay on biases and layer norms (its names for them).
            decay = self.wd if ("bias" not in n and "layer_norm" not in n and
                                "layernorm" not in n) else 0.0
            p.data.add_(grad * z + decay * p.data, alpha=-self.lr)

    def step(self, loss, seed):
        self.perturb(seed, 1)
        lp = loss()
        self.perturb(seed, -2)
        lm = loss()
        self.perturb(seed, 1)
        grad = (lp - lm) / (2 * self.eps)
        self.update(seed, grad)
        return lp, lm, grad


def sample_examples(task, data, seed, n_train, n_val, n_eval):
    """MeZO's samples: n_train training and n_val validation examples from the task's training
    file, n_eval test examples (or all there are) from its validation file, drawn by a
    random.Random(seed), which is returned for the batch order."""
    train_file, test_file = (os.path.join(data, f) for f in TASKS[task][1:])
    pool = read_examples(task, train_file)
    test = read_examples(task, test_file)
    rng = random.Random(seed)
    pick = rng.sample(range(len(pool)), min(len(pool), n_train + n_val))
    train = [pool[i] for i in pick[:n_train]]
    val = [pool[i] for i in pick[n_train:]]
    test = [test[i] for i in sorted(rng.sample(range(len(test)), min(len(test), n_eval)))]
    return train, val, test, rng


def rss_peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 * 1.048576


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--data", required=True, help="the task's directory (../shared/assets/data/TASK)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--eps", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-examples", type=int, default=1000)
    p.add_argument("--val-examples", type=int, default=500)
    p.add_argument("--eval-examples", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=400, help="0: only at the start and the end")
    p.add_argument("--curve-on-test", action="store_true",
                   help="score the test sample at every evaluation too (zof's --eval-every scores "
                        "its held-out set, the task's validation file)")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the parameters themselves (bfloat16: no fp32 master, so small updates "
                        "round away and +-eps z does not restore exactly, unlike zof's bf16 "
                        "compute over an fp32 master: not like for like)")
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--share-prompt", action="store_true",
                   help="run candidates that differ only in one last token as one sequence of the "
                        "shared tokens (as zof does; MeZO runs one sequence per candidate)")
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    train, val, test, rng = sample_examples(a.task, a.data, a.seed, a.train_examples,
                                            a.val_examples, a.eval_examples)

    torch.manual_seed(a.seed)
    dtype = getattr(torch, a.dtype)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    model.eval()
    scorer = Scorer(model, tok, a.max_len, a.share_prompt)
    mezo = MeZO(model, a.eps, a.lr, a.weight_decay)
    common = {"impl": "pytorch-mezo", "task": a.task, "model": a.model, "dtype": a.dtype,
              "threads": torch.get_num_threads(), "seed": a.seed, "batch": a.batch,
              "lr": a.lr, "eps": a.eps, "share_prompt": a.share_prompt, "train": len(train), "val": len(val), "test": len(test)}

    def report(step, t_train, **kw):
        print(json.dumps(dict(common, step=step, train_forwards=2 * step,
                              train_seconds=round(t_train, 3), **kw)), flush=True)

    t_train = 0.0
    report(0, t_train, val_accuracy=scorer.accuracy(val, a.batch),
           test_accuracy=scorer.accuracy(test, a.batch) if a.curve_on_test else None)
    order, k = [], 0
    losses = []
    for step in range(1, a.steps + 1):
        if k + a.batch > len(order):  # a reshuffled epoch
            order, k = list(range(len(train))), 0
            rng.shuffle(order)
        batch = [train[i] for i in order[k:k + a.batch]]
        k += a.batch
        t0 = time.perf_counter()
        lp, lm, _ = mezo.step(lambda: scorer.loss(batch), a.seed * 1000003 + step)
        t_train += time.perf_counter() - t0
        losses.append(0.5 * (lp + lm))
        if (a.eval_every and step % a.eval_every == 0 and step < a.steps):
            report(step, t_train, train_loss=sum(losses) / len(losses),
                   val_accuracy=scorer.accuracy(val, a.batch),
                   test_accuracy=scorer.accuracy(test, a.batch) if a.curve_on_test else None)
            losses = []
    t0 = time.perf_counter()
    acc = scorer.accuracy(test, a.batch)
    report(a.steps, t_train, train_loss=sum(losses) / len(losses) if losses else None,
           val_accuracy=scorer.accuracy(val, a.batch), test_accuracy=acc,
           test_seconds=round(time.perf_counter() - t0, 3), rss_peak_mb=round(rss_peak_mb(), 1),
           torch=torch.__version__, transformers=transformers.__version__, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
