// The disk tier's I/O layer (src/util/block_io.h): on every engine this build and kernel run
// (io_uring and the pread/pwrite pool), transfers come back whole through short counts, EINTR
// and EAGAIN, and every failure (ENOSPC mid-write, a file truncated under the run, a full file
// system at creation) is a zof::Error naming the file; O_DIRECT refused falls back to buffered
// I/O and says so; the engine chosen, and why the pool, is said. Faults are injected with
// set_io_fault_hook.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include "common.h"
#include "util/block_io.h"
#include "zof/error.h"

namespace {

namespace fs = std::filesystem;
using zof::AlignedBuffer;
using zof::BlockFile;
using zof::IoEngineKind;
using zof::kIoAlign;

class BlockIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zof_block_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    zof::set_io_fault_hook({});
    fs::remove_all(dir_);
  }
  static void fill(AlignedBuffer& b, int seed) {
    for (size_t i = 0; i < b.size; ++i) b.data[i] = char((i * 131 + (size_t)seed) & 0xff);
  }
  // The message of the zof::Error that f throws ("" when none).
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const zof::Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(BlockIo, ODirectRefusedFallsBackToBufferedAndSaysWhy) {
  // A file system that accepts the flag and refuses the transfers (as tmpfs did): the probe
  // write fails with EINVAL.
  bool probed = false;
  zof::set_io_fault_hook([&](char op, size_t, uint64_t off) -> long {
    if (op == 'w' && off == 0 && !probed) {
      probed = true;
      return -EINVAL;
    }
    return -1;
  });
  BlockFile f(dir_ / "store.bin", 8 * kIoAlign);
  EXPECT_TRUE(probed);
  EXPECT_FALSE(f.direct());
  EXPECT_NE(f.note().find("refused an O_DIRECT write"), std::string::npos) << f.note();
  // Buffered I/O takes what O_DIRECT would not: an odd length at an odd offset.
  std::vector<char> out(1000), in(1000);
  std::iota(out.begin(), out.end(), 0);
  f.write(out.data(), out.size(), 77);
  f.read(in.data(), in.size(), 77);
  EXPECT_EQ(in, out);
}

TEST_F(BlockIo, AFullFileSystemIsRefusedAtCreationNamingTheBytes) {
  const uint64_t free = zof::free_space(dir_);
  const uint64_t want = free + (uint64_t(1) << 40);  // a terabyte more than there is
  const fs::path p = dir_ / "store.bin";
  const std::string e = error_of([&] { BlockFile f(p, want); });
  EXPECT_NE(e.find("no space for " + p.string()), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string((want + kIoAlign - 1) / kIoAlign * kIoAlign) + " bytes"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(p));  // nothing left behind
}

TEST_F(BlockIo, ThePoolRunsEveryJobAndReportsTheFirstError) {
  zof::IoPool pool(2);
  std::atomic<int> ran{0};
  std::vector<std::function<void()>> jobs;
  for (int i = 0; i < 20; ++i) jobs.push_back([&] { ++ran; });
  auto ok = pool.submit(std::move(jobs));
  ok->wait();
  EXPECT_EQ(ran.load(), 20);
  EXPECT_TRUE(ok->done());
  std::vector<std::function<void()>> bad;
  bad.push_back([] { throw zof::Error("cannot read X"); });
  bad.push_back([&] { ++ran; });
  auto t = pool.submit(std::move(bad));
  const std::string e = error_of([&] { t->wait(); });
  EXPECT_EQ(e, "cannot read X");
  EXPECT_EQ(ran.load(), 21);  // the group's other job still ran
}

// ---- every engine --------------------------------------------------------------------------

// The engines to test: the pool always, io_uring where the build has liburing (where the kernel
// refuses it, its cases skip saying so: the pool is what runs there).
std::vector<IoEngineKind> built_engines() {
  std::vector<IoEngineKind> k{IoEngineKind::Pool};
  if (zof::io_uring_built()) k.push_back(IoEngineKind::Uring);
  return k;
}

std::string engine_name(const ::testing::TestParamInfo<IoEngineKind>& i) {
  return i.param == IoEngineKind::Uring ? "uring" : "pool";
}

