// Memory and stream slots of the host backends: aligned_alloc, memcpy, and streams and events
// that only exist to be handed back, since host ops complete before they return.
#include "cpu/host_backend.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "zof/error.h"

namespace zof::cpu {

void* aligned_host_alloc(size_t bytes) {
  constexpr size_t kAlign = 64;
  size_t rounded = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  ZOF_CHECK(rounded >= bytes, "cannot allocate " + std::to_string(bytes) + " bytes: size overflows");
  void* p = std::aligned_alloc(kAlign, rounded);
  ZOF_CHECK(p != nullptr, "out of host memory allocating " + std::to_string(bytes) +
                              " bytes (" + std::to_string(available_host_memory()) +
                              " available); use a smaller model, batch or sequence length");
  return p;
}

size_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      size_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

HostBackend::HostBackend() { streams_.push_back(std::make_unique<HostStream>(HostStream{0})); }

void* HostBackend::alloc(size_t bytes) { return aligned_host_alloc(bytes); }
void HostBackend::free(void* ptr) { std::free(ptr); }
void* HostBackend::alloc_host_pinned(size_t bytes) { return aligned_host_alloc(bytes); }
void HostBackend::free_host_pinned(void* ptr) { std::free(ptr); }
size_t HostBackend::free_memory() const { return available_host_memory(); }

Stream* HostBackend::default_stream() { return reinterpret_cast<Stream*>(streams_[0].get()); }
Stream* HostBackend::create_stream() {
  streams_.push_back(std::make_unique<HostStream>(HostStream{int(streams_.size())}));
  return reinterpret_cast<Stream*>(streams_.back().get());
}
void HostBackend::copy_to_device(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_to_host(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_device(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch,
                                 size_t width, size_t rows, Stream*) {
  if (!width) return;
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                width);
}
Event* HostBackend::create_event() {
  events_.push_back(std::make_unique<HostEvent>(HostEvent{int(events_.size())}));
  return reinterpret_cast<Event*>(events_.back().get());
}
void HostBackend::record(Event*, Stream*) {}
void HostBackend::wait(Stream*, Event*) {}
void HostBackend::synchronize(Stream*) {}

}  // namespace zof::cpu
