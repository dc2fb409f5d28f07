// The run's lock (run_dir.h): RunLock, an exclusive flock on RUN/.lock, the holder named when a
// second writer is refused, and the holder's pid written into the file.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "train/run_dir.h"
#include "zof/error.h"

namespace zof::train {

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void RunLock::acquire(const fs::path& run, const std::string& flag) {
  path_ = run / ".lock";
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ZOF_CHECK(fd >= 0, flag + " " + run.string() + ": cannot open its lock file " + path_.string() +
                         " (" + std::strerror(errno) + "); check that the directory is writable");
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    fd_ = fd;
    return;
  }
  const int e = errno;
  // The holder: /proc/locks names the process that took a flock on this inode; else the pid
  // the holder wrote into the file.
  std::string pid;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    std::ifstream locks("/proc/locks");
    std::string line;
    const std::string ino = std::string(":") + std::to_string((unsigned long long)st.st_ino);
    while (pid.empty() && std::getline(locks, line)) {
      std::istringstream ls(line);
      std::string n, kind, adv, mode, who, dev;
      if (!(ls >> n >> kind)) continue;
      if (kind == "->") ls >> kind;  // a waiter
      if (kind != "FLOCK" || !(ls >> adv >> mode >> who >> dev)) continue;
      if (dev.size() > ino.size() && dev.compare(dev.size() - ino.size(), ino.size(), ino) == 0)
        pid = who;
    }
  }
  ::close(fd);
  if (pid.empty()) {
    std::string text = slurp(path_);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (!text.empty() && text.size() < 12 &&
        text.find_first_not_of("0123456789") == std::string::npos)
      pid = text;
  }
  ZOF_CHECK(e == EWOULDBLOCK || e == EAGAIN,
            flag + " " + run.string() + ": cannot lock " + path_.string() + " (" +
                std::strerror(e) + ")");
  // The holder may be this very process: a flock belongs to an open file, so a second open here
  // is refused as another process's would be (Python calling zof.finetune on a run directory
  // from inside the on_step callback of a run in that directory).
  ZOF_CHECK(pid != std::to_string(::getpid()),
            flag + " " + run.string() + " is in use by this process (pid " + pid +
                "), which already holds " + path_.string() + " for a run or replay it has not "
                "finished (zof.finetune called from an on_step callback, say); start this one "
                "after that one returns, or use another directory");
  throw Error(flag + " " + run.string() + " is in use by another process (" +
              (pid.empty() ? std::string("pid unknown") : "pid " + pid) + ") that holds " +
              path_.string() + "; wait for it to finish, or stop it, then try again");
}

void RunLock::write_pid() {
  if (fd_ < 0) return;
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == (ssize_t)pid.size())
    ::fsync(fd_);
}

}  // namespace zof::train
