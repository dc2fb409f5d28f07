// The disk tier's flags (--host-mem, --offload-dir) as a user gets them wrong: a size that is no
// size, a budget below the least workable, an offload directory that is missing, a file or
// on a file system without room, --offload-dir alone, and the walks the tier does
// not run under. Each is one line naming the flag and the fix, exit 1, before --out exists.
#include <signal.h>

#include <fstream>

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;
using zof::test::run_command;

const std::string kRun = "finetune {F} --out {S}/out";

// The flags of a 4-step run with a checkpoint every 2, through the disk tier where host_mem is
// given (stories260K's least is under 600 KiB: blocks on disk).
std::string tier_flags(Sandbox& s, const std::string& host_mem = "600KiB") {
  std::string flags = s.run_flags();
  flags.replace(flags.find("--steps 3"), 9, "--steps 4");
  return flags + " --save-every 2 --json" + (host_mem.empty() ? "" : " --host-mem " + host_mem);
}

// That run through the disk tier at {S}/tiered, killed at step 3: checkpoint-2 names its
// blocks' slots in {S}/tiered/offload/zof-store.bin, and step 2 wrote the other slots.
fs::path killed_tier_run(Sandbox& s) {
  const fs::path r = s.root() / "tiered";
  const auto k = run_command("ZOF_FAULT_KILL_AT_STEP=3 " + zof::faults::zof_binary() +
                             " finetune " + tier_flags(s) + " --out " + shell_quoted(r));
  EXPECT_EQ(k.code, 128 + SIGKILL) << k.err;
  EXPECT_TRUE(fs::exists(r / "checkpoint-2" / "store.json"));
  return r;
}

const std::string kResumeTiered = "finetune --resume {S}/tiered --host-mem 600KiB";
const std::string kStore = "tiered/offload/zof-store.bin";

std::vector<Case> disk_tier_cases() {
  return {
      {"HostMemNotASize", {}, kRun + " --host-mem lots --json", 1,
       R"(--host-mem)"},
      {"HostMemZero", {}, kRun + " --host-mem 0", 1, R"(--host-mem)"},
      {"HostMemBelowTheLeast", {}, kRun + " --host-mem 100KiB", 1,
       R"(^--host-mem 100\.00 KiB is below this run's least of \d+ bytes \(.*\): the block of the tied LM head, which stays resident, and two blocks in flight from disk \(the largest block, its weights\); raise --host-mem$)"},
      {"HostMemBelowTheLeastWithAdam", {}, kRun + " --host-mem 600KiB --optimizer adam", 1,
       R"(^--host-mem 600\.00 KiB is below this run's least of \d+ bytes .*its weights and Adam's m and v\); raise --host-mem, or use --optimizer sgd \(no optimizer state\)$)"},
      {"OffloadDirWithoutHostMem", {}, kRun + " --offload-dir {S}", 1,
       R"(^--offload-dir holds the blocks that do not fit --host-mem: add --host-mem SIZE, or drop --offload-dir$)"},
      {"OffloadDirMissing", {}, kRun + " --host-mem 600KiB --offload-dir {S}/nowhere", 1,
       R"(^--offload-dir .*/nowhere does not exist: create it \(on a local file system with \d+ bytes free\), or drop --offload-dir to use the run directory$)"},
      {"OffloadDirIsAFile", [](Sandbox& s) { s.write(s.root() / "afile", "x"); },
       kRun + " --host-mem 600KiB --offload-dir {S}/afile", 1,
       R"(^--offload-dir .*/afile is not a directory: give a directory$)"},
      {"OffloadDirOnAFullFileSystem", {},
       // A file system with no free blocks (proc): refused by statvfs before anything is
       // created or allocated.
       kRun + " --host-mem 600KiB --offload-dir /proc", 1,
       R"(^--offload-dir /proc (is not writable|has 0 bytes free, and the blocks beyond --host-mem need \d+))"},
      {"HostMemWithJvp", {}, kRun + " --host-mem 600KiB --estimator jvp", 1,
       R"(^--host-mem \(the disk tier\) runs the SPSA walk only; use --estimator spsa, or drop --host-mem$)"},
      {"HostMemOnCuda", {}, kRun + " --host-mem 1GiB --device cuda", 1,
       R"(^--host-mem \(the disk tier\) runs on the host backend and --sim-device for now, not --device cuda \(which pins the host masters\); drop --host-mem, or use --device cpu$)"},
      // --write-back-every: only where a disk tier runs ZO-SGD on the host, rebuilding a block
      // step by step (not through a rounding window or optimizer state).
      {"WriteBackEveryWithoutHostMem", {}, kRun + " --write-back-every 4", 1,
       R"(^--write-back-every 4 writes the disk tier's blocks back less often: add --host-mem SIZE, or drop --write-back-every$)"},
      {"WriteBackEveryZero", {}, kRun + " --host-mem 600KiB --write-back-every 0", 1,
       R"(^--write-back-every )"},
      {"WriteBackEveryWithAdam", {}, kRun + " --host-mem 1GiB --write-back-every 2 --optimizer adam", 1,
       R"(^--write-back-every 2 rebuilds a block from ZO-SGD's updates, and --optimizer adam updates through its state: use --optimizer sgd, or drop --write-back-every$)"},
      {"WriteBackEveryInARoundingWindow", {},
       kRun + " --host-mem 1GiB --write-back-every 2 --master bf16", 1,
       R"(^--write-back-every 2 does not combine with a bf16 master's rounding window \(--round-every 8 already writes a disk block once a window\): add --round-every 1, or drop --write-back-every$)"},
      {"WriteBackEveryOnTheSimDevice", {},
       kRun + " --host-mem 1GiB --write-back-every 2 --sim-device", 1,
       R"(^--write-back-every 2 runs on the host backend for now: drop --sim-device and --device cuda, or drop --write-back-every$)"},
      // A checkpoint whose blocks are in the store: the store gone, cut short, changed under
      // it, or named wrongly by its store.json; another --offload-dir on resume. Refused
      // before the logs are touched (the tier writes the base into the store's free slots
      // before the hashes are checked: the store may change, never the checkpoint's slots).
      {"ResumeWithTheStoreGone",
       [](Sandbox& s) { fs::remove(killed_tier_run(s) / "offload" / "zof-store.bin"); },
       kResumeTiered, 1,
       R"(^cannot open the disk tier's store .*/tiered/offload/zof-store\.bin: .*; the checkpoint's blocks are in it: restore it, or start a new run$)"},
      {"ResumeWithTheStoreCut",
       [](Sandbox& s) {
         const fs::path st = killed_tier_run(s) / "offload" / "zof-store.bin";
         fs::resize_file(st, fs::file_size(st) - 4096);
       },
       kResumeTiered, 1,
       R"(^the disk tier's store .*/zof-store\.bin is \d+ bytes, not the \d+ the checkpoint's layout makes: it was changed or is another run's; restore it, or start a new run$)"},
      {"ResumeWithAStoreBlockChanged",
       [](Sandbox& s) {
         const fs::path st = killed_tier_run(s) / "offload" / "zof-store.bin";
         std::string bytes = s.read(st);
         for (size_t i = 100; i < bytes.size(); i += 4096) bytes[i] = (char)~bytes[i];
         s.write(st, bytes);
       },
       kResumeTiered, 1,
       R"(^block \d+ in the disk tier's store .*/zof-store\.bin \(slot [01]\) does not match the hash checkpoint-2/store\.json records: the store was changed or damaged since the checkpoint; the run cannot resume from it$)",
       {kStore}},
      {"ResumeWithAStoreSlotOutOfRange",
       [](Sandbox& s) {
         s.edit_json(killed_tier_run(s) / "checkpoint-2" / "store.json",
                     [](json& j) { j["blocks"][0][1] = 2; });
       },
       kResumeTiered, 1,
       R"(^.*/checkpoint-2/store\.json: block \d+'s slot is 2, not 0 or 1; the run directory is damaged)"},
      {"ResumeWithAnotherOffloadDir", [](Sandbox& s) { killed_tier_run(s); },
       kResumeTiered + " --offload-dir {S}", 1,
       R"(^--offload-dir .*: the checkpoint's blocks are in .*/tiered/offload/zof-store\.bin; resume with --offload-dir .*/tiered/offload, or without --offload-dir$)"},
  };
}

