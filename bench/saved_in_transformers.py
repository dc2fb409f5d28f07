#!/usr/bin/env python3
"""Transformers loads zof's fine-tuned models and scores what zof's evaluation scores.

For each task and master dtype (fp32, bf16): `zof finetune` a few steps with a learning rate large
enough to move the held-out accuracy, its saved directory (model.safetensors in the master's
dtype, config.json, the tokenizer) loaded by transformers' AutoModelForCausalLM and
AutoTokenizer, and the task's whole validation file scored by both: `zof eval --task --dtype fp32`
and bench/mezo_task.py's Scorer (MeZO's templates and classification scoring, written on
transformers) in float32. The same weights in fp32 on both sides, so the accuracies agree but for
a near-tie between two implementations (one example at most, as bench/mezo_parity.sh allows for
the zero-shot); the zero-shot accuracy is printed beside them to show the saved weights are not
the base model's. Exit status 1 when a pair differs by more.

    build/venv/bin/python bench/saved_in_transformers.py           # SmolLM2, sst2 rte cb
    build/venv/bin/python bench/saved_in_transformers.py --tasks sst2 --steps 5

Needs torch and transformers in the Python that runs it (ZOF_PY_FULL=1 bash scripts/setup.sh).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import mezo_task  # noqa: E402  (MeZO's templates and scoring on transformers)


def zof(cli, *args):
    r = subprocess.run([str(cli), *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("saved_in_transformers.py: zof %s failed (%d): %s"
                         % (args[0], r.returncode, (r.stderr or r.stdout).strip()[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def transformers_accuracy(model_dir, task, examples, batch):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        stored = {f.get_slice(k).get_dtype() for k in f.keys()}
    return mezo_task.Scorer(model, tok, 256, share_prompt=True).accuracy(examples, batch), stored


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "build/models/SmolLM2-135M-Instruct"))
    p.add_argument("--assets", default=os.environ.get("ZOF_ASSETS", str(REPO.parent / "shared/assets")))
    p.add_argument("--tasks", nargs="+", default=["sst2", "rte", "cb"])
    p.add_argument("--masters", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-4,
                   help="large on purpose: the point is a saved model whose accuracy moved")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--cli", default=str(REPO / "build/zof"))
    p.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = pathlib.Path(a.out or tempfile.mkdtemp(prefix="zof-saved-"))
    out.mkdir(parents=True, exist_ok=True)
    print("model %s, %d steps at lr %g, %d threads, torch %s; runs in %s"
          % (a.model, a.steps, a.lr, a.threads, torch.__version__, out), file=sys.stderr)
    print("| task | master | saved tensors | examples | zero-shot (zof) | zof eval | transformers "
          "| differ by | transformers s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    bad = []
    for task in a.tasks:
        data = pathlib.Path(a.assets) / "data" / task
        examples = mezo_task.read_examples(task, str(data / mezo_task.TASKS[task][2]))
        n = str(len(examples))
        common = ["--task", task, "--data", str(data), "--eval-examples", n, "--seq-len", "256",
                  "--threads", str(a.threads)]
        base = zof(a.cli, "eval", "--model", a.model, "--dtype", "fp32", *common)["value"]
        for master in a.masters:
            run = out / ("%s-%s" % (task, master))
            zof(a.cli, "finetune", "--model", a.model, "--objective", "classification",
                "--steps", str(a.steps), "--lr", str(a.lr), "--batch", "16", "--master", master,
                "--eval-every", "0", "--out", str(run), "--no-report", *common)
            ours = zof(a.cli, "eval", "--model", str(run), "--dtype", "fp32", *common)["value"]
            t0 = time.perf_counter()
            theirs, stored = transformers_accuracy(str(run), task, examples, 16)
            secs = time.perf_counter() - t0
            differ = round(abs(ours - theirs) * len(examples))
            print("| %s | %s | %s | %d | %.4f | %.4f | %.4f | %d | %.0f |"
                  % (task, master, "/".join(sorted(stored)), len(examples), base, ours, theirs,
                     differ, secs), flush=True)
            if differ > 1:
                bad.append("%s %s: zof %.4f, transformers %.4f on %d examples"
                           % (task, master, ours, theirs, len(examples)))
    for b in bad:
        print("saved_in_transformers.py: the scores differ: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
