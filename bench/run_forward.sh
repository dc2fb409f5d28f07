#!/usr/bin/env bash
# Forward throughput, zof against PyTorch on this machine: builds forward_bench if needed, runs it
# and bench/forward_peer.py for gpt2-124m and llama-125m at batch 8 x 128 with every core, and
# prints a markdown table. Each model runs zof then PyTorch back to back, so a ratio comes from
# one stretch of machine load.
#   bench/run_forward.sh                      # defaults
#   THREADS=1 ITERS=3 bench/run_forward.sh    # overrides: THREADS BATCH SEQ WARMUP ITERS MODELS
# ZOF_PYTHON: the Python with torch and transformers (default python3). ZOF_BUILD_DIR: where to
# build (default build/). Raw JSON lines (and PyTorch's stderr, peer.log) go to $ZOF_BENCH_OUT
# (default a fresh temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${ZOF_PYTHON:-python3}
BUILD=${ZOF_BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
BATCH=${BATCH:-8}
SEQ=${SEQ:-128}
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-5}
MODELS=${MODELS:-"gpt2-124m llama-125m"}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-forward-bench.XXXXXX)}
mkdir -p "$OUTDIR"
RAW="$OUTDIR/forward.jsonl"
: >"$RAW"

. bench/lib.sh
build_targets -- forward_bench

common=(--batch "$BATCH" --seq "$SEQ" --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS")
echo "load before: $(uptime)" >&2
for m in $MODELS; do
  echo "== $m: zof" >&2
  "$BUILD/forward_bench" --model-config "$m" "${common[@]}" --json | tee /dev/stderr | tail -n 1 >>"$RAW"
  echo "== $m: PyTorch" >&2
  "$PY" bench/forward_peer.py --model-config "$m" "${common[@]}" --attn both 2>>"$OUTDIR/peer.log" |
    tee /dev/stderr >>"$RAW"
done
echo "load after: $(uptime)" >&2
echo "raw results: $RAW" >&2

"$PY" - "$RAW" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
zof = {r["model"]: r for r in rows if r["impl"] == "zof"}
pt = {(r["model"], r["attn"]): r for r in rows if r["impl"] == "pytorch"}
print("| model | op | B x T | threads | zof tok/s | PyTorch sdpa tok/s | PyTorch eager tok/s "
      "| zof / PyTorch sdpa | zof GFLOP/s | of GEMM peak |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
for m, z in zof.items():
    s, e = pt.get((m, "sdpa"), {}), pt.get((m, "eager"), {})
    for op, name in (("nll", "forward + loss"), ("logits", "logits only")):
        zt = z[f"{op}_tokens_per_s"]
        if not zt:
            continue
        st, et = s.get(f"{op}_tokens_per_s", 0), e.get(f"{op}_tokens_per_s", 0)
        ratio = f"{zt / st:.2f}" if st else "-"
        frac = z[f"{op}_gflops"] / z["gemm_gflops"]
        print(f"| {m} | {name} | {z['batch']} x {z['seq']} | {z['threads']} | {zt:.0f} | "
              f"{st:.0f} | {et:.0f} | {ratio} | {z[f'{op}_gflops']:.1f} | {frac:.0%} |")
peaks = ", ".join(f"{m} run {z['gemm_gflops']:.1f}" for m, z in zof.items())
gf = ", ".join(f"{m} {z['gflop_per_forward']:.1f}" for m, z in zof.items())
print(f"\nGEMM peak (backend matmul M=1024 N=3072 K=768, GFLOP/s): {peaks}. "
      f"GFLOP per forward: {gf}.")
EOF
