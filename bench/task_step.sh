#!/usr/bin/env bash
# The training step on MeZO's tasks, the product against its peer, side by side in one run:
# `zof finetune` (MeZO's protocol: classification objective, batch 16, --seq-len 256) and
# bench/mezo_task.py (the same protocol on transformers) in both of its modes: one sequence per
# candidate, as MeZO runs it, and --share-prompt (candidates that differ in one last token share
# one sequence of the prompt, as zof does), its best mode. Prints seconds a step (training time
# over the steps, evaluation excluded), each side's peak RSS and the ratios.
#   bash bench/task_step.sh
#   TASKS="sst2 rte" STEPS=20 THREADS=2 MODEL=... ZOF_BASELINE=/path/to/older/zof bash bench/task_step.sh
# ZOF_BASELINE: another zof binary (e.g. a build of an earlier commit) timed the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${ZOF_PYTHON:-build/venv/bin/python}
MODEL=${MODEL:-build/models/SmolLM2-135M-Instruct}
ASSETS=${ZOF_ASSETS:-../shared/assets}
TASKS=${TASKS:-"sst2 rte"}
STEPS=${STEPS:-20}
THREADS=${THREADS:-$(nproc)}
DTYPE=${DTYPE:-fp32}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-task-step.XXXXXX)}
mkdir -p "$OUTDIR"
[ -x build/zof ] || { echo "task_step.sh: build/zof is missing: run scripts/setup.sh" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "task_step.sh: MODEL $MODEL is not a directory (scripts/get_smollm2.sh makes SmolLM2's)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "task_step.sh: needs GNU time for peak RSS (apt-get install time)" >&2; exit 1; }
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "task_step.sh: $PY lacks torch or transformers (ZOF_PY_FULL=1 bash scripts/setup.sh installs them)" >&2; exit 1; }
torch_dtype=$([ "$DTYPE" = bf16 ] && echo bfloat16 || echo float32)
common=(--lr 1e-6 --eps 1e-3 --batch 16 --seed 0 --train-examples 1000)

echo "load before: $(uptime)" >&2
for task in $TASKS; do
  zofs=(zof)
  [ -n "${ZOF_BASELINE:-}" ] && zofs+=(baseline)
  for which in "${zofs[@]}"; do
    bin=build/zof
    [ "$which" = baseline ] && bin=$ZOF_BASELINE
    echo "== $task: $which ($bin)" >&2
    rm -rf "$OUTDIR/run-$task-$which"
    /usr/bin/time -f "%M" -o "$OUTDIR/$which-$task.rss" "$bin" finetune --model "$MODEL" \
      --task "$task" --data "$ASSETS/data/$task" --objective classification --steps "$STEPS" \
      "${common[@]}" --eval-examples 32 --threads "$THREADS" --seq-len 256 --dtype "$DTYPE" \
      --out "$OUTDIR/run-$task-$which" --no-report --json | tail -n 1 >"$OUTDIR/$which-$task.json"
    rm -rf "$OUTDIR/run-$task-$which"  # the saved model: not what is measured
  done
  for mode in plain share; do
    echo "== $task: PyTorch MeZO ($mode)" >&2
    "$PY" bench/mezo_task.py --model "$MODEL" --task "$task" --data "$ASSETS/data/$task" \
      --steps "$STEPS" "${common[@]}" --val-examples 0 --eval-examples 32 --eval-every 0 \
      --dtype "$torch_dtype" --threads "$THREADS" --max-len 256 \
      $([ "$mode" = share ] && echo --share-prompt) | tail -n 1 >"$OUTDIR/torch-$mode-$task.json"
  done
done
echo "load after: $(uptime)" >&2
echo "raw: $OUTDIR" >&2

"$PY" - "$OUTDIR" "$TASKS" "${ZOF_BASELINE:+1}" <<'PYEOF'
import json, os, sys
out, tasks, base = sys.argv[1], sys.argv[2].split(), sys.argv[3] == "1"
print("| task | run | s/step | peak RSS MB | zof's speed-up over it |")
print("|---|---|---:|---:|---:|")  # MB: 10^6 bytes (time's %M is KiB; the peer's are MB)
for t in tasks:
    z = json.load(open(f"{out}/zof-{t}.json"))
    rows = [("zof", z["train_s"] / z["steps"], int(open(f"{out}/zof-{t}.rss").read()) * 1024 / 1e6)]
    if base:
        b = json.load(open(f"{out}/baseline-{t}.json"))
        rows.append(("zof baseline (ZOF_BASELINE)", b["train_s"] / b["steps"],
                     int(open(f"{out}/baseline-{t}.rss").read()) * 1024 / 1e6))
    for mode, name in (("plain", "MeZO (PyTorch), one sequence per candidate"),
                       ("share", "MeZO (PyTorch) --share-prompt")):
        p = json.load(open(f"{out}/torch-{mode}-{t}.json"))
        rows.append((name, p["train_seconds"] / p["step"], p["rss_peak_mb"]))
    for name, s, rss in rows:
        ratio = "" if name == "zof" else f"{s / rows[0][1]:.2f}x"
        print(f"| {t} | {name} | {s:.2f} | {rss:.0f} | {ratio} |")
PYEOF
