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
  // Zeros that cost no host memory until written (on the CPU: a disk tier's blocks never are
  // whole in RAM, the optimizer state's part of them included).
  float* planes[2] = {nullptr, nullptr};
  try {
    for (int k = 0; k < state_planes(); ++k)
      planes[k] = (float*)be_.alloc_zeroed(n * sizeof(float));
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

void ZOEngine::Impl::state_by_block(const std::vector<int>& blocks, bool into_engine,
                                    const ZOEngine::StateFn& fn) {
  const int planes = state_planes();
  if (planes == 0 || blocks.empty()) return;
  const auto& all = model_.blocks();
  int64_t most = 0;
  for (int b : blocks) most = std::max<int64_t>(most, all[b].span);
  std::vector<float> buf[2];
  for (int k = 0; k < planes; ++k) buf[k].assign((size_t)most, 0.f);
  float* out[2] = {buf[0].data(), planes == 2 ? buf[1].data() : nullptr};
  // No update yet and no state written: zeros, and nothing to read.
  if (!into_engine && !stream_ && !m_) {
    for (int b : blocks) fn(b, out[0], out[1]);
    return;
  }
  if (into_engine && !stream_ && !m_) alloc_device_state();
  if (into_engine && stream_) stream_->sync_to_host();  // no copy in flight over the masters
  float* plane[2] = {stream_ ? state_host_[0] : m_,
                     planes == 2 ? (stream_ ? state_host_[1] : v_) : nullptr};
  // Only the disk blocks go through the tier (a walk of resident blocks alone would drop the
  // ring's read-ahead for nothing).
  std::vector<int> on_disk;
  for (int b : blocks)
    if (disk_ && disk_->on_disk(b)) on_disk.push_back(b);
  if (!on_disk.empty()) disk_->begin_walk(on_disk);
  for (int b : blocks) {
    const bool through = disk_ && disk_->on_disk(b);
    if (through) disk_->acquire(b, false);  // its planes present (a block travels whole)
    const size_t off = (size_t)all[b].offset, bytes = (size_t)all[b].span * sizeof(float);
    for (int k = 0; k < planes && !into_engine; ++k) {
      if (stream_)
        std::memcpy(out[k], plane[k] + off, bytes);
      else
        be_.copy_to_host(out[k], plane[k] + off, bytes, nullptr);
    }
    be_.synchronize(nullptr);
    fn(b, out[0], out[1]);
    for (int k = 0; k < planes && into_engine; ++k) {
      if (stream_)
        std::memcpy(plane[k] + off, out[k], bytes);
      else
        be_.copy_to_device(plane[k] + off, out[k], bytes, nullptr);
    }
    be_.synchronize(nullptr);
    if (through) disk_->release(b, into_engine);
  }
  if (into_engine && stream_) stream_->reload_from_host();  // the device copies from the new state
}

void ZOEngine::Impl::read_state(std::vector<float>& m, std::vector<float>& v) {
  flush();  // with streaming, the host masters are current from here
  const int64_t n = model_.storage_size();
  const int planes = state_planes();
  m.assign(planes >= 1 ? n : 0, 0.f);
  v.assign(planes >= 2 ? n : 0, 0.f);
  if (planes == 0) return;
  if (disk_) {  // block by block through the tier (the gaps between blocks hold zeros)
    const auto& all = model_.blocks();
    std::vector<int> order(all.size());
    for (int b = 0; b < (int)all.size(); ++b) order[b] = b;
    state_by_block(order, false, [&](int b, const float* bm, const float* bv) {
      std::copy(bm, bm + all[b].span, m.data() + all[b].offset);
      if (bv) std::copy(bv, bv + all[b].span, v.data() + all[b].offset);
    });
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
    const auto& all = model_.blocks();
    std::vector<int> order(all.size());
    for (int b = 0; b < (int)all.size(); ++b) order[b] = b;
    state_by_block(order, true, [&](int b, float* bm, float* bv) {
      std::copy(m.data() + all[b].offset, m.data() + all[b].offset + all[b].span, bm);
      if (bv) std::copy(v.data() + all[b].offset, v.data() + all[b].offset + all[b].span, bv);
    });
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

void ZOEngine::Impl::read_state_blocks(const std::vector<int>& blocks, const ZOEngine::StateFn& fn) {
  flush();  // the state matches the weights
  state_by_block(blocks, false, fn);
}

void ZOEngine::Impl::write_state_blocks(const std::vector<int>& blocks,
                                        const ZOEngine::StateFn& fn) {
  state_by_block(blocks, true, fn);
}

}  // namespace zof
