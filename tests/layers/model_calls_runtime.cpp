// A program of the model layer that calls the runtime, a layer above it, through a declaration
// of its own (it cannot include zof/runtime.h): linked against the layers model builds on, it
// must not link (ctest layers.call_up_fails_to_link); against every layer it does (ctest
// layers.call_links_with_all), so the symbol is real.
namespace zof {
int default_host_threads();  // src/runtime/runtime.cpp
}  // namespace zof

int main() { return zof::default_host_threads() > 0 ? 0 : 1; }
