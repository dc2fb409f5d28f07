#!/usr/bin/env bash
# The GPU machine's one command: builds what it needs (CMake + ninja, CUDA on, the deps carried in
# build-gpu-deps/ by bench/gpu/prepare.sh), runs the gpu tests, then the benchmarks, and prints
# the results table (also written to $OUT/gpu_results.md when $OUT is set). Needs no network;
# about 4 minutes on an H200 (budget: 8). Exit status: non-zero if the build or a test failed.
#   device call: bash bench/gpu/run.sh        (carry: build-gpu-deps)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
BUILD=${ZOF_GPU_BUILD:-build-gpu}
DEPS=${ZOF_DEPS_DIR:-$ROOT/build-gpu-deps}
RES=${OUT:-$ROOT/$BUILD}
mkdir -p "$RES"
MD="$RES/gpu_results.md"
PY=${ZOF_PYTHON:-python3}
status=0
elapsed() { echo $(( $(date +%s) - T0 ))s; }
say() { echo "== run.sh [$(elapsed)] $*" >&2; }

# ---- build --------------------------------------------------------------------------------
# Only the GPU's architecture (from nvidia-smi) halves the CUDA compile; sm_80;90 otherwise.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[ -n "$ARCH" ] || ARCH="80;90"
DEPS_ARG=()
[ -d "$DEPS" ] && DEPS_ARG=(-DZOF_DEPS_DIR="$DEPS")
say "configure ($BUILD, sm_$ARCH, deps ${DEPS_ARG[*]:-system})"
# ZOF_CMAKE_ARGS: extra configure flags (e.g. -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON to rehearse
# the GPU machine's missing packages on a Debian machine).
read -r -a EXTRA <<<"${ZOF_CMAKE_ARGS:-}"
if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOF_CUDA=ON -DZOF_MPI=OFF \
     -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${DEPS_ARG[@]}" "${EXTRA[@]}" >"$RES/configure.log" 2>&1; then
  tail -40 "$RES/configure.log"; echo "run.sh: configure failed (log: $RES/configure.log)"; exit 1
fi
say "build"
if ! ninja -C "$BUILD" zof zof_gpu_tests block_bench zo_bench stream_bench >"$RES/build.log" 2>&1; then
  grep -E "error|Error" "$RES/build.log" | head -40; tail -20 "$RES/build.log"
  echo "run.sh: build failed (log: $RES/build.log)"; exit 1
fi

# ---- tests ----------------------------------------------------------------------------------
say "gpu tests"
ZOF_EXPECT_GPU=1 timeout 300 "$BUILD/zof_gpu_tests" --gtest_output="xml:$RES/gpu_tests.xml" \
  >"$RES/gpu_tests.log" 2>&1
