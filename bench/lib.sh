# Sourced by the bench/*.sh scripts (from the repository root, with BUILD set).
# build_targets [CMAKE_FLAG...] -- TARGET...: configures $BUILD as a Release build without the
# tests when it has no build files yet (the flags added), then builds the targets.
build_targets() {
  local flags=()
  while [[ $# -gt 0 && $1 != -- ]]; do flags+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  if [[ ! -f "$BUILD/build.ninja" && ! -f "$BUILD/Makefile" ]]; then
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DZOF_BUILD_TESTS=OFF >&2
  fi
  cmake --build "$BUILD" --target "$@" >&2
}
