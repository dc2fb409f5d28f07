// The link between two ranks as zof's distributed layer sees it: one-way time of a float
// message (ping-pong between ranks 0 and 1 through dist::Communicator send/recv) from 8 bytes to
// 64 MB, giving the latency alpha and the bandwidth beta that bench/scaling_model.py takes; and
// the time of the per-step reduction (allreduce_sum_ordered of 2q + 3 doubles) over every rank.
// Each figure is the best of 5 rounds (a shared machine's load only adds time).
//   mpirun --oversubscribe -np 2 build/dist_pingpong_bench [--iters 50] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "zof/dist.h"
#include "zof/error.h"
#include "zof/runtime.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Ping-pong latency and bandwidth between ranks 0 and 1, and the per-step reduction"};
  int iters = 50, queries = 1;
  bool as_json = false;
  app.add_option("--iters", iters, "Round trips per message size (fewer for large ones)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--queries", queries, "q of the reduction (2q + 3 doubles)")->check(CLI::Range(1, 1024));
  app.add_flag("--json", as_json, "End with one JSON line");
  CLI11_PARSE(app, argc, argv);
  try {
    auto comm = zof::connect_job(0);
    const int rank = comm->rank(), size = comm->size();
    ZOF_CHECK(size >= 2, "start with mpirun -np 2 (or more): the ping-pong needs two ranks; this is " +
                             comm->name());
    nlohmann::json rows = nlohmann::json::array();
    if (rank == 0) {
      std::printf("%s\n\n| message | one-way time (us) | bandwidth (GB/s) |\n|---:|---:|---:|\n",
                  comm->name().c_str());
    }
    for (int64_t bytes : {8LL, 1LL << 10, 1LL << 16, 1LL << 20, 1LL << 24, 1LL << 26}) {
      const int64_t n = std::max<int64_t>(1, bytes / 4);
      std::vector<float> buf(n, 1.f);
      const int it = std::max(2, (int)std::min<int64_t>(iters, (int64_t(1) << 30) / bytes / 4));
      // The best of 5 rounds: on a shared machine the others' load only ever adds time.
      double one_way = 1e30;
      for (int round = 0; round < 5; ++round) {
        comm->barrier();
        double t0 = 0;
        for (int i = -1; i < it; ++i) {  // i = -1: warm-up
          if (i == 0) t0 = now_s();
          if (rank == 0) {
            comm->send(buf.data(), n, 1, 1);
            comm->recv(buf.data(), n, 1, 2);
          } else if (rank == 1) {
            comm->recv(buf.data(), n, 0, 1);
            comm->send(buf.data(), n, 0, 2);
          }
        }
        one_way = std::min(one_way, (now_s() - t0) / it / 2);
      }
      if (rank == 0) {
        std::printf("| %lld B | %.1f | %.3f |\n", (long long)(n * 4), one_way * 1e6,
                    n * 4 / one_way / 1e9);
        rows.push_back({{"bytes", n * 4}, {"one_way_s", one_way}});
      }
    }
    // The per-step reduction of data-parallel training.
    std::vector<double> red(2 * queries + 3, 1.0);
    comm->barrier();
    const int rit = std::max(iters, 100);
    double t_red = 1e30;
    for (int round = 0; round < 5; ++round) {
      comm->barrier();
      const double t0 = now_s();
      for (int i = 0; i < rit; ++i) comm->allreduce_sum_ordered(red.data(), (int)red.size());
      t_red = std::min(t_red, (now_s() - t0) / rit);
    }
    if (rank == 0) {
      std::printf("\nper-step reduction of %zu doubles over %d ranks: %.1f us\n", red.size(), size,
                  t_red * 1e6);
      if (as_json)
        std::printf("%s\n", nlohmann::json{{"transport", comm->name()},
                                           {"ranks", size},
                                           {"alpha_s", rows[0]["one_way_s"]},
                                           {"beta_Bps", (double)rows.back()["bytes"] /
                                                            (double)rows.back()["one_way_s"]},
                                           {"reduction_s", t_red},
                                           {"pingpong", rows}}
                                  .dump()
                                  .c_str());
    }
  } catch (const zof::Error& e) {
    std::fprintf(stderr, "dist_pingpong_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
