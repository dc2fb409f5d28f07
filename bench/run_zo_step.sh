#!/usr/bin/env bash
# The ZO step, zof against MeZO in PyTorch on this machine: builds zo_step_bench if needed, runs it
# and bench/zo_peer.py for gpt2-124m and llama-125m at batch 8 x 128 and 16 x 64 with every core,
# and prints markdown tables. Each (model, shape) runs zof in fp32 and bf16, then PyTorch in
# float32 and bfloat16, back to back, so a ratio comes from one stretch of machine load; zof's
# bf16 is set against the faster of PyTorch's two.
#   bench/run_zo_step.sh                              # defaults
#   THREADS=1 ITERS=2 SHAPES="8x128" bench/run_zo_step.sh   # overrides: THREADS SHAPES WARMUP ITERS MODELS DTYPES
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
DTYPES=${DTYPES:-"fp32 bf16"}
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
    for d in $DTYPES; do
      echo "== $m $shape $d: zof" >&2
      "$BUILD/zo_step_bench" "${common[@]}" --dtype "$d" --json | tee /dev/stderr | tail -n 1 >>"$RAW"
    done
    for d in $DTYPES; do
      echo "== $m $shape $d: PyTorch MeZO" >&2
      pd=$([ "$d" = bf16 ] && echo bfloat16 || echo float32)
      "$PY" bench/zo_peer.py "${common[@]}" --dtype "$pd" 2>>"$OUTDIR/peer.log" | tee /dev/stderr >>"$RAW"
    done
  done
done
echo "load after: $(uptime)" >&2
echo "raw results: $RAW" >&2

"$PY" - "$RAW" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = lambda r: (r["model"], r["batch"], r["seq"])
shapes = sorted({key(r) for r in rows}, key=lambda k: (k[0], -k[2]))
get = lambda impl, k, d: next((r for r in rows if r["impl"] == impl and key(r) == k
                               and r.get("dtype", "fp32") == d), None)
print("| model | B x T | threads | run | ms/step | tok/s | forward GFLOP/s | of its GEMM rate "
      "| param passes | peak MB |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
for k in shapes:
    for impl, name in (("zof", "zof"), ("pytorch", "MeZO (PyTorch)")):
        for d in ("fp32", "bf16"):
            r = get(impl, k, d)
            if not r:
                continue
            gemm = (f"{r['forward_gflops'] / r['gemm_gflops']:.0%} of {r['gemm_gflops']:.0f}"
                    if "gemm_gflops" in r else "")
            print(f"| {k[0]} | {k[1]} x {k[2]} | {r['threads']} | {name} {d} | {r['step_ms']:.0f} "
                  f"| {r['tokens_per_s']:.0f} | {r['forward_gflops']:.0f} | {gemm} "
                  f"| {r['param_pass_ms'] / r['step_ms']:.1%} "
                  f"| {r['rss_peak_mb'] - r['rss_base_mb']:.0f} |")
print()
print("| model | B x T | zof fp32 / best PyTorch | zof bf16 / best PyTorch | zof bf16 / zof fp32 "
      "| PyTorch bf16 / PyTorch fp32 |")
print("|---|---|---:|---:|---:|---:|")
for k in shapes:
    z32, z16, p32, p16 = (get(i, k, d) for i, d in (("zof", "fp32"), ("zof", "bf16"),
                                                     ("pytorch", "fp32"), ("pytorch", "bf16")))
    best = min((p["step_ms"] for p in (p32, p16) if p), default=0)
    sp = lambda z: f"{best / z['step_ms']:.2f}x" if z and best else ""
    ratio = lambda a, b: f"{b['step_ms'] / a['step_ms']:.2f}x" if a and b else ""
    print(f"| {k[0]} | {k[1]} x {k[2]} | {sp(z32)} | {sp(z16)} | {ratio(z16, z32)} "
          f"| {ratio(p16, p32)} |")
units = {r.get("unit") for r in rows if r["impl"] == "zof"}
torch = {r.get("torch") for r in rows if r["impl"] == "pytorch"}
print(f"\nzof's bf16 products ran on: {', '.join(sorted(u for u in units if u))}; PyTorch "
      f"{', '.join(sorted(t for t in torch if t))}. Speed-ups are PyTorch's ms/step over zof's "
      "(higher is better for zof); each GEMM rate is the backend's matmul M=1024 N=3072 K=768 in "
      "the run's dtype, measured in the same process. Peak MB: resident set above the process's "
      "baseline before the model was built.")
PYEOF
