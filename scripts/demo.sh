#!/usr/bin/env bash
# The main job, from a fresh Debian machine: installs what is needed, builds, and fine-tunes a
# model with forward passes only (MeZO), printing held-out perplexity before and after.
#   bash scripts/demo.sh [MODEL_DIR] [DATA_TEXT_FILE] [extra zof finetune flags...]
# Defaults: the stories260K model and Tiny Shakespeare from ../shared/assets; the run directory is
# runs/demo-<time> (the fine-tuned model is written there in Hugging Face layout).
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS=${ZOF_ASSETS:-../shared/assets}
MODEL=${1:-$ASSETS/models/stories260K}
DATA=${2:-$ASSETS/data/tinyshakespeare/input.txt}
shift $(( $# > 2 ? 2 : $# ))
bash scripts/setup.sh
bash scripts/build.sh zof
OUT=runs/demo-$(date +%Y%m%d-%H%M%S)
echo "demo: fine-tuning $MODEL on $DATA into $OUT"
./build/zof finetune --model "$MODEL" --task text --data "$DATA" --out "$OUT" \
  --steps 1000 --batch 16 --seq-len 128 --lr 1e-4 --eps 1e-3 --eval-examples 64 --eval-every 250 "$@"
echo "demo: the run as pictures: $OUT/report.html (zof report)"
echo "demo: a sample from the fine-tuned model:"
./build/zof generate --model "$OUT" --prompt "ROMEO:" --max-new-tokens 80 --temperature 0.8 --seed 1
