#!/usr/bin/env bash
# Distributed zof finetune on this machine's CPUs: steps/s for 1, 2 and 4 ranks (data parallel,
# pipeline, both), the bytes the ranks exchange per step against what first-order data
# parallelism would all-reduce, and the ping-pong latency/bandwidth of the MPI link; prints the
# markdown tables of RESULTS.md. The timed step is rank 0's (it includes waiting for the others),
# from the run's summary (train_s: the steps alone, not loading or evaluation).
#   bench/mpi_bench.sh                 # defaults
#   STEPS=4 bench/mpi_bench.sh         # overrides: STEPS BATCH SEQ MODELS REPEAT
# Each layout runs REPEAT times (default 3), the layouts interleaved, and the table shows the
# median steps/s, so that a burst of load from other processes hits one sample, not one layout.
# ZOF_BUILD_DIR: where to build (default build/, configured with -DZOF_MPI=ON if new).
# Two models: stories260K (the test model: steps of milliseconds, so the per-step overheads
# show) and a random-weight llama-8x512 (25M parameters, stories260K's tokenizer; steps of
# about a second, so compute shows). Raw JSON goes to $ZOF_BENCH_OUT (default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${ZOF_BUILD_DIR:-build}
STEPS=${STEPS:-8}
REPEAT=${REPEAT:-3}
BATCH=${BATCH:-8}
SEQ=${SEQ:-128}
MODELS=${MODELS:-"stories260K llama-8x512"}
ASSETS=${ZOF_ASSETS_DIR:-$PWD/../shared/assets}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-mpi-bench.XXXXXX)}
mkdir -p "$OUTDIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

. bench/lib.sh
build_targets -DZOF_MPI=ON -- zof dist_pingpong_bench

# A random llama with stories260K's tokenizer (vocab 512): numpy writes the safetensors file.
make_random_llama() {  # dir hidden layers intermediate
  local dir=$1
  mkdir -p "$dir"
  cp "$ASSETS/models/stories260K/"{tokenizer.json,tokenizer_config.json,tokenizer.model,special_tokens_map.json} "$dir/"
  python3 - "$dir" "$2" "$3" "$4" <<'EOF'
import json, struct, sys
import numpy as np
d, C, L, I = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
V, H = 512, C // 64
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
       "hidden_size": C, "intermediate_size": I, "num_hidden_layers": L,
       "num_attention_heads": H, "num_key_value_heads": H, "head_dim": 64,
       "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
       "torch_dtype": "float32"}
json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
rng = np.random.default_rng(0)
t = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
for l in range(L):
    p = f"model.layers.{l}."
    t.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
              p + "self_attn.q_proj.weight": (C, C), p + "self_attn.k_proj.weight": (C, C),
              p + "self_attn.v_proj.weight": (C, C), p + "self_attn.o_proj.weight": (C, C),
              p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
              p + "mlp.down_proj.weight": (C, I)})
header, blobs, off = {}, [], 0
for name, shape in t.items():
    a = (np.ones(shape) if len(shape) == 1 else rng.normal(0, 0.02, shape)).astype("<f4")
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + a.nbytes]}
    blobs.append(a.tobytes()); off += a.nbytes
h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h); [f.write(b) for b in blobs]
EOF
}

TEXT="$OUTDIR/text.txt"
head -c 200000 "$ASSETS/data/tinyshakespeare/input.txt" >"$TEXT"
RAW="$OUTDIR/mpi_bench.jsonl"
: >"$RAW"

