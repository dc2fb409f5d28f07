// The terminal's TrainSink: messages and progress lines on stderr. On a terminal one progress
// line is rewritten in place after every step; in a log, a line every 2% of the steps and at
// evaluations. The run's JSON summary is the CLI's to print, on stdout.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "zof/trainer.h"

namespace zof {
namespace {

std::string fmt_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%dh%02dm", (int)(s / 3600), (int)std::fmod(s / 60, 60));
  else
    std::snprintf(b, sizeof b, "%dm%02ds", (int)(s / 60), (int)std::fmod(s, 60));
  return b;
}

class TerminalSink : public TrainSink {
 public:
  TerminalSink() : tty_(::isatty(STDERR_FILENO)) {}
  void message(const std::string& s) override {
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", s.c_str());
  }
  bool on_step(const StepReport& r) override {
    const int64_t print_every = std::max<int64_t>(1, r.steps / 50);
    if (!(tty_ || r.step % print_every == 0 || r.step == r.steps || r.evaluated)) return false;
    const double per_step = r.elapsed_s / (double)(r.step - r.first_step);
    char b[256];
    std::snprintf(b, sizeof b, "step %lld/%lld  loss %.4f  %s %.4f  %.0f tok/s  ETA %s",
                  (long long)r.step, (long long)r.steps, r.recent_loss, r.metric.c_str(),
                  r.metric_value, r.tokens_per_s,
                  fmt_eta(per_step * (double)(r.steps - r.step)).c_str());
    if (tty_)
      std::fprintf(stderr, "\r\033[K%s", b);
    else
      std::fprintf(stderr, "%s\n", b);
    return false;
  }
  void finish() override {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  const bool tty_;
};

}  // namespace

std::unique_ptr<TrainSink> make_terminal_sink() { return std::make_unique<TerminalSink>(); }

}  // namespace zof
