// The disk tier's flags (--host-mem, --offload-dir) as a user gets them wrong: a size that is no
// size, a budget below the least workable, an offload directory that is missing, a file or
// on a file system without room, --offload-dir alone, and the walks the tier does
// not run under. Each is one line naming the flag and the fix, exit 1, before --out exists.
#include "faults/fault_table.h"

namespace {

using zof::faults::Case;
using zof::faults::Sandbox;

const std::string kRun = "finetune {F} --out {S}/out";

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
  };
}

ZOF_FAULT_TABLE(DiskTierFaults, disk_tier_cases());

}  // namespace
