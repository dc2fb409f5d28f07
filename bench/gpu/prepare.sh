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
# nccl.h, for a GPU machine whose NCCL (PyTorch's nvidia-nccl wheel) came without its header; CMake
# prefers the header beside the library it links. In its own folder, so that it never shadows
# that one. A system or toolkit header first: one older than the library is the safe direction.
NCCL_H=""
for h in /usr/include/nccl.h /usr/local/cuda/include/nccl.h \
         "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)/nvidia/nccl/include/nccl.h"; do
  [ -f "$h" ] && { NCCL_H=$h; break; }
done
if [ -n "$NCCL_H" ]; then
  mkdir -p "$OUT/nccl/include"
  cp "$NCCL_H" "$OUT/nccl/include/"
  NCCL_V=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$NCCL_H")
else
  echo "prepare.sh: no nccl.h here; the GPU machine builds without NCCL unless its own has one" >&2
fi
echo "prepare.sh: $(du -sh "$OUT" | cut -f1) in $OUT (nlohmann json, CLI11, googletest $(grep -o 'GOOGLETEST_VERSION [0-9.]*' "$OUT/googletest/CMakeLists.txt" | cut -d' ' -f2)${NCCL_V:+, nccl.h $NCCL_V})"
