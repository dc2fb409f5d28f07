#!/usr/bin/env bash
# Installs what zof needs on Debian 12 (build tools, oneDNN, OpenMP, JSON, CLI11, GoogleTest,
# Open MPI, Chromium for the report's screenshot test) and a Python virtual environment
# (build/venv) with the reference packages the tests compare against.
# Idempotent: installs only what is missing. Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config libdnnl-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev python3 python3-venv python3-pip
      openmpi-bin libopenmpi-dev  # MPI: data- and pipeline-parallel finetune, tests/mpi
      ocl-icd-opencl-dev opencl-headers  # Debian's dnnl-config.cmake calls find_package(OpenCL)
      chromium)  # headless screenshots of `zof report` pages (tests/model/test_report.cpp)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python reference packages: tokenizers (tokenizer tests), safetensors and numpy (file checks).
# torch and transformers are only needed to regenerate golden files and for the benchmarks'
# peer (ZOF_PY_FULL=1).
VENV=${ZOF_VENV:-build/venv}
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi
want="tokenizers==0.23.3 safetensors numpy"
[ "${ZOF_PY_FULL:-0}" = 1 ] && want="$want torch transformers"
if ! "$VENV/bin/python" -c "import tokenizers, safetensors, numpy" 2>/dev/null ||
   { [ "${ZOF_PY_FULL:-0}" = 1 ] && ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; }; then
  echo "setup: installing Python packages into $VENV: $want"
  "$VENV/bin/pip" install -q --disable-pip-version-check $want
fi
