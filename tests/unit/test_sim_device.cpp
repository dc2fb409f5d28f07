// The simulated device (sim_device.h): its memory budget, the in-order worker streams, events
// that order streams (and the default stream) without the host waiting, and the hazard checker
// that reports an access no event orders after a conflicting one.
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zof/backend.h"
#include "zof/error.h"
#include "cpu/sim_device.h"

namespace {

std::unique_ptr<zof::SimDevice> sim(size_t budget, double bandwidth = 0, bool check = true) {
  zof::SimDeviceOptions o;
  o.budget = budget;
  o.copy_bandwidth = bandwidth;
  o.check_hazards = check;
  return zof::make_sim_device(zof::make_cpu_backend(1), o);
}

std::vector<float> iota(size_t n, float start = 1.f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SimDevice, AllocationsDrawFromTheBudget) {
  auto d = sim(4096);
  EXPECT_EQ(d->free_memory(), 4096u);
  void* a = d->alloc(1000);  // rounded to 1024
  EXPECT_EQ(d->free_memory(), 4096u - 1024u);
  void* b = d->alloc(3072);
  EXPECT_EQ(d->free_memory(), 0u);
  try {
    d->alloc(1);
    FAIL() << "the budget was exceeded";
  } catch (const zof::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4096-byte budget"), std::string::npos) << m;
    EXPECT_NE(m.find("--gpu-mem"), std::string::npos) << m;
    EXPECT_NE(m.find("1 bytes requested"), std::string::npos) << m;
  }
  d->free(a);
  EXPECT_EQ(d->free_memory(), 1024u);
  void* c = d->alloc(1024);
  const auto st = d->stats();
  EXPECT_EQ(st.peak, 4096u);
  EXPECT_EQ(st.in_use, 4096u);
  d->free(b);
  d->free(c);
  EXPECT_EQ(d->stats().in_use, 0u);
  d->reset_counters();
  EXPECT_EQ(d->stats().peak, 0u);
}

// The pointer checker: an op handed host memory, a copy whose device side is host memory or
// whose host side is device memory are each reported; device memory (a range inside an
// allocation too) is not.
TEST(SimDevice, ReportsOperandsThatAreNotDeviceMemory) {
  auto d = sim(1 << 20);
  float* a = static_cast<float*>(d->alloc(64 * sizeof(float)));
  float* b = static_cast<float*>(d->alloc(64 * sizeof(float)));
  std::vector<float> host = iota(64);
  d->copy_to_device(a, host.data(), 64 * sizeof(float), nullptr);
  d->copy_device(b, a, 64 * sizeof(float), nullptr);
  d->add(b + 16, a + 16, 48);  // within the allocations
  d->copy_to_host(host.data(), b, 64 * sizeof(float), nullptr);
  d->synchronize(nullptr);
  EXPECT_EQ(d->stats().foreign, 0) << d->stats().first_foreign;
  EXPECT_EQ(host[20], 2 * 21.f);

  d->add(b, host.data(), 64);  // a host operand
  EXPECT_EQ(d->stats().foreign, 1);
  EXPECT_NE(d->stats().first_foreign.find("add"), std::string::npos) << d->stats().first_foreign;
  d->copy_to_device(host.data(), a, 16, nullptr);  // both sides the wrong way round
  EXPECT_EQ(d->stats().foreign, 3);
  d->reset_counters();  // never forgotten
  EXPECT_EQ(d->stats().foreign, 3);
  d->free(a);
  d->free(b);

  zof::SimDeviceOptions off;
  off.check_pointers = false;
  auto quiet = zof::make_sim_device(zof::make_cpu_backend(1), off);
  std::vector<float> x = iota(8), y = iota(8);
  quiet->add(y.data(), x.data(), 8);
  EXPECT_EQ(quiet->stats().foreign, 0);
}

// A slow copy on one stream, then a copy on another stream that reads its result: with the
// event the second sees the data; the host never waited in between.
TEST(SimDevice, EventsOrderCopiesAcrossStreams) {
  const size_t n = 1 << 18;  // 1 MiB at 20 MB/s: ~50 ms
  auto d = sim(16 << 20, 20e6);
  zof::Stream *s1 = d->create_stream(), *s2 = d->create_stream();
  zof::Event* e = d->create_event();
  const std::vector<float> src = iota(n);
  std::vector<float> back(n, 0.f);
  float* dev = (float*)d->alloc(n * 4);
  float* dev2 = (float*)d->alloc(n * 4);
  d->copy_to_device(dev, src.data(), n * 4, s1);
  d->record(e, s1);
  d->wait(s2, e);
  d->copy_device(dev2, dev, n * 4, s2);
  d->copy_to_host(back.data(), dev2, n * 4, s2);
  d->synchronize(s2);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), n * 4), 0);
  const auto st = d->stats();
  EXPECT_EQ(st.hazards, 0) << st.first_hazard;
  EXPECT_EQ(st.bytes_to_device, n * 4);
  EXPECT_EQ(st.bytes_to_host, n * 4);
  EXPECT_GT(st.copy_busy_s, 0.04);  // the simulated bus
  d->free(dev);
  d->free(dev2);
}

