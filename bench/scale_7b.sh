#!/usr/bin/env bash
# A LLaMA-2-7B-shaped model (random weights, 6.74B parameters) taking ZO steps on this machine
# with a bf16 master held in 2 bytes a parameter (zo_step_bench --model-config llama2-7b
# --master bf16: the trainer's own step, ZOEngine, as zof finetune runs it on the CPU). An fp32
# master would need 27 GB for the weights alone. Prints one markdown row: peak RSS against the
# machine's memory, seconds per step, tokens/s, and the split of the step. ROUND_EVERY (default
# 8, zof finetune's auto for a bf16 master's ZO-SGD; 1: every update rounded) is the rounding
# window; the timed steps (ITERS, default the window) then cover each of its positions once.
#   bench/scale_7b.sh                                  # batch 1 x 16, bf16 products, every core
#   SHAPES="1x16 1x64" DTYPE=fp32 ITERS=3 bench/scale_7b.sh
#   FINETUNE=1 bench/scale_7b.sh    # then the product end to end: random_model writes the 7B
#                                   # shape in bf16 (13.5 GB), zof finetune trains it 3 steps with
#                                   # evaluations, checkpoint and save, zof replay rebuilds it
#                                   # (needs ~45 GB of disk under $ZOF_BENCH_OUT)
# ZOF_BUILD_DIR: where to build (default build/). Raw JSON lines go to $ZOF_BENCH_OUT (default a
# fresh temp dir). Not in CI (minutes, and 15 GB of memory).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${ZOF_BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
SHAPES=${SHAPES:-"1x16"}
DTYPE=${DTYPE:-bf16}
ROUND_EVERY=${ROUND_EVERY:-8}
WARMUP=${WARMUP:-1}
ITERS=${ITERS:-$((ROUND_EVERY > 2 ? ROUND_EVERY : 2))}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-7b.XXXXXX)}
mkdir -p "$OUTDIR"
RAW="$OUTDIR/scale_7b.jsonl"
: >"$RAW"

. bench/lib.sh
build_targets -- zo_step_bench random_model zof

mem_total=$(awk '/^MemTotal:/ {print $2 * 1024}' /proc/meminfo)
echo "load before: $(uptime)" >&2
for shape in $SHAPES; do
  B=${shape%x*}
  T=${shape#*x}
  echo "== llama2-7b $shape $DTYPE products, bf16 master rounded every $ROUND_EVERY steps" >&2
  "$BUILD/zo_step_bench" --model-config llama2-7b --master bf16 --round-every "$ROUND_EVERY" \
    --dtype "$DTYPE" --batch "$B" \
    --seq "$T" --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS" --json |
    tee /dev/stderr | tail -n 1 >>"$RAW"
done
echo "load after: $(uptime)" >&2

python3 - "$RAW" "$mem_total" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mem = float(sys.argv[2])
print("| model | params | master | rounded every | products | B x T | peak RSS | of memory | s/step "
      "| tokens/s | forwards | parameter passes |")
print("|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {r['params'] / 1e9:.2f}B | {r['master_storage']} "
          f"({r['model_mb'] / 1e3:.1f} GB) | {r['round_every']} | {r['dtype']} ({r['unit']}) "
          f"| {r['batch']} x {r['seq']} "
          f"| {r['rss_peak_mb'] / 1e3:.2f} GB | {100 * r['rss_peak_mb'] * 1e6 / mem:.0f}% "
          f"| {r['step_ms'] / 1e3:.1f} | {r['tokens_per_s']:.1f} | {r['forward_ms'] / 1e3:.1f} s "
          f"| {r['param_pass_ms'] / 1e3:.1f} s |")
EOF
echo "raw: $RAW" >&2

if [[ ${FINETUNE:-0} == 1 ]]; then
  ASSETS=${ZOF_ASSETS:-../shared/assets}
  M="$OUTDIR/llama2-7b-random"
  rm -rf "$M" "$OUTDIR/run" "$OUTDIR/replayed"
  "$BUILD/random_model" --model-config llama2-7b --dtype bf16 --out "$M" \
    --tokenizer-from "$ASSETS/models/stories260K" >&2
  peak() { awk '/Maximum resident/ {printf "%.2f GB", $6 * 1024 / 1e9}' "$1"; }
  /usr/bin/time -v "$BUILD/zof" finetune --model "$M" --task text \
    --data "$ASSETS/data/tinyshakespeare/input.txt" --out "$OUTDIR/run" --steps 3 --batch 1 \
    --seq-len 16 --master bf16 --dtype "$DTYPE" --eval-examples 2 --lr 1e-6 \
    --threads "$THREADS" >"$OUTDIR/finetune.json" 2>"$OUTDIR/finetune.err"
  /usr/bin/time -v "$BUILD/zof" replay --model "$M" --log "$OUTDIR/run" --out "$OUTDIR/replayed" \
    >/dev/null 2>"$OUTDIR/replay.err"
  same=no
  cmp -s "$OUTDIR/run/model.safetensors" "$OUTDIR/replayed/model.safetensors" && same=yes
  echo
  echo "| command | peak RSS | wall |"
  echo "|---|---:|---:|"
  echo "| zof finetune (3 steps, 2 evaluations, checkpoint, save) | $(peak "$OUTDIR/finetune.err") | $(awk '/Elapsed/ {print $8}' "$OUTDIR/finetune.err") |"
  echo "| zof replay (byte-identical model: $same) | $(peak "$OUTDIR/replay.err") | $(awk '/Elapsed/ {print $8}' "$OUTDIR/replay.err") |"
fi
