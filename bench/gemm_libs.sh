#!/usr/bin/env bash
# Which CPU kernel library multiplies fastest on this machine, at GPT-2's and SmolLM2's product
# shapes: zof's own Backend::matmul (what the walks run, on Debian's oneDNN), Debian's oneDNN
# directly, PyPI's current oneDNN (onednn-devel) and MKL (mkl-devel), and PyTorch's F.linear
# (its bundled oneDNN and MKL), each in fp32 and bf16, in one run so the ratios share the
# machine's load. Prints what the CPU has, then one markdown table: GFLOP/s per shape, and each
# library's median over the shapes against the best.
#   bench/gemm_libs.sh                 # THREADS=$(nproc) REPS=15
# The PyPI libraries go into their own venv ($ZOF_GEMM_VENV, default build/gemm-libs-venv;
# about 1.6 GB, MKL's runtime mostly) on the first run; zof's column needs build/ (bash
# scripts/build.sh). ZOF_PYTHON: the Python with torch (default build/venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-15}
BUILD=${ZOF_BUILD_DIR:-build}
PY=${ZOF_PYTHON:-$BUILD/venv/bin/python}
VENV=${ZOF_GEMM_VENV:-$BUILD/gemm-libs-venv}
OUT=$(mktemp -d /tmp/zof-gemm-libs.XXXXXX)
RAW=$OUT/gemm.jsonl
: >"$RAW"

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); flags:" \
     "$(grep -m1 -o -w -E 'avx512_bf16|amx_bf16|amx_tile|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')" >&2
if [ ! -x "$VENV/bin/pip" ]; then
  python3 -m venv "$VENV"
fi
# PyPI's oneDNN is Intel's build (SYCL and TBB runtime), whose libraries come in packages of
# their own that onednn-devel does not pull in.
if [ ! -f "$VENV/include/oneapi/dnnl/dnnl.hpp" ] || [ ! -f "$VENV/include/mkl.h" ] ||
   [ ! -f "$VENV/lib/libtbb.so.12" ] || [ ! -f "$VENV/lib/libsycl.so" ]; then
  echo "gemm_libs: installing onednn-devel, mkl-devel and their runtimes into $VENV" >&2
  "$VENV/bin/pip" install -q onednn-devel mkl-devel tbb intel-cmplr-lib-rt intel-sycl-rt
fi

VENV_ABS=$(cd "$VENV" && pwd)
CXX=(g++ -std=c++20 -O3 -march=native -fopenmp bench/libs/gemm_libs.cpp)
build() {  # name, then the compiler's flags for that library
  local name=$1
  shift
  "${CXX[@]}" "$@" -o "$OUT/$name" 2>"$OUT/$name.log" || { echo "gemm_libs: $name did not build:" \
    "$(tail -3 "$OUT/$name.log")" >&2; return 1; }
}
libs=()
if [ -f "$BUILD/libzof_backends.a" ]; then
  build zof -DGEMM_ZOF -Iinclude -Isrc "$BUILD/libzof_backends.a" "$BUILD/libzof_util.a" -ldnnl &&
    libs+=(zof)
fi
build dnnl-debian -DGEMM_DNNL -ldnnl && libs+=(dnnl-debian)
build dnnl-pypi -DGEMM_DNNL -I"$VENV/include" -L"$VENV/lib" -Wl,--disable-new-dtags,-rpath,"$VENV_ABS/lib" -ldnnl &&
  libs+=(dnnl-pypi)
# MKL's single dynamic library (the wheel ships only versioned names), on GNU OpenMP.
build mkl-pypi -DGEMM_MKL -I"$VENV/include" -L"$VENV/lib" -Wl,--disable-new-dtags,-rpath,"$VENV_ABS/lib" \
  -l:libmkl_rt.so.3 && libs+=(mkl-pypi)

for l in "${libs[@]}"; do
  echo "== $l" >&2
  # (PyPI's oneDNN: Intel's SYCL build; its CPU engine needs a SYCL CPU device.)
  OMP_NUM_THREADS=$THREADS MKL_THREADING_LAYER=GNU "$OUT/$l" "$THREADS" "$REPS" >"$OUT/$l.jsonl" ||
    echo "gemm_libs: $l failed (rc $?)" >&2
  cat "$OUT/$l.jsonl" | tee -a "$RAW" >&2
done
echo "== PyTorch" >&2
"$PY" dev/torch_matmul_rate.py --threads "$THREADS" --reps "$REPS" --json | tee -a "$RAW" >&2

"$PY" - "$RAW" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
libs = list(dict.fromkeys(r["lib"] for r in rows))
shapes = list(dict.fromkeys(r["shape"] for r in rows))
get = {(r["lib"], r["shape"], r["dtype"]): r["gflops"] for r in rows}
for dtype in ("bf16", "fp32"):
    print(f"\n{dtype}, GFLOP/s ({rows[0]['threads']} threads, best of the reps):\n")
    print("| shape (M x N x K) | " + " | ".join(libs) + " |")
    print("|---|" + "---:|" * len(libs))
    for s in shapes:
        r0 = next(r for r in rows if r["shape"] == s)
        print(f"| {s} ({r0['M']} x {r0['N']} x {r0['K']}) | "
              + " | ".join(f"{get.get((l, s, dtype), 0):.0f}" for l in libs) + " |")
    med = {l: statistics.median(get[(l, s, dtype)] for s in shapes if (l, s, dtype) in get)
           for l in libs if any((l, s, dtype) in get for s in shapes)}
    best = max(med.values())
    print("| median | " + " | ".join(f"{med[l]:.0f} ({med[l] / best:.0%})" if l in med else ""
                                    for l in libs) + " |")
PYEOF
echo "raw: $RAW" >&2
