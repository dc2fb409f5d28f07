#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, in build-fuzz/) and runs each for N
# executions over a copy of its seed corpus fuzz/corpus/<target>/, one target after the other,
# then prints a table: target, executions, exec/s, seconds, findings. Exits non-zero on any
# finding (crash, UB, leak, timeout over 5 s, allocation over 1 GB, memory over 2 GB); the
# reproducer is in build-fuzz/runs/<target>/artifacts/, and its log beside it.
#
#   scripts/fuzz.sh [-n RUNS] [-t SECONDS] [--merge] [--resume] [TARGET...]
#     -n RUNS   executions per target (default 10000000; ZOF_FUZZ_RUNS overrides the default)
#     -t SECS   stop each target after SECS seconds if it has not reached RUNS (a quick pass)
#     --merge   afterwards, add the inputs that reached new edges to fuzz/corpus/<target>/
#               (libFuzzer -merge=1 on edge coverage alone, which keeps the corpus small)
#     --resume  continue from the corpus the last run left in build-fuzz/runs/<target>/ (a long
#               run in chunks: add up the chunks' executions); its log is kept as log.1, ...
#     TARGET    config, gguf, safetensors, safetensors_index, task_data, tokenizer, tokenizer_text
#               (default: all)
# ZOF_FUZZ_TIMEOUT (seconds, default 5) is the per-input timeout: a wall-clock limit, so a run
# niced under other load may want more (a starved process can pass 5 s on a 40 ms input).
# Not part of CI (10 million executions take minutes to an hour a target); CI replays the corpus
# through the ctest label `fuzz`. Installs clang, libomp and the build tools it needs on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${ZOF_FUZZ_RUNS:-10000000}
TIMEOUT=${ZOF_FUZZ_TIMEOUT:-5}
MERGE=0
RESUME=0
SECS=0
TARGETS=()
while (($#)); do
  case "$1" in
    -n) RUNS="$2"; shift 2 ;;
    -t) SECS="$2"; shift 2 ;;
    --merge) MERGE=1; shift ;;
    --resume) RESUME=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
if ((${#TARGETS[@]} == 0)); then
  for f in fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); TARGETS+=("${t#fuzz_}"); done
fi
for t in "${TARGETS[@]}"; do
  [ -f "fuzz/fuzz_$t.cpp" ] || { echo "fuzz.sh: no target $t (fuzz/fuzz_$t.cpp)" >&2; exit 2; }
done

# clang with libFuzzer (Debian's clang ships libclang_rt.fuzzer), its OpenMP runtime, and what
# CMake needs to configure zof.
PKGS=(clang libomp-dev cmake ninja-build nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "fuzz.sh: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD=build-fuzz
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 -g without NDEBUG: the library's and nlohmann's assertions stay on.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DZOF_FUZZ=ON -DZOF_CUDA=OFF -DZOF_MPI=OFF \
  -DZOF_NCCL=OFF -DZOF_DNNL=OFF -DZOF_BUILD_TESTS=OFF -DZOF_BUILD_BENCH=OFF -DZOF_NATIVE=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
rows=()
failed=0
for t in "${TARGETS[@]}"; do
  dir="$BUILD/runs/$t"
  if [ "$RESUME" = 1 ] && [ -d "$dir/corpus" ]; then
    k=1
    while [ -e "$dir/log.$k" ]; do k=$((k + 1)); done
    [ ! -f "$dir/log" ] || mv "$dir/log" "$dir/log.$k"
  else
    rm -rf "$dir"
  fi
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "fuzz/corpus/$t/." "$dir/corpus/"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "fuzz.sh: $t: $RUNS executions$( ((SECS)) && echo " or $SECS s") (log: $dir/log)"
  t0=$SECONDS
  rc=0
  "$BUILD/fuzz_$t" -runs="$RUNS" -max_total_time="$SECS" -timeout="$TIMEOUT" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "${dict[@]}" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  secs=$((SECONDS - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  # slow-unit-* files are inputs over -report_slow_units, not findings.
  findings=$(find "$dir/artifacts" -type f ! -name 'slow-unit-*' | wc -l)
  if [ "$rc" != 0 ] && [ "$findings" = 0 ]; then findings=1; fi  # died without a reproducer
  if [ "$findings" != 0 ]; then
    failed=1
    grep -m1 -E "ERROR: |runtime error|terminate called|internal error" "$dir/log" >&2 || tail -5 "$dir/log" >&2
  fi
  rows+=("$(printf '%-18s %12s %9s %8s %9s' "$t" "${execs:-?}" "${rate:-?}" "$secs" "$findings")")
  if [ "$MERGE" = 1 ] && [ "$findings" = 0 ]; then
    "$BUILD/fuzz_$t" -merge=1 -use_counters=0 -timeout="$TIMEOUT" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      "fuzz/corpus/$t" "$dir/corpus" >"$dir/merge.log" 2>&1
    echo "fuzz.sh: $t: $(grep -o 'MERGE-OUTER: [0-9]* new files' "$dir/merge.log" | tail -1) to fuzz/corpus/$t"
  fi
done
printf '%-18s %12s %9s %8s %9s\n' target executions exec/s seconds findings
printf '%s\n' "${rows[@]}"
exit "$failed"