ZOF_FAULT_TABLE(DiskTierFaults, disk_tier_cases());

// kill -9 with a write of the store in flight, at points spread over a run through the disk
// tier (loading, steps, checkpoints): every resume ends with the plain run's model and step log
// (the slots the latest checkpoint names are never written after it).
TEST(DiskTierKills, AKillAtAnyWriteResumesToThePlainRunsBytes) {
  Sandbox s("DiskTierKills");
  const std::string bin = zof::faults::zof_binary();
  auto run = [&](const std::string& out, const std::string& flags, const std::string& env = "") {
    return run_command(env + bin + " finetune " + flags + " --out " +
                       shell_quoted(s.root() / out));
  };
  const auto plain = run("plain", tier_flags(s, ""));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto whole = run("whole", tier_flags(s));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const json dt = zof::test::last_json(whole.out)["disk_tier"];
  ASSERT_GT(dt["blocks_on_disk"].get<int>(), 0) << dt.dump();
  // After the load (which writes each disk block once, before run.json: a kill there leaves no
  // run to resume).
  for (const char* f : {"model.safetensors", "zo_log.jsonl"})
    ASSERT_TRUE(s.read(s.root() / "whole" / f) == s.read(s.root() / "plain" / f)) << f;
  const int64_t loaded = dt["blocks_on_disk"], writes = dt["writes"];
  ASSERT_GT(writes, 4 * loaded);
  for (int k = 1; k <= 5; ++k) {
    const int64_t at = loaded + (writes - loaded) * k / 6;
    const std::string out = "killed" + std::to_string(k);
    const auto killed =
        run(out, tier_flags(s), "ZOF_FAULT_KILL_AT_WRITE=" + std::to_string(at) + " ");
    ASSERT_EQ(killed.code, 128 + SIGKILL) << at << ": " << killed.err;
    const auto resumed = run_command(bin + " finetune --resume " +
                                     shell_quoted(s.root() / out) +
                                     " --host-mem 600KiB --threads 1 --json");
    ASSERT_EQ(resumed.code, 0) << at << ": " << resumed.err;
    for (const char* f : {"model.safetensors", "zo_log.jsonl"})
      EXPECT_TRUE(s.read(s.root() / out / f) == s.read(s.root() / "plain" / f))
          << "killed at write " << at << " of " << writes << ": " << f << " differs";
  }
}

}  // namespace
