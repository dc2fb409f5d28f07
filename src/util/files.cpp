// Atomic files and the byte hash (files.h).
#include "util/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

}  // namespace zof
