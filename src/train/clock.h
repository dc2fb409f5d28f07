// The trainer's one clock: seconds on the steady clock, for step times, evaluation times and ETAs.
#pragma once
#include <chrono>

namespace zof::train {
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace zof::train
