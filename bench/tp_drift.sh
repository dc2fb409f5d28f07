#!/usr/bin/env bash
# What tensor parallel costs in bits: the same zof finetune run (stories260K on Tiny
# Shakespeare, fp32, ZO-SGD) in one process and under mpirun with --tensor-parallel 2 and 4,
# then how far the T-rank runs drift from the single process over the steps: the step losses and
# projected gradients, the held-out perplexity at each evaluation, and the final weights. Also
# the bytes each rank hands its tensor group per step (docs/parallelism.md's formula) and the
# seconds a step (oversubscribed on this machine's cores: a model this small is all exchange).
# Prints the markdown table of bench/RESULTS.md.
#   bench/tp_drift.sh                      # 1000 steps, evaluations every 100
#   STEPS=200 EVAL_EVERY=50 bench/tp_drift.sh
# ZOF_BUILD_DIR: where to build (default build/, configured with -DZOF_MPI=ON if new). Runs go
# to $ZOF_BENCH_OUT (default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
{
BUILD=${ZOF_BUILD_DIR:-build}
STEPS=${STEPS:-1000}
EVAL_EVERY=${EVAL_EVERY:-100}
TS=${TS:-"2 4"}
ASSETS=${ZOF_ASSETS_DIR:-$PWD/../shared/assets}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-tp-drift.XXXXXX)}
mkdir -p "$OUTDIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

. bench/lib.sh
build_targets -DZOF_MPI=ON -- zof

head -c 200000 "$ASSETS/data/tinyshakespeare/input.txt" > "$OUTDIR/text.txt"
ARGS=(finetune --model "$ASSETS/models/stories260K" --task text --data "$OUTDIR/text.txt"
      --steps "$STEPS" --batch 8 --seq-len 64 --lr 1e-4 --eps 1e-3 --seed 7 --queries 1
      --eval-every "$EVAL_EVERY" --eval-examples 64 --save-every 0 --threads 1 --no-report --json)

rm -rf "$OUTDIR/t1"
"$BUILD/zof" "${ARGS[@]}" --out "$OUTDIR/t1" > "$OUTDIR/t1.log" 2>&1
for T in $TS; do
  rm -rf "$OUTDIR/t$T"
  "${MPIRUN[@]}" -np "$T" "$BUILD/zof" "${ARGS[@]}" --out "$OUTDIR/t$T" --tensor-parallel "$T" \
    > "$OUTDIR/t$T.log" 2>&1
done

python3 - "$OUTDIR" "$STEPS" $TS <<'EOF'
import array, json, math, struct, sys
out, steps, ts = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3:]]

def records(run):
    st, ev = [], []
    for line in open(f"{run}/metrics.jsonl"):
        j = json.loads(line)
        (st if j["type"] == "step" else ev).append(j)
    return st, ev

def weights(run):  # every tensor of model.safetensors (fp32) as one flat array, in name order
    with open(f"{run}/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    flat = array.array("f")
    for name in sorted(k for k in header if k != "__metadata__"):
        a, b = header[name]["data_offsets"]
        flat.frombytes(data[a:b])
    return flat

def summary(log):
    return json.loads(open(log).read().strip().splitlines()[-1])

s1, e1 = records(f"{out}/t1")
w1 = weights(f"{out}/t1")
sum1 = summary(f"{out}/t1.log")
cols = [1] + ts
rows = {k: [] for k in ["loss", "g", "ppl", "wmax", "wrel", "final", "bytes", "sps"]}
for t in cols:
    st, ev = (s1, e1) if t == 1 else records(f"{out}/t{t}")
    w = w1 if t == 1 else weights(f"{out}/t{t}")
    sm = sum1 if t == 1 else summary(f"{out}/t{t}.log")
    dl = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(s1, st))
    dg = max(abs(a["g"][0] - b["g"][0]) / (1 + abs(a["g"][0])) for a, b in zip(s1, st))
    dp = max(abs(a["value"] - b["value"]) / a["value"] for a, b in zip(e1, ev))
    dw = max(abs(x - y) for x, y in zip(w1, w))
    nw = math.sqrt(sum((x - y) ** 2 for x, y in zip(w1, w)))
    n1 = math.sqrt(sum(x * x for x in w1))
    rows["loss"].append(f"{dl:.1e}")
    rows["g"].append(f"{dg:.1e}")
    rows["ppl"].append(f"{dp:.1e}")
    rows["wmax"].append(f"{dw:.1e}")
    rows["wrel"].append(f"{nw / n1:.1e}")
    rows["final"].append(f"{ev[0]['value']:.4f} -> {ev[-1]['value']:.4f}")
    rows["bytes"].append(f"{sm['dist'].get('tensor_bytes_per_step_per_rank', 0) / 1e6:.2f} MB")
    rows["sps"].append(f"{sm['train_s'] / steps:.4f}")
print(f"| stories260K, {steps} steps, fp32 ZO-SGD | " + " | ".join(f"T = {t}" for t in cols) + " |")
print("|---|" + "---|" * len(cols))
label = {"loss": "max relative step-loss difference from T = 1",
         "g": "max projected-gradient difference, / (1 + \\|g\\|)",
         "ppl": "max relative held-out perplexity difference",
         "wmax": "final weights: max absolute difference",
         "wrel": "final weights: \\|\\|w_T - w_1\\|\\| / \\|\\|w_1\\|\\|",
         "final": "held-out perplexity, before -> after",
         "bytes": "bytes each rank hands its group a step",
         "sps": "seconds a step (2 cores, oversubscribed)"}
for k in rows:
    print(f"| {label[k]} | " + " | ".join(rows[k]) + " |")
EOF
exit
}