# label np threads stages micro batch-divisor. The quarter batch separates the per-step cost
# that does not depend on the batch (z regeneration and the perturbation/update passes over all
# N parameters, on every rank and, as the walk is written, once per micro-batch) from the
# per-example forward cost; bench/scaling_model.py --validate-cpu uses both.
CONFIGS=(
  "1 rank x 2 threads|1|2|1|1|1"
  "1 rank x 1 thread|1|1|1|1|1"
  "1 rank x 1 thread, quarter batch|1|1|1|1|4"
  "2 ranks data parallel|2|1|1|1|1"
  "4 ranks data parallel (oversubscribed)|4|1|1|1|1"
  "2 ranks = 2 pipeline stages|2|1|2|4|1"
  "4 ranks = 2 stages x 2 replicas (oversubscribed)|4|1|2|2|1"
)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq "$REPEAT"); do
for m in $MODELS; do
  case $m in
    stories260K) MDIR="$ASSETS/models/stories260K" ;;
    llama-8x512) MDIR="$OUTDIR/llama-8x512"; [ -f "$MDIR/model.safetensors" ] || make_random_llama "$MDIR" 512 8 1376 ;;
    *) echo "unknown model $m" >&2; exit 1 ;;
  esac
  for c in "${CONFIGS[@]}"; do
    IFS='|' read -r label np threads stages micro div <<<"$c"
    out="$OUTDIR/run-$m-$np-$stages-$threads-$div"
    rm -rf "$out"
    args=(finetune --model "$MDIR" --task text --data "$TEXT" --out "$out" --steps "$STEPS"
          --batch $((BATCH / div)) --seq-len "$SEQ" --micro-batches "$micro" --lr 1e-5 --seed 1
          --eval-examples 2 --threads "$threads" --pipeline-stages "$stages")
    if [ "$np" = 1 ]; then line=$("$BUILD/zof" "${args[@]}" 2>/dev/null | tail -1)
    else line=$("${MPIRUN[@]}" -np "$np" "$BUILD/zof" "${args[@]}" 2>/dev/null | tail -1); fi
    python3 -c 'import json,sys; j=json.loads(sys.argv[1]); j.update(model=sys.argv[2], label=sys.argv[3], threads=int(sys.argv[4]), params=json.load(open(sys.argv[5]+"/run.json"))["model_id"]["num_params"], batch=int(sys.argv[6]), micro=int(sys.argv[7])); print(json.dumps(j))' \
      "$line" "$m" "$label" "$threads" "$out" $((BATCH / div)) "$micro" >>"$RAW"
    rm -rf "$out"
  done
done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "### steps/s on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), batch $BATCH x $SEQ tokens, $STEPS steps, q = 1, median of $REPEAT"
echo
echo "Load average (1, 5, 15 min) before: $LOAD0; after: $LOAD1."
echo
python3 - "$RAW" <<'EOF'
import json, sys
import statistics
runs = [json.loads(l) for l in open(sys.argv[1])]
rows, samples = [], {}
for r in runs:
    k = (r["model"], r["label"])
    if k not in samples:
        samples[k] = []
        rows.append(r)
    samples[k].append(r["steps"] / r["train_s"])
print("| model | params | layout | threads/rank | steps/s (median) | min-max | tokens/s | vs 1 rank x 1 thread | bytes sent/step, all ranks | first-order DP all-reduce bytes/step |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
base = {}
for r in rows:
    s = samples[(r["model"], r["label"])]
    sps = statistics.median(s)
    if r["label"] == "1 rank x 1 thread": base[r["model"]] = sps
for r in rows:
    s = samples[(r["model"], r["label"])]
    sps = statistics.median(s)
    tok = sps * r["tokens_per_s"] * r["train_s"] / r["steps"]  # tokens per step x steps/s
    R, S, N = r["dist"]["ranks"], r["dist"]["pipeline_stages"], r["params"]
    reps = R // S
    fo = 8 * N * (reps - 1)  # ring all-reduce of fp32 gradients: 2 (R-1)/R x 4N per replica
    fo_s = "0" if reps == 1 else f"{fo:,.0f} ({fo / max(r['dist']['bytes_per_step'], 1):,.0f}x)"
    print(f"| {r['model']} | {N:,} | {r['label']} | {r['threads']} | {sps:.2f} | {min(s):.2f}-{max(s):.2f} | "
          f"{tok:.0f} | {sps / base[r['model']]:.2f} | {r['dist']['bytes_per_step']:,.0f} | {fo_s} |")
EOF
echo
echo "### MPI link between two ranks on this machine (dist::Communicator send/recv ping-pong)"
echo
"${MPIRUN[@]}" -np 2 "$BUILD/dist_pingpong_bench" --json | tee "$OUTDIR/pingpong.txt" | grep -v '^{'
tail -1 "$OUTDIR/pingpong.txt" >"$OUTDIR/link.json"
echo
echo "raw: $RAW, link: $OUTDIR/link.json" >&2
