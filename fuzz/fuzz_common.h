// What the fuzz targets share: a scratch directory of this process for loaders that take a path,
// and the rule that zof::Error is the one accepted way to refuse input (anything else escaping
// LLVMFuzzerTestOneInput is a finding: libFuzzer reports the uncaught exception as a crash).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "zof/error.h"

namespace zof::fuzz {

// zof-fuzz-<pid> in /dev/shm (memory: a file rewritten every execution on a disk costs more
// than the parsing) or else the temporary directory; created on first use, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    std::string d = (base / ("zof-fuzz-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    static const std::string for_exit = d;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(for_exit, ec);
    });
    return d;
  }();
  return dir;
}

// scratch_dir()/name holding exactly these bytes; returns its path.
inline std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();  // the harness's own failure, not the input's
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) std::abort();
    done += size_t(w);
  }
  ::close(fd);
  return path;
}

inline void remove_file(const std::string& name) { ::unlink((scratch_dir() + "/" + name).c_str()); }

// The input cut at NUL bytes into at most max_parts parts (the last one keeps any further NULs).
// Several files in one input: text formats (JSON, TSV) never hold a raw NUL.
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
  std::vector<std::string_view> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < max_parts) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  return parts;
}

}  // namespace zof::fuzz

// Runs the statements given; a zof::Error is the input refused cleanly.
#define ZOF_FUZZ_REFUSE_OK(...)      \
  do {                               \
    try {                            \
      __VA_ARGS__;                   \
    } catch (const ::zof::Error&) {  \
    }                                \
  } while (0)
