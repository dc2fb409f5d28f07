#!/usr/bin/env bash
# MeZO's two training objectives on SST-2 (issue 17): --objective lm (the correct answer's
# tokens) against --objective classification (cross-entropy over the candidates), same seeds,
# learning rates and budget, through zof finetune itself. Prints one row per run (held-out
# accuracy before and after, the last training loss) and the mean over seeds per setting.
#   bash bench/objective_study.sh [--model DIR] [--steps N] [--seeds "1 2 3"] [--lrs "1e-4"]
#                                 [--batch B] [--train N] [--eval N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=../shared/assets/models/stories260K DATA=../shared/assets/data/sst2
STEPS=1000 SEEDS="1 2 3" LRS="1e-4" BATCH=16 TRAIN=1000 EVAL=500 OUT=build/objective_study
while (($#)); do
  case "$1" in
    --model) MODEL=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;; --seeds) SEEDS=$2; shift 2 ;;
    --lrs) LRS=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;; --train) TRAIN=$2; shift 2 ;;
    --eval) EVAL=$2; shift 2 ;; --out) OUT=$2; shift 2 ;;
    *) echo "objective_study.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x build/zof ] || { echo "objective_study.sh: build/zof is missing: build first" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
printf "%-15s %-7s %-5s %-9s %-9s %-10s %s\n" objective lr seed acc_before acc_after train_loss seconds
for obj in lm classification; do
  for lr in $LRS; do
    for seed in $SEEDS; do
      run="$OUT/$obj-$lr-$seed"
      t0=$SECONDS
      build/zof finetune --model "$MODEL" --task sst2 --data "$DATA" --out "$run" \
        --objective "$obj" --steps "$STEPS" --batch "$BATCH" --seq-len 64 --lr "$lr" \
        --eps 1e-3 --seed "$seed" --train-examples "$TRAIN" --eval-examples "$EVAL" \
        --threads 1 --no-report > "$run.json" 2> "$run.log"
      python3 - "$obj" "$lr" "$seed" "$((SECONDS - t0))" "$run.json" <<'PY'
import json, sys
obj, lr, seed, secs, path = sys.argv[1:]
s = json.loads(open(path).read().strip().splitlines()[-1])
print(f"{obj:<15} {lr:<7} {seed:<5} {s['eval']['before']:<9.3f} {s['eval']['after']:<9.3f} "
      f"{s['train_loss']:<10.4f} {secs}")
PY
    done
  done
done | tee "$OUT/table.txt"
python3 - "$OUT/table.txt" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 7 and f[0] != "objective":
        rows[(f[0], f[1])].append((float(f[3]), float(f[4])))
print("\nmean over seeds")
print(f"{'objective':<15} {'lr':<7} {'runs':<5} {'acc_before':<10} {'acc_after':<10} change")
for (obj, lr), v in rows.items():
    b = sum(x for x, _ in v) / len(v); a = sum(y for _, y in v) / len(v)
    print(f"{obj:<15} {lr:<7} {len(v):<5} {b:<10.3f} {a:<10.3f} {a - b:+.3f}")
PY
