#!/usr/bin/env bash
# Tensor parallel's traffic at real widths: zof finetune --tensor-parallel T under mpirun on
# random-weight models with LLaMA-2-7B's layer (hidden 4096, 32 heads, FFN 11008) and LLaMA-2-70B's
# (hidden 8192, 64 heads, 8 KV heads, FFN 28672), a few layers each and stories260K's tokenizer
# (vocabulary 512: the exchange does not depend on the vocabulary, 20 bytes a scored (position, target) pair whatever it
# is). Each run's summary gives the bytes each rank's all-gathers carried a step
# (dist.tensor_bytes_per_step_per_rank) and the bytes all ranks sent (dist.bytes_per_step, the
# communicator's counter); the table sets them beside docs/parallelism.md's formula, then the
# formula at the full depths (32 and 80 layers).
#   bench/tp_bytes.sh                        # defaults
#   ROWS=256 STEPS=2 bench/tp_bytes.sh       # overrides: ROWS (tokens a forward) STEPS
# ZOF_BUILD_DIR: where to build (default build/, configured with -DZOF_MPI=ON if new). Models
# and runs go to $ZOF_BENCH_OUT (default a temp dir; about 5 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
{
BUILD=${ZOF_BUILD_DIR:-build}
ROWS=${ROWS:-128}
STEPS=${STEPS:-2}
ASSETS=${ZOF_ASSETS_DIR:-$PWD/../shared/assets}
OUTDIR=${ZOF_BENCH_OUT:-$(mktemp -d /tmp/zof-tp-bytes.XXXXXX)}
mkdir -p "$OUTDIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

. bench/lib.sh
build_targets -DZOF_MPI=ON -- zof random_model

head -c 200000 "$ASSETS/data/tinyshakespeare/input.txt" > "$OUTDIR/text.txt"

# name hidden heads kv_heads ffn layers
SHAPES=("7b-width 4096 32 32 11008 2" "70b-width 8192 64 8 28672 1")
for s in "${SHAPES[@]}"; do
  read -r name C H K I L <<< "$s"
  m="$OUTDIR/$name"
  if [[ ! -f "$m/model.safetensors" ]]; then
    mkdir -p "$OUTDIR/cfg"
    cat > "$OUTDIR/cfg/$name.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
 "hidden_size": $C, "intermediate_size": $I, "num_hidden_layers": $L,
 "num_attention_heads": $H, "num_key_value_heads": $K, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
EOF
    rm -rf "$m"
    "$BUILD/random_model" --model-config "$OUTDIR/cfg/$name.json" --dtype fp32 --out "$m" \
      --tokenizer-from "$ASSETS/models/stories260K" >&2
  fi
  for T in 2 4; do
    out="$OUTDIR/run-$name-t$T"
    rm -rf "$out"
    "${MPIRUN[@]}" -np "$T" "$BUILD/zof" finetune --model "$m" --task text --data "$OUTDIR/text.txt" \
      --steps "$STEPS" --batch 1 --seq-len "$ROWS" --lr 1e-6 --queries 1 --eval-examples 1 \
      --threads 1 --no-report --json --tensor-parallel "$T" --out "$out" \
      > "$out.json" 2> "$out.err"
    echo "$name $C $L $T $(tail -n 1 "$out.json")" >> "$OUTDIR/rows.txt"
  done
done

python3 - "$OUTDIR/rows.txt" "$ROWS" <<'EOF'
import json, sys
rows = int(sys.argv[2])
def formula(T, L, C, q=1, r=rows):  # docs/parallelism.md: bytes a rank's all-gathers carry a step
    return 2 * q * (T - 1) * ((2 * L + 1) * r * C * 4 + (r - 1) * 20)  # r - 1 rows scored
print(f"| shape (random weights, {rows} tokens a forward, q = 1) | T | measured: a rank's "
      "all-gathers, MB/step | formula, MB/step | all ranks' sends (communicator), MB/step "
      "| s/step (2 cores, oversubscribed) |")
print("|---|---|---|---|---|---|")
seen = []
for line in open(sys.argv[1]):
    name, C, L, T, js = line.split(" ", 4)
    C, L, T = int(C), int(L), int(T)
    s = json.loads(js)
    d = s["dist"]
    seen.append((name, C, T))
    print(f"| {name}, {L} layer(s) | {T} | {d['tensor_bytes_per_step_per_rank'] / 1e6:.2f} "
          f"| {formula(T, L, C) / 1e6:.2f} | {d['bytes_per_step'] / 1e6:.2f} "
          f"| {s['train_s'] / s['steps']:.2f} |")
print()
print("| full depth, from the formula (q = 1) | T | 128 tokens a forward | 2048 | 16384 |")
print("|---|---|---|---|---|")
for name, C, L in (("LLaMA-2-7B", 4096, 32), ("LLaMA-2-70B", 8192, 80)):
    for T in (2, 4, 8):
        cells = " | ".join(f"{formula(T, L, C, 1, r) / 1e9:.2f} GB" for r in (128, 2048, 16384))
        print(f"| {name} ({L} layers) | {T} | {cells} |")
EOF
exit
}
