#!/usr/bin/env bash
# One command from a fresh Debian machine to a passing test suite: installs what is needed,
# builds, writes the Hugging Face tokenizer reference, runs ctest (all CPU labels).
# ZOF_SANITIZE=1 runs the same suite built with AddressSanitizer and UBSan in build-asan/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD=build
EXTRA=()
if [ "${ZOF_SANITIZE:-0}" = 1 ]; then BUILD=build-asan; EXTRA=(-DZOF_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo); fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${EXTRA[@]}" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
export ZOF_PYTHON="$PWD/build/venv/bin/python"
export ZOF_TOKREF_DIR="$PWD/$BUILD/tokref"
"$ZOF_PYTHON" tests/reference/tokenizer_reference.py --out "$ZOF_TOKREF_DIR"
cd "$BUILD"
# The sanitizer pass leaves out the slow end-to-end learning run (same code, minutes under ASan).
EXCLUDE=gpu
[ "${ZOF_SANITIZE:-0}" = 1 ] && EXCLUDE="gpu|slow"
ctest --output-on-failure -j 2 -LE "$EXCLUDE" "$@"