class BlockIoEngine : public BlockIo, public ::testing::WithParamInterface<IoEngineKind> {
 protected:
  void SetUp() override {
    BlockIo::SetUp();
    if (GetParam() == IoEngineKind::Uring) {
      const std::string why = zof::io_uring_unavailable();
      if (!why.empty()) GTEST_SKIP() << "the kernel refused io_uring (" << why
                                     << "): the disk tier runs on the pread/pwrite pool here";
    }
    engine_ = zof::make_io_engine(2, GetParam());
    ASSERT_EQ(std::string(engine_->name()),
              GetParam() == IoEngineKind::Uring ? "io_uring" : "pread/pwrite");
  }
  void TearDown() override {
    engine_.reset();  // every transfer done before the hook and the files go
    BlockIo::TearDown();
  }
  // One transfer through the engine, waited for.
  void xfer(char op, const BlockFile& f, char* buf, size_t n, uint64_t off) {
    engine_->submit({zof::IoTransfer{op, &f, buf, n, off, {}}})->wait();
  }
  std::unique_ptr<zof::IoEngine> engine_;
};

TEST_P(BlockIoEngine, ShortTransfersAndEintrAreRetriedUntilWhole) {
  BlockFile f(dir_ / "store.bin", 64 * kIoAlign);
  AlignedBuffer out(16 * kIoAlign), in(16 * kIoAlign);
  fill(out, 3);
  // Every call moves at most 5000 bytes (one aligned block with O_DIRECT, which moves whole
  // blocks only) and every third call is interrupted.
  std::atomic<int> calls{0};
  const long most = f.direct() ? (long)kIoAlign : 5000;
  zof::set_io_fault_hook([&](char, size_t, uint64_t) -> long {
    return ++calls % 3 == 0 ? -EINTR : most;
  });
  xfer('w', f, out.data, out.size, 8 * kIoAlign);
  xfer('r', f, in.data, in.size, 8 * kIoAlign);
  EXPECT_GT(calls.load(), 2 * 16);  // the transfers really were cut up
  zof::set_io_fault_hook({});
  EXPECT_EQ(std::memcmp(in.data, out.data, in.size), 0);
}

TEST_P(BlockIoEngine, EagainIsRetriedUntilWhole) {
  BlockFile f(dir_ / "store.bin", 32 * kIoAlign);
  AlignedBuffer out(8 * kIoAlign), in(8 * kIoAlign);
  fill(out, 5);
  // Each offset is refused twice with EAGAIN (a non-blocking queue that is full), then runs
  // one aligned block.
  std::map<uint64_t, int> refused;
  std::mutex mu;
  zof::set_io_fault_hook([&](char, size_t, uint64_t off) -> long {
    std::lock_guard<std::mutex> l(mu);
    return refused[off]++ < 2 ? -EAGAIN : (long)kIoAlign;
  });
  xfer('w', f, out.data, out.size, 4 * kIoAlign);
  EXPECT_EQ(refused.size(), 8u);  // block by block
  refused.clear();
  xfer('r', f, in.data, in.size, 4 * kIoAlign);
  zof::set_io_fault_hook({});
  EXPECT_EQ(refused.size(), 8u);
  for (const auto& [off, n] : refused) EXPECT_EQ(n, 3) << off;  // two refusals, one run
  EXPECT_EQ(std::memcmp(in.data, out.data, in.size), 0);
}

TEST_P(BlockIoEngine, NoSpaceMidWriteIsAnErrorNamingTheFile) {
  BlockFile f(dir_ / "store.bin", 32 * kIoAlign);
  AlignedBuffer out(8 * kIoAlign);
  int calls = 0;
  zof::set_io_fault_hook([&](char op, size_t, uint64_t) -> long {
    return op == 'w' && ++calls > 1 ? -ENOSPC : (long)kIoAlign;  // one block, then a full disk
  });
  const std::string e = error_of([&] { xfer('w', f, out.data, out.size, 0); });
  EXPECT_NE(e.find("no space left writing " + (dir_ / "store.bin").string()), std::string::npos)
      << e;
  EXPECT_NE(e.find("--offload-dir"), std::string::npos) << e;
  EXPECT_EQ(calls, 2);  // not retried for ever
}

TEST_P(BlockIoEngine, OtherErrorsNameTheFileAndTheOffset) {
  BlockFile f(dir_ / "store.bin", 8 * kIoAlign);
  AlignedBuffer b(kIoAlign);
  zof::set_io_fault_hook([](char, size_t, uint64_t) -> long { return -EIO; });
  const std::string e = error_of([&] { xfer('r', f, b.data, b.size, 4 * kIoAlign); });
  EXPECT_NE(e.find("cannot read 4096 bytes at offset 16384 of " + (dir_ / "store.bin").string() +
                   ": " + std::strerror(EIO)),
            std::string::npos)
      << e;
}

