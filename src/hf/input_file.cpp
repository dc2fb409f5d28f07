// Regular-file checks for everything zof reads from a user: a FIFO would block the read until a
// writer comes, a device (/dev/zero) would be read for ever, a directory reads as empty.
#include "zof/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "zof/error.h"

namespace zof {
namespace {

// What a stat'ed path is, when it is not a regular file ("" when it is).
std::string not_a_file(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return " is a directory";
  if (S_ISFIFO(st.st_mode)) return " is a FIFO (named pipe), not a file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return " is a device, not a file";
  if (S_ISSOCK(st.st_mode)) return " is a socket, not a file";
  return " is not a regular file";
}

}  // namespace

std::string size_words(uint64_t bytes) {
  if (bytes % (uint64_t(1) << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes % (uint64_t(1) << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

void check_regular_file(const std::string& name, const std::string& path, const std::string& want) {
  ZOF_CHECK(!path.empty(), name + " is empty; " + want);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    ZOF_CHECK(e != ENOENT && e != ENOTDIR, name + ": no such file (" + want + ")");
    throw Error(name + " cannot be reached (" + std::strerror(e) + "); " + want);
  }
  const std::string what = not_a_file(st);
  ZOF_CHECK(what.empty(), name + what + "; " + want);
  ZOF_CHECK(::access(path.c_str(), R_OK) == 0,
            name + " cannot be read (" + std::strerror(errno) + "); check its permissions");
}

std::string read_input_file(const std::string& name, const std::string& path,
                            const std::string& want, uint64_t max_bytes) {
  check_regular_file(name, path, want);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw Error(name + " cannot be opened (" + std::strerror(e) + "); " + want);
  }
  struct stat st;
  std::string what = ::fstat(fd, &st) != 0 ? " cannot be examined" : not_a_file(st);
  if (what.empty() && (uint64_t)st.st_size > max_bytes)
    what = " is " + std::to_string((uint64_t)st.st_size) + " bytes, more than the " +
           size_words(max_bytes) + " zof reads from such a file";
  if (!what.empty()) {
    ::close(fd);
    throw Error(name + what + "; " + want);
  }
  std::string text;
  text.resize((size_t)st.st_size);
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      // A file that grows while read: read on, within the limit.
      if (text.size() > max_bytes) break;
      text.resize(std::min<uint64_t>(max_bytes + 1, text.size() + 65536));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw Error(name + ": read error (" + std::strerror(e) + "); " + want);
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  ::close(fd);
  ZOF_CHECK(got <= max_bytes, name + " grew past the " + size_words(max_bytes) +
                                  " zof reads from such a file while it was read; " + want);
  text.resize(got);
  return text;
}

void check_model_dir(const std::string& flag, const std::string& dir) {
  const std::string name = flag.empty() ? "model directory " + dir : flag + " " + dir;
  const std::string want =
      "give a Hugging Face model directory holding config.json and model.safetensors, or a GGUF "
      "file";
  ZOF_CHECK(!dir.empty(), (flag.empty() ? std::string("the model directory") : flag) +
                              " is empty; " + want);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    const int e = errno;
    ZOF_CHECK(e != ENOENT && e != ENOTDIR, name + " does not exist; " + want);
    throw Error(name + " cannot be reached (" + std::strerror(e) + "); " + want);
  }
  if (!S_ISDIR(st.st_mode)) {
    // A file is read as GGUF (hf/gguf.h validates the rest): its magic first, so that any other
    // file is named as what it is not.
    check_regular_file(name, dir, want);
    char magic[4] = {};
    const int fd = ::open(dir.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    const bool gguf = fd >= 0 && ::read(fd, magic, 4) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
    if (fd >= 0) ::close(fd);
    ZOF_CHECK(gguf, name + " is not a directory nor a GGUF file (it does not start with \"GGUF\"); " +
                        want);
    return;
  }
  const std::string base = dir.back() == '/' ? dir : dir + "/";
  for (const char* file : {"config.json", "model.safetensors", "model.safetensors.index.json",
                           "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                           "generation_config.json"}) {
    const std::string path = base + file;
    // A missing file is left to its reader, which says whether the model needs it.
    if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) continue;
    check_regular_file(path, path,
                       std::string(file) + " must be a regular file: replace it with the model's own " +
                           file + " (re-download it)");
  }
}

}  // namespace zof
