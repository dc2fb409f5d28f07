#!/usr/bin/env bash
# How the CPU ZO step grows with the model and with tokens per step: LLaMA-style configs from
# ~10M to ~1B parameters (random weights, GQA, SwiGLU, vocabulary 32000, tied embeddings), each at
# 512, 1024 and 2048 tokens per step (4, 8 and 16 sequences of 128), through zo_step_bench.
# Prints a markdown table.
#   bench/run_zo_scaling.sh                       # defaults
#   SIZES="10m 125m" SHAPES="8x128" bench/run_zo_scaling.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${ZOF_PYTHON:-python3}
BUILD=${ZOF_BUILD_DIR:-build}
THREADS=${THREADS:-$(nproc)}
SIZES=${SIZES:-"10m 30m 125m 350m 1b"}
SHAPES=${SHAPES:-"4x128 8x128 16x128"}
WARMUP=${WARMUP:-1}
ITERS=${ITERS:-2}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-zo-scaling.XXXXXX)}
mkdir -p "$OUTDIR"
RAW="$OUTDIR/zo_scaling.jsonl"
: >"$RAW"

. bench/lib.sh
build_targets -- zo_step_bench

# name hidden layers heads kv_heads intermediate
config() {
  local c=$2 l=$3 h=$4 kv=$5 i=$6
  cat >"$OUTDIR/$1.json" <<JSON
{"model_type": "llama", "vocab_size": 32000, "hidden_size": $c, "intermediate_size": $i,
 "num_hidden_layers": $l, "num_attention_heads": $h, "num_key_value_heads": $kv,
 "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
 "hidden_act": "silu", "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2}
JSON
}
config 10m 256 4 4 2 688
config 30m 512 6 8 4 1376
config 125m 768 12 12 4 2048
config 350m 1024 24 16 8 2816
config 1b 2048 16 32 8 5632

echo "load before: $(uptime)" >&2
for s in $SIZES; do
  for shape in $SHAPES; do
    B=${shape%x*}
    T=${shape#*x}
    echo "== $s $shape" >&2
    "$BUILD/zo_step_bench" --model-config "$OUTDIR/$s.json" --batch "$B" --seq "$T" \
      --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS" --json |
      tee /dev/stderr | tail -n 1 | sed "s/\"model\":\"[^\"]*\"/\"model\":\"$s\"/" >>"$RAW"
  done
done
echo "load after: $(uptime)" >&2
echo "raw results: $RAW" >&2

"$PY" - "$RAW" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | parameters | tokens/step | ms/step | ms per 1k tokens | param passes ms (share) "
      "| tokens/s | GFLOP/s (step) | of GEMM rate | peak MB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    tok = r["batch"] * r["seq"]
    print(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {tok} | {r['step_ms']:.0f} | "
          f"{r['step_ms'] / tok * 1e3:.0f} | {r['param_pass_ms']:.0f} "
          f"({r['param_pass_ms'] / r['step_ms']:.0%}) | {r['tokens_per_s']:.0f} | "
          f"{r['step_gflops']:.0f} | {r['step_gflops'] / r['gemm_gflops']:.0%} | "
          f"{r['rss_peak_mb'] - r['rss_base_mb']:.0f} |")
PYEOF
