// Shared test helpers: where the assets are, and the rule that a missing asset fails under CI.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace zof::test {

inline std::string assets_dir() { return ZOF_ASSETS_DIR; }
inline std::string source_dir() { return ZOF_SOURCE_DIR; }
inline std::string binary_dir() { return ZOF_BINARY_DIR; }
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

}  // namespace zof::test

// Skips the test when path is missing locally, fails it under CI=true.
#define ZOF_REQUIRE_PATH(path)                                                       \
  do {                                                                               \
    if (!std::filesystem::exists(path)) {                                            \
      if (::zof::test::in_ci()) FAIL() << "missing required test input: " << (path); \
      GTEST_SKIP() << "missing test input: " << (path);                              \
    }                                                                                \
  } while (0)