TEST_P(BlockIoEngine, AFileTruncatedUnderTheRunIsACleanError) {
  const fs::path p = dir_ / "store.bin";
  BlockFile f(p, 16 * kIoAlign);
  AlignedBuffer out(4 * kIoAlign), in(4 * kIoAlign);
  fill(out, 9);
  xfer('w', f, out.data, out.size, 8 * kIoAlign);
  fs::resize_file(p, 9 * kIoAlign);  // someone cut the store short
  const std::string e = error_of([&] { xfer('r', f, in.data, in.size, 8 * kIoAlign); });
  EXPECT_NE(e.find(p.string() + " was truncated under the run"), std::string::npos) << e;
  EXPECT_NE(e.find("36864 bytes"), std::string::npos) << e;  // its size now
}

// More transfers than io_uring's queue depth, cut short and refused at random, come back whole
// and in their places; `then` runs once for each; a failed one fails its group, naming its
// offset, and the others in the group still complete.
TEST_P(BlockIoEngine, ManyTransfersInFlightComeBackWholeAndAFailureStaysInItsTransfer) {
  const size_t n = 3 * zof::kUringDepth;  // transfers of 1 and 3 blocks alternately
  BlockFile f(dir_ / "store.bin", 2 * n * kIoAlign);
  AlignedBuffer out(2 * n * kIoAlign), in(2 * n * kIoAlign);
  fill(out, 11);
  auto group = [&](char op, AlignedBuffer& b, std::atomic<int>& thens) {
    std::vector<zof::IoTransfer> t;
    for (size_t i = 0, at = 0; i < n; at += (i % 2 ? 3 : 1) * kIoAlign, ++i)
      t.push_back({op, &f, b.data + at, (i % 2 ? 3 : 1) * kIoAlign, at, [&thens] { ++thens; }});
    return t;
  };
  std::atomic<int> calls{0};
  zof::set_io_fault_hook([&](char, size_t bytes, uint64_t) -> long {
    const int c = ++calls;
    if (c % 7 == 0) return -EAGAIN;
    if (c % 5 == 0) return -EINTR;
    return c % 3 == 0 && bytes > kIoAlign ? (long)kIoAlign : -1;  // short: one block
  });
  std::atomic<int> wthen{0}, rthen{0};
  engine_->submit(group('w', out, wthen))->wait();
  engine_->submit(group('r', in, rthen))->wait();
  EXPECT_EQ(wthen.load(), (int)n);
  EXPECT_EQ(rthen.load(), (int)n);
  EXPECT_GT(calls.load(), (int)(2 * n + n / 2));  // cut up and refused: more calls than transfers
  EXPECT_EQ(std::memcmp(in.data, out.data, in.size), 0);
  // One failure among many: the transfer of one block at block 4 (the third).
  const uint64_t bad = 4 * kIoAlign;
  zof::set_io_fault_hook(
      [&](char, size_t, uint64_t off) -> long { return off == bad ? -EIO : -1; });
  std::atomic<int> fthen{0};
  auto t = engine_->submit(group('r', in, fthen));
  const std::string e = error_of([&] { t->wait(); });
  EXPECT_NE(e.find("cannot read 4096 bytes at offset " + std::to_string(bad)), std::string::npos)
      << e;
  EXPECT_TRUE(t->done());
  EXPECT_EQ(fthen.load(), (int)n - 1);  // every other transfer of the group ran whole
}

INSTANTIATE_TEST_SUITE_P(Engines, BlockIoEngine, ::testing::ValuesIn(built_engines()),
                         engine_name);

// ---- which engine runs, and that it is said --------------------------------------------------

using zof::test::ScopedEnv;

TEST(IoEngineSelection, AutoTakesIoUringWhereItRunsElseThePoolSayingWhy) {
  const std::string why = zof::io_uring_unavailable();
  // Printed so that a CI log shows which engine this machine's tests ran.
  std::printf("io_uring here: %s\n", why.empty() ? "runs" : ("refused: " + why).c_str());
  auto e = zof::make_io_engine(3, IoEngineKind::Auto);
  if (why.empty()) {
    EXPECT_TRUE(zof::io_uring_built());
    EXPECT_EQ(std::string(e->name()), "io_uring");
    EXPECT_EQ(e->describe(), "io_uring, queue depth " + std::to_string(zof::kUringDepth));
  } else {
    EXPECT_EQ(std::string(e->name()), "pread/pwrite");
    EXPECT_EQ(e->describe(), "pread/pwrite on 3 threads (io_uring refused: " + why + ")");
  }
}