trc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |ran\. \(|FAILED TEST" "$RES/gpu_tests.log" | tail -40 >&2
[ $trc -eq 0 ] || { status=1; grep -B2 -A12 "Failure" "$RES/gpu_tests.log" | head -80 >&2; }
TEST_LINE=$(grep -E "ran\. \(" "$RES/gpu_tests.log" | tail -1 | sed 's/^\[=*\] //')
PASS_N=$(grep -oE "^\[  PASSED  \] [0-9]+" "$RES/gpu_tests.log" | grep -oE "[0-9]+$" | tail -1)
FAIL_N=$(grep -oE "^\[  FAILED  \] [0-9]+ tests?, listed below" "$RES/gpu_tests.log" | grep -oE "[0-9]+" | head -1)
SKIP_N=$(grep -oE "^\[  SKIPPED \] [0-9]+" "$RES/gpu_tests.log" | grep -oE "[0-9]+$" | tail -1)

# ---- benchmarks -------------------------------------------------------------------------------
say "block_bench"
timeout 240 "$BUILD/block_bench" --tokens 2048,8192,16384 --iters 5 >"$RES/block_bench.md" 2>"$RES/block_bench.err" \
  || { status=1; cat "$RES/block_bench.err" >&2; }
say "zo_bench (src's ZOEngine step, fp32 and bf16 products, model resident on the GPU)"
: >"$RES/zo_bench.json"
: >"$RES/zo_bench.err"
for d in fp32 bf16; do
  timeout 240 "$BUILD/zo_bench" --batch 8 --seq 512 --steps 3 --dtype $d >>"$RES/zo_bench.json" 2>>"$RES/zo_bench.err" \
    || { status=1; cat "$RES/zo_bench.err" >&2; }
done
say "stream_bench (src's engine on the GPU, weights streamed from host memory)"
: >"$RES/stream_bench.md"
: >"$RES/stream_bench.err"
for m in fp32 bf16; do
  timeout 150 "$BUILD/stream_bench" --device cuda --model-config llama-125m --batch 8 --seq 512 \
    --dtype bf16 --master $m --warmup 1 --iters 3 >>"$RES/stream_bench.md" 2>>"$RES/stream_bench.err" \
    || { status=1; cat "$RES/stream_bench.err" >&2; }
  echo >>"$RES/stream_bench.md"
done
say "mezo_peer.py (PyTorch)"
timeout 240 "$PY" bench/gpu/mezo_peer.py --batch 8 --seq 512 --steps 3 >"$RES/mezo_peer.json" 2>"$RES/mezo_peer.err" \
  || { echo "mezo_peer.py failed:" >&2; tail -20 "$RES/mezo_peer.err" >&2; }

# ---- the table ----------------------------------------------------------------------------------
{
  echo "### GPU results $(date -u +%Y-%m-%d)"
  echo
  echo "Machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1);" \
       "CUDA $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2); run.sh total $(elapsed)."
  echo
  echo "GPU tests (\`zof_gpu_tests\`, ZOF_EXPECT_GPU=1): ${TEST_LINE:-did not run (exit $trc)};" \
       "passed ${PASS_N:-0}, failed ${FAIL_N:-0}, skipped ${SKIP_N:-0} (log: gpu_tests.log)."
  echo
  # The Nccl.* tests (one rank on the one GPU) run among them when CMake found NCCL.
  echo "NCCL communicator: $(grep -o 'zof: NCCL communicator .*' "$RES/configure.log" | head -1 | cut -d' ' -f4-)."
  echo
  echo "Forward of one block, random weights, one sequence (MFU: model FLOPs, causal attention"
  echo "counted as computed, over the dense bf16 peak):"
  echo
  cat "$RES/block_bench.md" 2>/dev/null
  echo
  echo "Parameter streaming on the GPU (\`stream_bench --device cuda --dtype bf16\`: src/zo's ZOEngine,"
  echo "the trainer's step in bf16, weights page-locked in host memory and streamed within a budget;"
  echo "an fp32 master, then a bf16 master that crosses the bus in 2 bytes a parameter):"
  echo
  cat "$RES/stream_bench.md" 2>/dev/null
  echo
  echo "MeZO step, ~1.1B LLaMA-shaped model (bench/gpu/tinyllama_1b.json), resident, batch 8 x 512"
  echo "(zof: src/zo's ZOEngine, the trainer's step, on the CUDA backend):"
  echo
  "$PY" - "$RES/zo_bench.json" "$RES/mezo_peer.json" <<'PYEOF' 2>/dev/null || cat "$RES/zo_bench.json" "$RES/mezo_peer.json"
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        rows += [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except OSError:
        pass
ours = next((r for r in rows if r["impl"] == "zof" and r["dtype"] == "bf16"), None) or \
    next((r for r in rows if r["impl"] == "zof"), None)
print("| implementation | dtype | step s | tokens/s | forward s | zof (bf16) / this |")
print("|---|---|---:|---:|---:|---:|")
for r in rows:
    ratio = "%.2fx" % (ours["tokens_per_s"] / r["tokens_per_s"]) if ours and r is not ours else "—"
    print("| %s | %s | %.3f | %.0f | %.3f | %s |" % (r["impl"], r["dtype"], r["step_s"], r["tokens_per_s"], r["forward_s"], ratio))
PYEOF
} >"$MD"
cat "$MD"
say "done, status $status"
exit $status
