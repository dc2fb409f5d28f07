// The ZO engine's optimizer state (zo.h): momentum's m and Adam's m and v, laid out as the
// weights, whole on the device or streamed with their blocks from pinned host memory; read and
// written whole for checkpoints.
#include "zof/zo.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "zof/error.h"
#include "zof/streaming.h"

#include "zo/zo_engine.h"

namespace zof {

int ZOEngine::Impl::state_planes() const {
  switch (opt_.optimizer) {
    case ZOStepOptions::Optimizer::SGD: return 0;
    case ZOStepOptions::Optimizer::Momentum: return 1;
    case ZOStepOptions::Optimizer::Adam: return 2;
  }
  return 0;
}

void ZOEngine::Impl::alloc_device_state() {
  ZOF_ASSERT(!stream_ && !m_ && state_planes() > 0);
  const int64_t n = model_.storage_size();
  const std::vector<float> zeros(std::min<int64_t>(n, 1 << 20), 0.f);
  float* planes[2] = {nullptr, nullptr};
  try {
    for (int k = 0; k < state_planes(); ++k) {
      planes[k] = (float*)be_.alloc(n * sizeof(float));
      for (int64_t i = 0; i < n; i += (int64_t)zeros.size())
        be_.copy_to_device(planes[k] + i, zeros.data(),
                           std::min<int64_t>((int64_t)zeros.size(), n - i) * sizeof(float), nullptr);
    }
    be_.synchronize(nullptr);  // the zeros are read from a host vector about to go
  } catch (...) {
    for (float* p : planes)
      if (p) be_.free(p);
    throw;
  }
  m_ = planes[0];
  v_ = planes[1];
}

float* ZOEngine::Impl::state(int pi, int plane) {
  ZOF_ASSERT(plane >= 1 && plane <= state_planes());
  if (stream_) return stream_->plane(pi, plane);
  if (!m_) alloc_device_state();
  return (plane == 1 ? m_ : v_) + model_.params()[pi].offset;
}

void ZOEngine::Impl::state_through_tier(float* const whole[2], bool into_engine) {
  const int planes = state_planes();
  float* plane[2] = {stream_ ? state_host_[0] : m_,
                     planes == 2 ? (stream_ ? state_host_[1] : v_) : nullptr};
  const auto& blocks = model_.blocks();
  std::vector<int> order(blocks.size());
  for (int b = 0; b < (int)blocks.size(); ++b) order[b] = b;
  disk_->begin_walk(order);
  for (int b = 0; b < (int)blocks.size(); ++b) {
    disk_->acquire(b, false);  // its planes present (the weights too: a block travels whole)
    const size_t off = (size_t)blocks[b].offset, bytes = (size_t)blocks[b].span * sizeof(float);
    for (int k = 0; k < planes; ++k) {
      if (into_engine && stream_)
        std::memcpy(plane[k] + off, whole[k] + off, bytes);
      else if (into_engine)
        be_.copy_to_device(plane[k] + off, whole[k] + off, bytes, nullptr);
      else if (stream_)
        std::memcpy(whole[k] + off, plane[k] + off, bytes);
      else
        be_.copy_to_host(whole[k] + off, plane[k] + off, bytes, nullptr);
    }
    be_.synchronize(nullptr);
    disk_->release(b, into_engine);
  }
}

void ZOEngine::Impl::read_state(std::vector<float>& m, std::vector<float>& v) {
  flush();  // with streaming, the host masters are current from here
  const int64_t n = model_.storage_size();
  const int planes = state_planes();
  m.assign(planes >= 1 ? n : 0, 0.f);
  v.assign(planes >= 2 ? n : 0, 0.f);
  if (planes == 0) return;
  if (disk_) {  // block by block through the tier (the gaps between blocks hold zeros)
    if (!stream_ && !m_) return;  // no update yet: the zeros above
    float* to[2] = {m.data(), planes == 2 ? v.data() : nullptr};
    state_through_tier(to, false);
    return;
  }
  if (stream_) {
    std::copy(state_host_[0], state_host_[0] + n, m.data());
    if (planes == 2) std::copy(state_host_[1], state_host_[1] + n, v.data());
    return;
  }
  if (!m_) return;  // no update yet: the zeros above
  be_.copy_to_host(m.data(), m_, n * sizeof(float), nullptr);
  if (planes == 2) be_.copy_to_host(v.data(), v_, n * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

void ZOEngine::Impl::write_state(const std::vector<float>& m, const std::vector<float>& v) {
  const int64_t n = model_.storage_size();
  const int planes = state_planes();
  ZOF_ASSERT((int64_t)m.size() == (planes >= 1 ? n : 0) &&
             (int64_t)v.size() == (planes >= 2 ? n : 0));
  if (planes == 0) return;
  if (disk_) {  // block by block through the tier
    if (stream_) stream_->sync_to_host();
    if (!stream_ && !m_) alloc_device_state();
    float* from[2] = {const_cast<float*>(m.data()), planes == 2 ? const_cast<float*>(v.data()) : nullptr};
    state_through_tier(from, true);
    if (stream_) stream_->reload_from_host();
    return;
  }
  if (stream_) {
    // Prefetches may be reading the host masters and resident blocks hold the current state:
    // both settle first; then every device copy is dropped and uploaded again from the new state.
    stream_->sync_to_host();
    std::copy(m.begin(), m.end(), state_host_[0]);
    if (planes == 2) std::copy(v.begin(), v.end(), state_host_[1]);
    stream_->reload_from_host();
    return;
  }
  if (!m_) alloc_device_state();
  be_.copy_to_device(m_, m.data(), n * sizeof(float), nullptr);
  if (planes == 2) be_.copy_to_device(v_, v.data(), n * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

}  // namespace zof