TEST(IoEngineSelection, ForcedUringWhereItCannotRunIsAnErrorSayingWhy) {
  const std::string why = zof::io_uring_unavailable();
  std::string err;
  try {
    auto e = zof::make_io_engine(2, IoEngineKind::Uring);
    EXPECT_EQ(std::string(e->name()), "io_uring");
  } catch (const zof::Error& x) {
    err = x.what();
  }
  if (why.empty())
    EXPECT_EQ(err, "");
  else
    EXPECT_NE(err.find("ZOF_IO=uring, but io_uring refused: " + why), std::string::npos) << err;
}

// Refuses io_uring_setup with EPERM in this process from here on, as a container's seccomp
// profile does (Docker's default among them).
bool refuse_io_uring() {
  sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
  sock_fprog prog{(unsigned short)(sizeof f / sizeof f[0]), f};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// The death test's child: io_uring refused, an Auto engine made, what it and the probe say
// printed, a page written and read back through it; exit 0 when the page came back.
[[noreturn]] void run_without_io_uring() {
  if (!refuse_io_uring()) {
    std::fprintf(stderr, "cannot install the seccomp filter\n");
    std::_Exit(2);
  }
  auto e = zof::make_io_engine(2, IoEngineKind::Auto);
  std::fprintf(stderr, "[%s] [%s]\n", e->describe().c_str(), zof::io_uring_unavailable().c_str());
  const fs::path p =
      fs::temp_directory_path() / ("zof_io_seccomp_" + std::to_string(::getpid()) + ".bin");
  BlockFile f(p, 2 * kIoAlign);
  AlignedBuffer out(kIoAlign), in(kIoAlign);
  std::memset(out.data, 0x71, out.size);
  e->submit({zof::IoTransfer{'w', &f, out.data, out.size, kIoAlign, {}}})->wait();
  e->submit({zof::IoTransfer{'r', &f, in.data, in.size, kIoAlign, {}}})->wait();
  f.remove();
  std::_Exit(std::memcmp(in.data, out.data, in.size) == 0 ? 0 : 3);
}

// Where io_uring_setup is refused (seccomp here, whatever this kernel does), Auto falls back to
// the pool and says why, and the pool moves bytes. In a child process (a death test), so the
// filter stays there.
TEST(IoEngineSelection, RefusedBySeccompFallsBackToThePoolSayingWhy) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const std::string said =
      zof::io_uring_built()
          ? "\\[pread/pwrite on 2 threads \\(io_uring refused: io_uring_queue_init: Operation "
            "not permitted\\)\\] \\[io_uring_queue_init: Operation not permitted\\]"
          : "\\[pread/pwrite on 2 threads \\(io_uring refused: built without liburing\\)\\]";
  EXPECT_EXIT(run_without_io_uring(), ::testing::ExitedWithCode(0), said);
}

TEST(IoEngineSelection, ZofIoPoolForcesThePoolAndOtherValuesAreRefused) {
  {
    ScopedEnv env("ZOF_IO", "pool");
    ASSERT_EQ(zof::io_engine_from_env(), IoEngineKind::Pool);
    auto e = zof::make_io_engine(2, zof::io_engine_from_env());
    EXPECT_EQ(std::string(e->name()), "pread/pwrite");
    EXPECT_EQ(e->describe(), "pread/pwrite on 2 threads (ZOF_IO=pool)");
    // And it moves bytes.
    const fs::path dir = fs::temp_directory_path() / ("zof_io_env_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    {
      BlockFile f(dir / "store.bin", 4 * kIoAlign);
      AlignedBuffer out(2 * kIoAlign), in(2 * kIoAlign);
      std::memset(out.data, 0x3c, out.size);
      e->submit({zof::IoTransfer{'w', &f, out.data, out.size, kIoAlign, {}}})->wait();
      e->submit({zof::IoTransfer{'r', &f, in.data, in.size, kIoAlign, {}}})->wait();
      EXPECT_EQ(std::memcmp(in.data, out.data, in.size), 0);
    }
    fs::remove_all(dir);
  }
  {
    ScopedEnv env("ZOF_IO", "uring");
    EXPECT_EQ(zof::io_engine_from_env(), IoEngineKind::Uring);
  }
  {
    ScopedEnv env("ZOF_IO", "");
    EXPECT_EQ(zof::io_engine_from_env(), IoEngineKind::Auto);
  }
  ScopedEnv env("ZOF_IO", "aio");
  std::string err;
  try {
    zof::io_engine_from_env();
  } catch (const zof::Error& x) {
    err = x.what();
  }
  EXPECT_NE(err.find("ZOF_IO=aio is not an I/O engine: use auto"), std::string::npos) << err;
}

}  // namespace
