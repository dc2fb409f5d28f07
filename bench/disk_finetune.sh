#!/usr/bin/env bash
# `zof finetune` on a model larger than the memory it may use, with no memory flag: a
# LLaMA-shaped model with random weights (bf16 file, bf16 master) fine-tuned inside a memory
# cgroup smaller than the model. The run's --host-mem default reads the cgroup's limit, loads the
# model block by block into the disk tier, and evaluates, checkpoints and saves through it. The
# script prints the run's own lines, its phase times (from the run's logs), the disk traffic and
# the peak resident set beside the model's size and the limit; a last line checks the saved
# model against the base with the run's own fingerprints.
#   bash bench/disk_finetune.sh [CONFIG] [LIMIT] [DIR] [OPTIMIZER]
#     CONFIG: a built-in shape of build/random_model (default llama2-7b: 13.5 GB in bf16;
#             tinyllama-1b: 2.2 GB)
#     LIMIT:  the cgroup's memory limit in bytes, or with a G suffix (default 4G)
#     DIR:    where the model, the run and the tier's store go (default /tmp/zof-disk-finetune;
#             it needs four times the model's bytes free: model, the store's two slots and
#             saved model; with momentum or Adam, the store also holds 4 or 8 bytes a parameter
#             twice)
#     OPTIMIZER: sgd (default), momentum or adam: the state travels with its blocks through the
#             store, and the checkpoint's optimizer.safetensors holds only the resident blocks'
# The cgroup needs a writable cgroup file system (v1 or v2; as root in a container it is); where
# there is none the run goes without a limit and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-llama2-7b}
LIMIT=${2:-4G}
DIR=${3:-/tmp/zof-disk-finetune}
OPTIMIZER=${4:-sgd}
case "$LIMIT" in *G) LIMIT=$(( ${LIMIT%G} * 1024 * 1024 * 1024 ));; esac
ZOF=build/zof
ASSETS=${ZOF_ASSETS:-../shared/assets}
[ -x "$ZOF" ] && [ -x build/random_model ] || { echo "build zof first (cmake --build build)" >&2; exit 1; }
mkdir -p "$DIR"
MODEL="$DIR/$CONFIG-bf16"
if [ ! -f "$MODEL/model.safetensors" ]; then
  rm -rf "$MODEL"
  echo "== writing $MODEL (random weights, bf16)"
  /usr/bin/time -f "   %e s, peak RSS %M KB" build/random_model --model-config "$CONFIG" \
    --dtype bf16 --out "$MODEL" --tokenizer-from "$ASSETS/models/stories260K"
fi
model_bytes=$(stat -c %s "$MODEL/model.safetensors")

# A memory cgroup of LIMIT bytes under this process's own, v2 or v1.
CG=""
if grep -q '^0::' /proc/self/cgroup && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  base=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
  CG="$base/zof-disk-finetune-$$"
  { mkdir "$CG" && echo "$LIMIT" > "$CG/memory.max"; } 2>/dev/null || CG=""
fi
if [ -z "$CG" ] && grep -q ':memory:' /proc/self/cgroup; then
  base=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
  CG="$base/zof-disk-finetune-$$"
  { mkdir "$CG" && echo "$LIMIT" > "$CG/memory.limit_in_bytes"; } 2>/dev/null || CG=""
fi
cleanup() { [ -n "$CG" ] && rmdir "$CG" 2>/dev/null || true; }
trap cleanup EXIT

RUN="$DIR/run"
rm -rf "$RUN"
ARGS=(finetune --model "$MODEL" --task text --data "$ASSETS/data/tinyshakespeare/input.txt"
      --out "$RUN" --steps 2 --batch 1 --seq-len 32 --lr 1e-6 --master bf16 --dtype bf16
      --eval-examples 2 --eval-every 2 --save-every 2 --optimizer "$OPTIMIZER" --no-report --json)
echo "== zof ${ARGS[*]}"
# The run's lines, each with the seconds since the start (what the phases took).
stamp() {
  local t0=${EPOCHREALTIME/./} line
  while IFS= read -r line; do
    local t=${EPOCHREALTIME/./}
    printf '%7.1f s  %s\n' "$(( (t - t0) / 100000 ))e-1" "$line"
  done
}
if [ -n "$CG" ]; then
  echo "   in memory cgroup $CG: limit $LIMIT bytes; the model file is $model_bytes bytes"
  start=$(date +%s.%N)
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$ZOF" "${ARGS[@]}" \
    > "$DIR/out.json" 2> >(stamp > "$DIR/err.txt") || { sleep 1; cat "$DIR/err.txt"; exit 1; }
else
  echo "   (no writable memory cgroup here: the run has no limit; the model file is $model_bytes bytes)"
  start=$(date +%s.%N)
  "$ZOF" "${ARGS[@]}" > "$DIR/out.json" 2> >(stamp > "$DIR/err.txt") || { sleep 1; cat "$DIR/err.txt"; exit 1; }
fi
end=$(date +%s.%N)
sleep 1  # the stamper's last lines
cat "$DIR/err.txt"
python3 - "$RUN" "$DIR/out.json" "$model_bytes" "$LIMIT" "$start" "$end" "${CG:+1}" "$OPTIMIZER" <<'EOF'
import json, os, sys
run, out, model_bytes, limit, start, end, limited, optimizer = sys.argv[1:9]
model_bytes, limit, start, end = int(model_bytes), int(limit), float(start), float(end)
s = json.load(open(run + "/summary.json"))
d = s["disk_tier"]
evals = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"eval"' in l]
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"type": "step"' in l or '"type":"step"' in l]
print()
print("| what | value |")
print("|---|---|")
print(f"| model file (bf16) | {model_bytes / 1e9:.2f} GB |")
print(f"| memory limit (cgroup) | {limit / 1e9:.2f} GB{'' if limited else ' (not applied: no cgroup)'} |")
print(f"| --host-mem (default from the limit) | {d['host_mem'] / 1e9:.2f} GB |")
print(f"| blocks on disk | {d['blocks_on_disk']} |")
print(f"| peak RSS | {s['peak_rss_bytes'] / 1e9:.2f} GB |")
print(f"| wall time, whole run | {end - start:.1f} s |")
print(f"| evaluation (each) | {', '.join('%.1f s' % e['eval_s'] for e in evals)} |")
print(f"| steps: train_s | {s['train_s']:.1f} s for {s['steps']} steps |")
print(f"| tier traffic, from the load to the last checkpoint: read / written | {d['bytes_read'] / 1e9:.1f} / {d['bytes_written'] / 1e9:.1f} GB |")
print(f"| held-out ppl before -> after | {s['eval']['before']:.2f} -> {s['eval']['after']:.2f} |")
planes = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
if planes:
    ck = [c for c in os.listdir(run) if c.startswith("checkpoint-")][0]
    opt_bytes = os.path.getsize(os.path.join(run, ck, "optimizer.safetensors"))
    whole = planes * 4 * (model_bytes // 2)
    print(f"| {optimizer} state, whole (fp32, {planes} plane{'s' if planes > 1 else ''}) | {whole / 1e9:.2f} GB |")
    print(f"| {ck}/optimizer.safetensors (the resident blocks' state) | {opt_bytes / 1e9:.3f} GB |")
EOF
echo "== saved: $(ls "$RUN")"
