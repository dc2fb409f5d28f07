#!/usr/bin/env bash
# Run HERE (the Debian machine) before a device call: copies the header-only libraries and the
# GoogleTest sources that the GPU machine lacks (it has no Debian packages and no network) into
# build-gpu-deps/ (git-ignored), which the device call carries and CMake falls back to through
# -DZOF_DEPS_DIR. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build-gpu-deps}
need() { [ -e "$1" ] || { echo "prepare.sh: $1 is missing; run scripts/setup.sh first" >&2; exit 1; }; }
need /usr/include/nlohmann/json.hpp
need /usr/include/CLI/CLI.hpp
need /usr/src/googletest/CMakeLists.txt
rm -rf "$OUT"
mkdir -p "$OUT/include"
cp -r /usr/include/nlohmann "$OUT/include/"
cp -r /usr/include/CLI "$OUT/include/"
cp -r /usr/src/googletest "$OUT/googletest"
echo "prepare.sh: $(du -sh "$OUT" | cut -f1) in $OUT (nlohmann json, CLI11, googletest $(grep -o 'GOOGLETEST_VERSION [0-9.]*' "$OUT/googletest/CMakeLists.txt" | cut -d' ' -f2))"
