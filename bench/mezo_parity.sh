#!/usr/bin/env bash
# MeZO parity: zof's SPSA fine-tuning and MeZO's protocol in PyTorch (bench/mezo_task.py) on the
# same model, tasks, hyper-parameters and held-out examples, each task and seed back to back, and
# a markdown table of the held-out accuracy before (zero-shot) and after, the forward passes and
# the training time.
#   MODEL=build/models/SmolLM2-135M-Instruct bench/mezo_parity.sh          # defaults below
#   TASKS="sst2" SEEDS="0" STEPS=200 EVAL_EVERY=100 bench/mezo_parity.sh   # a short check
# Variables: MODEL TASKS SEEDS STEPS LR EPS BATCH EVAL_EVERY DTYPE (fp32|bf16; PyTorch's bf16
# has no fp32 master, zof's has: fp32 is the like-for-like comparison) THREADS TRAIN_EXAMPLES. Both sides score the task's whole validation file (SST-2's dev.tsv: 872; RTE:
# 277; CB: 56), so their held-out sets are the same examples; their training samples, batch
# orders and z are their own (zof's Philox, torch's generator): a comparison is across seeds,
# not bit for bit. ZOF_PYTHON: the Python with torch and transformers (default build/venv's).
# Raw output goes to $ZOF_BENCH_OUT (default a fresh temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
# The whole script is read before it runs (a brace group ending in exit): an edit of this file
# during a run of hours cannot shift what bash reads next.
{

PY=${ZOF_PYTHON:-build/venv/bin/python}
MODEL=${MODEL:-build/models/SmolLM2-135M-Instruct}
ASSETS=${ZOF_ASSETS:-../shared/assets}
TASKS=${TASKS:-"sst2 rte cb"}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-2000}
LR=${LR:-1e-6}
EPS=${EPS:-1e-3}
BATCH=${BATCH:-16}
EVAL_EVERY=${EVAL_EVERY:-400}
DTYPE=${DTYPE:-fp32}
THREADS=${THREADS:-$(nproc)}
TRAIN_EXAMPLES=${TRAIN_EXAMPLES:-1000}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-mezo-parity.XXXXXX)}
mkdir -p "$OUTDIR"
[ -x build/zof ] || { echo "mezo_parity.sh: build/zof is missing: run scripts/setup.sh" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "mezo_parity.sh: MODEL $MODEL is not a directory (scripts/get_smollm2.sh makes SmolLM2's)" >&2; exit 1; }
torch_dtype=$([ "$DTYPE" = bf16 ] && echo bfloat16 || echo float32)

held_out() {  # the task's validation file's examples
  case "$1" in
    sst2) echo $(($(wc -l <"$ASSETS/data/sst2/dev.tsv") - 1)) ;;
    *) grep -c . "$ASSETS/data/$1/val.jsonl" ;;
  esac
}

echo "load before: $(uptime)" >&2
for task in $TASKS; do
  n=$(held_out "$task")
  for seed in $SEEDS; do
    run="$OUTDIR/zof-$task-$seed"
    echo "== $task seed $seed: zof ($n held-out)" >&2
    rm -rf "$run"
    build/zof finetune --model "$MODEL" --task "$task" --data "$ASSETS/data/$task" \
      --objective classification --steps "$STEPS" --lr "$LR" --eps "$EPS" --batch "$BATCH" \
      --seed "$seed" --train-examples "$TRAIN_EXAMPLES" --eval-examples "$n" \
      --eval-every "$EVAL_EVERY" --dtype "$DTYPE" --threads "$THREADS" --seq-len 256 \
      --out "$run" --no-report --json | tail -n 1 >"$run.json"
    echo "== $task seed $seed: PyTorch MeZO" >&2
    "$PY" bench/mezo_task.py --model "$MODEL" --task "$task" --data "$ASSETS/data/$task" \
      --steps "$STEPS" --lr "$LR" --eps "$EPS" --batch "$BATCH" --seed "$seed" \
      --train-examples "$TRAIN_EXAMPLES" --val-examples 0 --eval-examples "$n" \
      --eval-every "$EVAL_EVERY" --curve-on-test --dtype "$torch_dtype" --threads "$THREADS" \
      --max-len 256 >"$OUTDIR/torch-$task-$seed.jsonl"
  done
done
echo "load after: $(uptime)" >&2
echo "raw: $OUTDIR" >&2

"$PY" - "$OUTDIR" "$TASKS" "$SEEDS" <<'EOF'
import json, statistics, sys
out, tasks, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print("| task | impl | seeds | zero-shot | after | forward passes | train s/step |")
print("|---|---|---|---|---|---|---|")
def ms(v):
    return "%.1f" % (100 * statistics.mean(v)) + ("" if len(v) < 2 else " ± %.1f" % (100 * statistics.stdev(v)))
bad = []
for t in tasks:
    z = [json.load(open(f"{out}/zof-{t}-{s}.json")) for s in seeds]
    p = [[json.loads(l) for l in open(f"{out}/torch-{t}-{s}.jsonl")] for s in seeds]
    # The same protocol: before any step both score the same held-out examples with the same
    # prompts and tokens, so their zero-shot accuracies agree but for a near-tie (one example)
    # falling the other way between two implementations.
    n = p[0][0]["test"]
    for s, a, b in zip(seeds, z, p):
        if abs(a["eval"]["before"] - b[0]["test_accuracy"]) * n > 1 + 1e-9:
            bad.append(f"{t} seed {s}: zero-shot {a['eval']['before']:.4f} (zof) vs "
                       f"{b[0]['test_accuracy']:.4f} (PyTorch) on {n} examples")
    steps = z[0]["steps"]
    print(f"| {t} | zof | {len(seeds)} | {ms([r['eval']['before'] for r in z])} | "
          f"{ms([r['eval']['after'] for r in z])} | {2 * steps} | "
          f"{statistics.mean(r['train_s'] for r in z) / max(steps, 1):.2f} |")
    psteps = p[0][-1]["step"]
    print(f"| {t} | PyTorch MeZO | {len(seeds)} | {ms([r[0]['test_accuracy'] for r in p])} | "
          f"{ms([r[-1]['test_accuracy'] for r in p])} | {p[0][-1]['train_forwards']} | "
          f"{statistics.mean(r[-1]['train_seconds'] for r in p) / max(psteps, 1):.2f} |")
for b in bad:
    print("mezo_parity.sh: the two protocols differ: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
exit
}
