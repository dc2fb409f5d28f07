#!/usr/bin/env python3
"""Estimators and optimizers compared at an equal budget of forward passes.

Runs `zof finetune` once per variant on the same task (default: stories260K on Tiny Shakespeare,
as scripts/demo.sh) with the same seed, batch and evaluation, giving each variant the number of
steps that spends the same number of forward passes:
  two-point SPSA: 2q passes per step; one-sided: q + 1; JVP: 1 pass that also carries a tangent
  (costlier than a plain forward: the wall-time column shows by how much).
Writes, into --out: curves.csv (variant, step, forward passes, training loss, held-out ppl where
evaluated), report.html (`zof report` over every variant's run: the curves against steps and
forward passes) and table.md (final held-out ppl, wall time, peak memory, command), and prints
the table.

  python3 bench/zo_study.py                      # defaults: 2000 forward passes per variant
  python3 bench/zo_study.py --passes 4000 --only spsa,adam
  python3 bench/zo_study.py --lr-scale 2 --out runs/study-x2   # one point of a learning-rate sweep
"""
import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name, flags, forward passes per step (q = queries)
VARIANTS = [
    ("spsa", "--lr 1e-4", lambda q: 2 * q),
    ("spsa-q4", "--lr 1e-4 --queries 4", lambda q: 2 * q),
    ("one-sided", "--lr 1e-4 --one-sided", lambda q: q + 1),
    ("rademacher", "--lr 1e-4 --z rademacher", lambda q: 2 * q),
    ("sparse-0.75", "--lr 2e-4 --sparsity 0.75", lambda q: 2 * q),
    ("momentum", "--lr 2e-5 --optimizer momentum --beta1 0.9", lambda q: 2 * q),
    ("adam", "--lr 1e-3 --optimizer adam --beta1 0.9 --beta2 0.999", lambda q: 2 * q),
    ("jvp", "--lr 1e-4 --estimator jvp", lambda q: q),
    # LOZO: each matrix's z of rank 2 (or 8), V redrawn every 50 steps
    ("low-rank-2", "--lr 1e-4 --low-rank 2", lambda q: 2 * q),
    ("low-rank-8", "--lr 1e-4 --low-rank 8", lambda q: 2 * q),
]


def queries_of(flags):
    f = flags.split()
    return int(f[f.index("--queries") + 1]) if "--queries" in f else 1


def scale_lr(flags, k):
    f = flags.split()
    i = f.index("--lr") + 1
    f[i] = f"{float(f[i]) * k:g}"
    return " ".join(f)


def run_variant(a, name, flags, per_step):
    flags = scale_lr(flags, a.lr_scale)
    q = queries_of(flags)
    steps = max(1, a.passes // per_step(q))
    out = os.path.join(a.out, name)
    eval_every = max(1, steps // 4)
    cmd = [a.zof, "finetune", "--model", a.model, "--task", "text", "--data", a.data, "--out", out,
           "--steps", str(steps), "--batch", str(a.batch), "--seq-len", str(a.seq_len),
           "--eps", "1e-3", "--eval-examples", str(a.eval_examples), "--eval-every", str(eval_every),
           "--seed", str(a.seed), "--threads", str(a.threads), "--json"] + flags.split()
    print(f"== {name}: {steps} steps x {per_step(q)} passes", file=sys.stderr, flush=True)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    log_out, log_err = out + ".stdout", out + ".stderr"
    with open(log_out, "w") as fo, open(log_err, "w") as fe:
        child = subprocess.Popen(cmd, stdout=fo, stderr=fe)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    stdout, stderr = open(log_out).read(), open(log_err).read()
    if child.returncode != 0:
        raise SystemExit(f"{name} failed ({child.returncode}):\n{stderr[-2000:]}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j["type"] == "step" and j.get("loss") is not None:
                rows.append((j["step"] + 1, (j["step"] + 1) * per_step(q), j["loss"], ""))
            elif j["type"] == "eval":
                rows.append((j["step"], j["step"] * per_step(q), "", j["value"]))
    return {
        "name": name, "flags": flags, "steps": steps, "per_step": per_step(q), "rows": rows,
        "before": summary["eval"]["before"], "after": summary["eval"]["after"],
        "train_s": summary["train_s"], "wall_s": wall,
        "peak_mb": usage.ru_maxrss / 1024 * 1.048576,
        "cmd": " ".join(shlex.quote(c) for c in cmd),
    }


def report(a, results):
    """The curves through `zof report`, the one way zof draws runs: every variant's run overlaid
    (training loss raw and smoothed, held-out ppl, against steps and forward passes)."""
    out = os.path.join(a.out, "report.html")
    runs = [os.path.join(a.out, r["name"]) for r in results]
    subprocess.run([a.zof, "report", *runs, "--out", out], check=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    assets = os.path.join(ROOT, "..", "shared", "assets")
    p.add_argument("--zof", default=os.path.join(ROOT, "build", "zof"))
    p.add_argument("--model", default=os.path.join(assets, "models", "stories260K"))
    p.add_argument("--data", default=os.path.join(assets, "data", "tinyshakespeare", "input.txt"))
    p.add_argument("--out", default="runs/study")
    p.add_argument("--passes", type=int, default=2000, help="forward passes per variant")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--eval-examples", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--lr-scale", type=float, default=1.0,
                   help="multiply every variant's learning rate (for a sweep: run 0.5, 1, 2)")
    a = p.parse_args()
    if not os.path.exists(a.zof):
        raise SystemExit(f"{a.zof} not found: build it first (bash scripts/build.sh zof)")
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    results = [run_variant(a, n, f, ps) for n, f, ps in VARIANTS if not only or n in only]
    with open(os.path.join(a.out, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "step", "forward_passes", "train_loss", "heldout_ppl"])
        for r in results:
            for row in r["rows"]:
                w.writerow([r["name"], *row])
    page = report(a, results)
    lines = [f"Budget: {a.passes} forward passes per variant; batch {a.batch} x {a.seq_len} tokens; "
             f"held-out ppl on {a.eval_examples} windows.", "",
             "| variant | flags | steps | passes/step | held-out ppl before | after | train s | wall s "
             "| peak RSS MB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['name']} | `{r['flags']}` | {r['steps']} | {r['per_step']} | "
                     f"{r['before']:.1f} | {r['after']:.1f} | {r['train_s']:.1f} | "
                     f"{r['wall_s']:.1f} | {r['peak_mb']:.0f} |")
    lines += ["", f"Curves: {page} (zof report)", "", "Commands:", ""] + \
        [f"    {r['cmd']}" for r in results]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
