// The fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once on every file of the
// directories (or files) given, in sorted order, so that the plain and sanitizer test builds
// replay the seed corpus (ctest label `fuzz`). Exit 0 when every input ran; a finding crashes,
// aborts or (under the sanitizers) reports, as under the fuzzer.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs (give corpus directories or files)\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (const fs::path& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.eof() && f.fail()) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
      return 2;
    }
    // A copy of exactly the input's size, so that ASan sees reads past its end as libFuzzer would.
    std::vector<uint8_t> exact(bytes.begin(), bytes.end());
    uint8_t* data = exact.empty() ? nullptr : exact.data();
    LLVMFuzzerTestOneInput(data, exact.size());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("replay: %zu inputs in %.2f s\n", inputs.size(), s);
  return 0;
}