// Copies on one stream run in the order they were queued.
TEST(SimDevice, OneStreamRunsInOrder) {
  const size_t n = 1 << 16;
  auto d = sim(16 << 20, 50e6);
  zof::Stream* s = d->create_stream();
  const std::vector<float> a = iota(n), b = iota(n, 7.f);
  std::vector<float> back(n);
  float* dev = (float*)d->alloc(n * 4);
  d->copy_to_device(dev, a.data(), n * 4, s);
  d->copy_to_device(dev, b.data(), n * 4, s);
  d->copy_to_host(back.data(), dev, n * 4, s);
  d->synchronize(s);
  EXPECT_EQ(back, b);
  EXPECT_EQ(d->stats().hazards, 0);
  d->free(dev);
}

// An op on the default stream after a wait on an upload's event reads the uploaded data; the
// time it waited is counted as compute waiting on transfers.
TEST(SimDevice, DefaultStreamOpsRunAfterItsWaits) {
  const size_t n = 1 << 18;
  const double bandwidth = 5e6;
  // The copy stream sleeps until the copy has taken bytes / bandwidth (0.21 s) from its start,
  // which follows its queuing; the add, queued `gap` later, blocks at least until then.
  const double copy_s = n * 4 / bandwidth;
  auto d = sim(16 << 20, bandwidth);
  zof::Stream* up = d->create_stream();
  zof::Event* e = d->create_event();
  const std::vector<float> src = iota(n);
  float* dev = (float*)d->alloc(n * 4);
  float* acc = (float*)d->alloc(n * 4);
  std::memset(acc, 0, n * 4);
  using Clock = std::chrono::steady_clock;
  const auto t_copy = Clock::now();
  d->copy_to_device(dev, src.data(), n * 4, up);
  d->record(e, up);
  d->wait(d->default_stream(), e);  // returns at once: the default stream waits, not the host
  const auto t_add = Clock::now();
  d->add(acc, dev, (int64_t)n);     // runs once the upload is done
  const double add_s = std::chrono::duration<double>(Clock::now() - t_add).count();
  const double gap = std::chrono::duration<double>(t_add - t_copy).count();
  std::vector<float> back(n);
  d->copy_to_host(back.data(), acc, n * 4, nullptr);
  d->synchronize(nullptr);
  EXPECT_EQ(back, src);  // the add saw the uploaded data: it ran after the copy
  const auto st = d->stats();
  // Only the add blocked on an event, inside its call. The lower bound leaves 0.05 s for the
  // add's own checks before it waits (a descheduled host); a host that took longer than the
  // copy to queue the add may find the upload done and not wait at all.
  EXPECT_LE(st.compute_wait_s, add_s);
  if (gap < copy_s) {
    EXPECT_GE(st.compute_wait_s, copy_s - gap - 0.05) << "gap " << gap;
  }
  EXPECT_GE(st.copy_busy_s, copy_s - 1e-6);  // less a nanosecond of duration_cast
  EXPECT_EQ(st.hazards, 0) << st.first_hazard;
  d->free(dev);
  d->free(acc);
}

// cudaStreamWaitEvent semantics: a wait on a never-recorded event does nothing, and a wait
// orders after the record current when it is queued, not a later one.
TEST(SimDevice, WaitTakesTheLatestRecordAtTheTime) {
  auto d = sim(64 << 20, 10e6);
  zof::Stream *s1 = d->create_stream(), *s2 = d->create_stream();
  zof::Event* never = d->create_event();
  d->wait(s2, never);
  d->wait(d->default_stream(), never);
  d->synchronize(s2);
  d->synchronize(nullptr);

  // 1.6 s at 10 MB/s: s1's synchronize below returns long before, however loaded the machine.
  const size_t n = 1 << 22;
  const std::vector<float> src = iota(n);
  float* dev = (float*)d->alloc(n * 4);
  zof::Event* e = d->create_event();
  d->record(e, s2);  // s2 is idle: this record completes at once
  d->wait(s1, e);
  d->copy_to_device(dev, src.data(), n * 4, s2);
  d->record(e, s2);  // s1's wait above must not wait for this one
  d->synchronize(s1);
  EXPECT_EQ(d->stats().bytes_to_device, 0u);  // s1 was free to go before the copy ended
  d->synchronize(s2);
  EXPECT_EQ(d->stats().bytes_to_device, n * 4);
  EXPECT_EQ(d->stats().hazards, 0);
  d->free(dev);
}

TEST(SimDevice, FreeWaitsForQueuedWork) {
  const size_t n = 1 << 18;
  auto d = sim(16 << 20, 20e6);
  zof::Stream* s = d->create_stream();
  const std::vector<float> src = iota(n);
  std::vector<float> back(n, 0.f);
  float* dev = (float*)d->alloc(n * 4);
  d->copy_to_device(dev, src.data(), n * 4, s);
  d->copy_to_host(back.data(), dev, n * 4, s);
  d->free(dev);  // only after both copies ran
  EXPECT_EQ(back, src);
}

