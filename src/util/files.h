// Files written so that a crash leaves the old bytes or the new, never a mix (write_file_atomic),
// and the byte hash that a run records of its files (ByteHash). Below every layer that writes:
// the run directory, replay, the report.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace zof {

// Writes text to path atomically: temporary file (PATH.tmp.PID), fsync, rename, fsync of the
// directory. zof::Error naming the file on failure (the temporary removed).
void write_file_atomic(const std::filesystem::path& path, const std::string& text);
// A large file written the same way, in pieces: created as PATH.tmp.PID (zof::Error "cannot
// create ..." naming it), written with write() (EINTR retried), and put in place by commit()
// (fsync, close, rename over PATH, fsync of the directory). Destroyed without commit(), the
// temporary is removed and PATH is untouched. The safetensors and GGUF writers.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* p, size_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool keep_ = false;
};

// fsync of a file or directory (a directory: the names in it), best effort.
void fsync_path(const std::filesystem::path& p);

// A running 64-bit FNV-1a hash of bytes, as "fnv1a64:<16 hex digits>": what a checkpoint records
// of the step log (state.json "log_hash") and of run.json (its seal), so that a changed record is
// found on resume and replay.
class ByteHash {
 public:
  void add(const char* p, size_t n);
  void add(const std::string& s) { add(s.data(), s.size()); }
  std::string text() const;  // "fnv1a64:<16 hex digits>"

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// Host memory free for a new use: MemAvailable of /proc/meminfo (free pages from sysconf where
// it is missing).
uint64_t available_host_memory();

}  // namespace zof
