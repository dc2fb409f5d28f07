// Atomic files and the byte hash (files.h).
#include "util/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zof/error.h"

namespace zof {

namespace fs = std::filesystem;

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    keep_ = true;  // nothing was created
    throw Error("cannot create " + tmp_ + ": " + std::strerror(errno) +
                "; check that the directory exists and is writable");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!keep_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + tmp_ + ": " + std::strerror(errno) +
                  "; check free disk space and quotas");
    }
    c += w;
    n -= size_t(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw Error("cannot fsync " + tmp_ + ": " + std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw Error("cannot close " + tmp_ + ": " + std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno));
  keep_ = true;
  // The rename is durable only once the directory entry is on disk.
  const fs::path parent = fs::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int r = ::fsync(dfd);
    const int e = errno;
    ::close(dfd);
    if (r != 0 && e != EINVAL) {
      std::string what = "wrote " + path_;
      what += " but cannot fsync its directory " + dir + ": " + std::strerror(e);
      throw Error(what);
    }
  }
}

void write_file_atomic(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZOF_CHECK(fd >= 0, "cannot write " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + std::strerror(e));
    }
    off += (size_t)w;
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path.string() + ": " + std::strerror(e));
  }
  fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

void ByteHash::add(const char* p, size_t n) {
  uint64_t h = h_;
  for (size_t i = 0; i < n; ++i) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
  h_ = h;
}

std::string ByteHash::text() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", (unsigned long long)h_);
  return buf;
}

uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      uint64_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

}  // namespace zof
