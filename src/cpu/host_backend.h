// Memory and stream slots shared by the two host backends (reference and cpu): 64-byte aligned
// host memory, copies as memcpy, and trivial streams and events since every op runs inline.
// Each backend keeps its own handle types and hands them out cast to the opaque zof::Stream and
// zof::Event, so no backend ever defines those names (the CUDA backend must do the same).
#pragma once
#include <memory>
#include <vector>

#include "zof/backend.h"

namespace zof::cpu {

class HostBackend : public Backend {
 public:
  HostBackend();

  void* alloc(size_t bytes) override;
  void free(void* ptr) override;
  void* alloc_host_pinned(size_t bytes) override;
  void free_host_pinned(void* ptr) override;
  size_t free_memory() const override;

  Stream* default_stream() override;
  Stream* create_stream() override;
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t rows, Stream* s) override;
  Event* create_event() override;
  // Work is done by the time a call returns, so an event is complete as soon as it is recorded.
  void record(Event* e, Stream* s) override;
  void wait(Stream* s, Event* e) override;
  void synchronize(Stream* s) override;

 private:
  struct HostStream {
    int id;
  };
  struct HostEvent {
    int id;
  };
  std::vector<std::unique_ptr<HostStream>> streams_;  // [0] is the default stream
  std::vector<std::unique_ptr<HostEvent>> events_;
};

// 64-byte aligned host memory of at least `bytes` (rounded up; 0 gives a valid 64-byte block).
// Throws zof::Error when the system has no memory left.
void* aligned_host_alloc(size_t bytes);
// MemAvailable from /proc/meminfo, or free pages from sysconf where that file is missing.
size_t available_host_memory();

}  // namespace zof::cpu
