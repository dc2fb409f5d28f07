#!/usr/bin/env bash
# Learning in bf16 (issue 14): the demo's run (stories260K on Tiny Shakespeare, the settings of
# scripts/demo.sh) with fp32 products, with bf16 products (fp32 master weights), and with a bf16
# master (fp32 products: --master bf16, updates rounded back stochastically: master_bf16 with
# the default rounding window, --round-every auto = 8; master_bf16_every1 rounding every update,
# --round-every 1), same seed, through zof finetune itself. Prints one row per run (held-out perplexity before and after, the
# last training loss, tokens/s, the unit the bf16 products ran on) and the bf16 run's perplexity
# against fp32's; the curves' data (held-out perplexity every --eval-every steps, the training
# loss of every step) are each run's metrics.jsonl under --out.
# --estimator jvp: the same runs with the forward gradient (its bf16 runs round the primal's and
# the tangent's matrix products; no rounding window applies to it, so master_bf16 rounds every
# step like master_bf16_every1).
#   bash bench/dtype_study.sh [--steps N] [--seed S] [--eval-every N] [--threads T] [--out DIR]
#                             [--estimator spsa|jvp]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=../shared/assets/models/stories260K DATA=../shared/assets/data/tinyshakespeare/input.txt
STEPS=1000 SEED=0 EVERY=250 THREADS=0 OUT=build/dtype_study ESTIMATOR=spsa
while (($#)); do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;; --seed) SEED=$2; shift 2 ;; --eval-every) EVERY=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;; --out) OUT=$2; shift 2 ;;
    --estimator) ESTIMATOR=$2; shift 2 ;;
    *) echo "dtype_study.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x build/zof ] || { echo "dtype_study.sh: build/zof is missing: build first" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
for d in fp32 bf16 master_bf16 master_bf16_every1; do
  case $d in
    master_bf16) flags=(--dtype fp32 --master bf16) ;;
    master_bf16_every1) flags=(--dtype fp32 --master bf16 --round-every 1) ;;
    *) flags=(--dtype "$d") ;;
  esac
  build/zof finetune --model "$MODEL" --task text --data "$DATA" --out "$OUT/$d" \
    --steps "$STEPS" --batch 16 --seq-len 128 --lr 1e-4 --eps 1e-3 --eval-examples 64 \
    --eval-every "$EVERY" --seed "$SEED" --threads "$THREADS" --estimator "$ESTIMATOR" \
    "${flags[@]}" --no-report \
    > "$OUT/$d.json" 2> "$OUT/$d.log"
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
rows = {}
RUNS = ("fp32", "bf16", "master_bf16", "master_bf16_every1")
print("| run | held-out ppl before | after | last train loss | tokens/s | unit |")
print("|---|---:|---:|---:|---:|---|")
for d in RUNS:
    s = json.loads(open(os.path.join(out, d + ".json")).read().strip().splitlines()[-1])
    rows[d] = s
    print(f"| {d} | {s['eval']['before']:.4f} | {s['eval']['after']:.4f} | {s['train_loss']:.4f} "
          f"| {s['tokens_per_s']:.0f} | {s['compute']['unit']} |")
a32 = rows["fp32"]["eval"]["after"]
for d in RUNS[1:]:
    a = rows[d]["eval"]["after"]
    print(f"\n{d} / fp32 held-out perplexity after the run: {a / a32:.4f} ({(a / a32 - 1):+.2%})")
print("\nheld-out perplexity by step (the curves' data; metrics.jsonl has every step's loss):")
curves = {}
for d in RUNS:
    for line in open(os.path.join(out, d, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("type") == "eval":
            curves.setdefault(j["step"], {})[d] = j["value"]
print("| step | " + " | ".join(RUNS) + " |")
print("|---:|" + "---:|" * len(RUNS))
for step in sorted(curves):
    c = curves[step]
    print(f"| {step} | " + " | ".join(f"{c.get(d, float('nan')):.4f}" for d in RUNS) + " |")
PY
