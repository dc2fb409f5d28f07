// The disk tier's I/O layer (src/util/block_io.h): transfers come back whole through short
// counts and EINTR, and every failure (ENOSPC mid-write, a file truncated under the run, a full
// file system at creation) is a zof::Error naming the file; O_DIRECT refused falls back to
// buffered I/O and says so. Faults are injected with set_io_fault_hook.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <vector>

#include "util/block_io.h"
#include "zof/error.h"

namespace {

namespace fs = std::filesystem;
using zof::AlignedBuffer;
using zof::BlockFile;
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

TEST_F(BlockIo, ShortTransfersAndEintrAreRetriedUntilWhole) {
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
  f.write(out.data, out.size, 8 * kIoAlign);
  f.read(in.data, in.size, 8 * kIoAlign);
  EXPECT_GT(calls.load(), 2 * 16);  // the transfers really were cut up
  zof::set_io_fault_hook({});
  EXPECT_EQ(std::memcmp(in.data, out.data, in.size), 0);
}

TEST_F(BlockIo, NoSpaceMidWriteIsAnErrorNamingTheFile) {
  BlockFile f(dir_ / "store.bin", 32 * kIoAlign);
  AlignedBuffer out(8 * kIoAlign);
  int calls = 0;
  zof::set_io_fault_hook([&](char op, size_t, uint64_t) -> long {
    return op == 'w' && ++calls > 1 ? -ENOSPC : (long)kIoAlign;  // one block, then a full disk
  });
  const std::string e = error_of([&] { f.write(out.data, out.size, 0); });
  EXPECT_NE(e.find("no space left writing " + (dir_ / "store.bin").string()), std::string::npos)
      << e;
  EXPECT_NE(e.find("--offload-dir"), std::string::npos) << e;
  EXPECT_EQ(calls, 2);  // not retried for ever
}

TEST_F(BlockIo, OtherErrorsNameTheFileAndTheOffset) {
  BlockFile f(dir_ / "store.bin", 8 * kIoAlign);
  AlignedBuffer b(kIoAlign);
  zof::set_io_fault_hook([](char, size_t, uint64_t) -> long { return -EIO; });
  const std::string e = error_of([&] { f.read(b.data, b.size, 4 * kIoAlign); });
  EXPECT_NE(e.find("cannot read 4096 bytes at offset 16384 of " + (dir_ / "store.bin").string()),
            std::string::npos)
      << e;
}

TEST_F(BlockIo, AFileTruncatedUnderTheRunIsACleanError) {
  const fs::path p = dir_ / "store.bin";
  BlockFile f(p, 16 * kIoAlign);
  AlignedBuffer out(4 * kIoAlign), in(4 * kIoAlign);
  fill(out, 9);
  f.write(out.data, out.size, 8 * kIoAlign);
  fs::resize_file(p, 9 * kIoAlign);  // someone cut the store short
  const std::string e = error_of([&] { f.read(in.data, in.size, 8 * kIoAlign); });
  EXPECT_NE(e.find(p.string() + " was truncated under the run"), std::string::npos) << e;
  EXPECT_NE(e.find("36864 bytes"), std::string::npos) << e;  // its size now
}

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

}  // namespace