// The checker sees a missing event whatever the timing did.
TEST(SimDevice, HazardCheckerReportsUnorderedAccesses) {
  const size_t n = 1024;
  const std::vector<float> src = iota(n);
  std::vector<float> back(n);
  {  // a write-back of a buffer that compute wrote, with no event between them
    auto d = sim(1 << 20);
    zof::Stream* down = d->create_stream();
    float* dev = (float*)d->alloc(n * 4);
    d->copy_device(dev, src.data(), n * 4, nullptr);
    d->copy_to_host(back.data(), dev, n * 4, down);
    d->synchronize(down);
    const auto st = d->stats();
    EXPECT_EQ(st.hazards, 1);
    EXPECT_NE(st.first_hazard.find("stream 1 reads"), std::string::npos) << st.first_hazard;
    d->free(dev);
  }
  {  // the same with the event: clean
    auto d = sim(1 << 20);
    zof::Stream* down = d->create_stream();
    zof::Event* e = d->create_event();
    float* dev = (float*)d->alloc(n * 4);
    d->copy_device(dev, src.data(), n * 4, nullptr);
    d->record(e, nullptr);
    d->wait(down, e);
    d->copy_to_host(back.data(), dev, n * 4, down);
    d->synchronize(down);
    EXPECT_EQ(d->stats().hazards, 0) << d->stats().first_hazard;
    d->free(dev);
  }
  {  // compute reading a buffer an upload stream will fill, with no wait; the upload is held
     // back behind a slow copy so that the two never run at the same time
    auto d = sim(4 << 20, 10e6);
    zof::Stream *gate = d->create_stream(), *up = d->create_stream();
    zof::Event* open = d->create_event();
    std::vector<float> big(1 << 18, 0.f);
    float* slow = (float*)d->alloc(big.size() * 4);
    float* dev = (float*)d->alloc(n * 4);
    float* acc = (float*)d->alloc(n * 4);
    std::memset(acc, 0, n * 4);
    d->copy_to_device(slow, big.data(), big.size() * 4, gate);  // ~100 ms
    d->record(open, gate);
    d->wait(up, open);
    d->copy_to_device(dev, src.data(), n * 4, up);
    d->add(acc, dev, (int64_t)n);
    d->synchronize(up);
    EXPECT_EQ(d->stats().hazards, 1);
    EXPECT_NE(d->stats().first_hazard.find("stream 0 reads"), std::string::npos)
        << d->stats().first_hazard;
    d->free(slow);
    d->free(dev);
    d->free(acc);
  }
  {  // two copy streams writing the same range; a synchronize in between orders them
    auto d = sim(4 << 20, 10e6);
    zof::Stream *gate = d->create_stream(), *a = d->create_stream(), *b = d->create_stream();
    zof::Event* open = d->create_event();
    std::vector<float> big(1 << 18, 0.f);
    float* slow = (float*)d->alloc(big.size() * 4);
    float* dev = (float*)d->alloc(n * 4);
    d->copy_to_device(dev, src.data(), n * 4, a);
    d->synchronize(a);
    d->copy_to_device(dev, src.data(), n * 4, b);
    d->synchronize(b);
    EXPECT_EQ(d->stats().hazards, 0);
    d->copy_to_device(slow, big.data(), big.size() * 4, gate);
    d->record(open, gate);
    d->wait(a, open);  // a's copy runs after b's (the timing), but nothing orders them
    d->copy_to_device(dev, src.data(), n * 4, a);
    d->copy_to_device(dev, src.data(), n * 4, b);
    d->synchronize(a);
    d->synchronize(b);
    EXPECT_EQ(d->stats().hazards, 1);
    d->free(slow);
    d->free(dev);
  }
}

TEST(SimDevice, OpsMatchTheHostBackend) {
  auto d = sim(1 << 20);
  auto h = zof::make_cpu_backend(1);
  const int64_t M = 5, N = 7, K = 9;
  const std::vector<float> x = iota(M * K, -3.f), w = iota(N * K, -20.f);
  float* xd = (float*)d->alloc(M * K * 4);
  float* wd = (float*)d->alloc(N * K * 4);
  float* yd = (float*)d->alloc(M * N * 4);
  d->copy_to_device(xd, x.data(), x.size() * 4, nullptr);
  d->copy_to_device(wd, w.data(), w.size() * 4, nullptr);
  d->matmul(xd, wd, nullptr, yd, M, N, K);
  std::vector<float> y(M * N), ref(M * N);
  d->copy_to_host(y.data(), yd, y.size() * 4, nullptr);
  d->synchronize(nullptr);
  h->matmul(x.data(), w.data(), nullptr, ref.data(), M, N, K);
  EXPECT_EQ(y, ref);
  EXPECT_EQ(d->name(), "sim:cpu");
  d->free(xd);
  d->free(wd);
  d->free(yd);
}

}  // namespace
