#!/usr/bin/env bash
# The ZO step, zof against MeZO in PyTorch on this machine: builds zo_step_bench if needed, runs it
# and bench/zo_peer.py for gpt2-124m and llama-125m at batch 8 x 128 and 16 x 64 with every core,
# and prints a markdown table. Each (model, shape) runs zof then PyTorch back to back, so a ratio
# comes from one stretch of machine load.
#   bench/run_zo_step.sh                              # defaults
#   THREADS=1 ITERS=2 SHAPES="8x128" bench/run_zo_step.sh   # overrides: THREADS SHAPES WARMUP ITERS MODELS
# ZOF_PYTHON: the Python with torch and transformers (default python3). ZOF_BUILD_DIR: where to
# build (default build/). Raw JSON lines (and PyTorch's stderr, peer.log) go to $ZOF_BENCH_OUT
# (default a fresh temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${ZOF_PYTHON:-python3}
BUILD=${ZOF_BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
SHAPES=${SHAPES:-"8x128 16x64"}
WARMUP=${WARMUP:-1}
ITERS=${ITERS:-3}
MODELS=${MODELS:-"gpt2-124m llama-125m"}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-zo-bench.XXXXXX)}
mkdir -p "$OUTDIR"
RAW="$OUTDIR/zo_step.jsonl"
: >"$RAW"

. bench/lib.sh
build_targets -- zo_step_bench

echo "load before: $(uptime)" >&2
for m in $MODELS; do
  for shape in $SHAPES; do
    B=${shape%x*}
    T=${shape#*x}
    common=(--model-config "$m" --batch "$B" --seq "$T" --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS")
    echo "== $m $shape: zof" >&2
    "$BUILD/zo_step_bench" "${common[@]}" --json | tee /dev/stderr | tail -n 1 >>"$RAW"
    echo "== $m $shape: PyTorch MeZO" >&2
    "$PY" bench/zo_peer.py "${common[@]}" 2>>"$OUTDIR/peer.log" | tee /dev/stderr >>"$RAW"
  done
done
echo "load after: $(uptime)" >&2
echo "raw results: $RAW" >&2

"$PY" - "$RAW" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = lambda r: (r["model"], r["batch"], r["seq"])
zof = {key(r): r for r in rows if r["impl"] == "zof"}
pt = {key(r): r for r in rows if r["impl"] == "pytorch"}
print("| model | B x T | threads | zof ms/step | MeZO (PyTorch) ms/step | speed-up | zof tok/s "
      "| zof forward GFLOP/s | of GEMM rate | zof param passes | MeZO param passes "
      "| zof peak RSS / (model + activations) | zof peak MB | MeZO peak MB |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for k, z in zof.items():
    p = pt.get(k, {})
    ps = p.get("step_ms", 0)
    print(f"| {k[0]} | {k[1]} x {k[2]} | {z['threads']} | {z['step_ms']:.0f} | {ps:.0f} | "
          f"{ps / z['step_ms']:.2f} | {z['tokens_per_s']:.0f} | {z['forward_gflops']:.0f} | "
          f"{z['forward_gflops'] / z['gemm_gflops']:.0%} | "
          f"{z['param_pass_ms'] / z['step_ms']:.1%} | "
          f"{p.get('param_pass_ms', 0) / ps if ps else 0:.1%} | {z['mem_ratio']:.2f} | "
          f"{z['rss_peak_mb'] - z['rss_base_mb']:.0f} | "
          f"{p.get('rss_peak_mb', 0) - p.get('rss_base_mb', 0):.0f} |")
gemm = ", ".join(f"{k[0]} {k[1]}x{k[2]}: {z['gemm_gflops']:.0f}" for k, z in zof.items())
print(f"\nGEMM rate (backend matmul M=1024 N=3072 K=768, GFLOP/s, same run): {gemm}. "
      "Peak MB: peak resident set above the process's baseline before the model was built.")
PYEOF
