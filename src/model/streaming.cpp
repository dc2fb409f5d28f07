// The parameter streaming scheduler of streaming.h: residency planned once from the budget, then
// per acquire a Belady-style ring (a slot is reused for the block whose next use is farthest),
// uploads queued ahead along the walk's order, write-backs queued behind it, all ordered by
// events between the compute, upload and write-back streams. Every transfer moves all of a
// block's planes (weights, then optimizer state).
#include "zof/streaming.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>

#include "zof/disk_tier.h"
#include "zof/error.h"

namespace zof {

namespace {
constexpr size_t kAlign = 256;  // allocators hand out at least this granularity
size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const std::string msg = flag + " '" + text +
                          "' is not a memory size: give bytes or a number with a unit, e.g. "
                          "16GiB, 512MiB, 1.5GB or 1073741824";
  size_t i = 0;
  const size_t n = text.size();
  while (i < n && std::isdigit((unsigned char)text[i])) ++i;
  const size_t int_end = i;
  if (i < n && text[i] == '.') {
    ++i;
    const size_t frac0 = i;
    while (i < n && std::isdigit((unsigned char)text[i])) ++i;
    ZOF_CHECK(i > frac0, msg);
  }
  ZOF_CHECK(int_end > 0, msg);
  const double number = std::stod(text.substr(0, i));
  if (i < n && text[i] == ' ') ++i;
  std::string unit;
  for (; i < n; ++i) unit += (char)std::tolower((unsigned char)text[i]);
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  ZOF_CHECK(mult > 0, msg);
  const double bytes = std::floor(number * mult);
  ZOF_CHECK(bytes >= 1, flag + " must be a positive memory size, not '" + text + "'");
  ZOF_CHECK(bytes < 9.2e18, flag + " '" + text + "' is too large");
  return (uint64_t)bytes;
}

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char b[32];
  std::snprintf(b, sizeof b, "%.2f %s", v, units[u]);
  return b;
}

size_t BlockStreamer::plane_bytes(const Model& m, int64_t span, int k) {
  // Plane 0 is the weights in the storage's type (a bf16 master: 2 bytes), the others fp32.
  return round_up((size_t)span * (k == 0 ? dtype_size(m.storage_dtype()) : sizeof(float)));
}

size_t BlockStreamer::block_bytes(const Model& m, int b, int planes) {
  size_t n = 0;
  for (int k = 0; k < planes; ++k) n += plane_bytes(m, m.blocks()[b].span, k);
  return n;
}

size_t BlockStreamer::min_bytes(const Model& m, int planes) {
  size_t largest = 0;
  for (int b = 0; b < (int)m.blocks().size(); ++b)
    largest = std::max(largest, block_bytes(m, b, planes));
  return 2 * largest;
}

size_t BlockStreamer::all_resident_bytes(const Model& m, int planes) {
  size_t total = 0;
  for (int b = 0; b < (int)m.blocks().size(); ++b) total += block_bytes(m, b, planes);
  return total;
}

BlockStreamer::BlockStreamer(Model& model, Backend& be, size_t budget,
                             std::vector<float*> extra_planes)
    : model_(model), be_(be), budget_(budget) {
  const auto& blocks = model.blocks();
  const auto& params = model.params();
  const int nb = (int)blocks.size();
  host_planes_.push_back(static_cast<char*>(model.storage_ptr()));
  for (float* p : extra_planes) {
    ZOF_ASSERT(p);
    host_planes_.push_back(reinterpret_cast<char*>(p));
  }
  const int planes = num_planes();
  ZOF_CHECK(budget >= min_bytes(model, planes),
            "a streaming budget of " + format_bytes(budget) + " for the blocks is below the " +
                format_bytes(min_bytes(model, planes)) +
                " that two slots of the largest block (all its planes) need");
  param_block_.assign(params.size(), -1);
  param_off_.assign(params.size(), 0);
  for (int b = 0; b < nb; ++b)
    for (int pi : blocks[b].params) {
      param_block_[pi] = b;
      param_off_[pi] = params[pi].offset - blocks[b].offset;
    }
  plan(planes);
  allocate(planes);
  res_consumed_ = be.create_event();
  // The weights' master (the Model's storage) is ordinary memory: page-lock it so that uploads
  // and write-backs overlap the compute (the optimizer-state planes are pinned already).
  pinned_master_ = be.register_host(
      model.storage_ptr(), size_t(model.storage_size()) * dtype_size(model.storage_dtype()));
}

// The plan: which blocks stay resident, how many slots the rest stream through.
void BlockStreamer::plan(int planes) {
  const int nb = (int)model_.blocks().size();
  const size_t budget = budget_;
  auto bytes = [&](int b) { return block_bytes(model_, b, planes); };
  resident_.assign(nb, false);
  if (all_resident_bytes(model_, planes) <= budget) {
    resident_.assign(nb, true);
  } else {
    // Largest first (each resident byte is two bytes of traffic saved per walk), as long as the
    // rest can still stream through two slots of its largest block.
    std::vector<int> by_size(nb);
    for (int b = 0; b < nb; ++b) by_size[b] = b;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](int a, int b) { return bytes(a) > bytes(b); });
    size_t kept = 0;
    for (int b : by_size) {
      resident_[b] = true;
      size_t largest = 0;
      int streamed = 0;
      for (int c = 0; c < nb; ++c)
        if (!resident_[c]) {
          largest = std::max(largest, bytes(c));
          ++streamed;
        }
      if (streamed > 0 && kept + bytes(b) + std::min(streamed, 2) * largest <= budget)
        kept += bytes(b);
      else
        resident_[b] = false;
    }
    int streamed = 0;
    int64_t span = 0;  // the largest streamed block's: a slot's planes are laid out for it
    for (int c = 0; c < nb; ++c)
      if (!resident_[c]) {
        slot_bytes_ = std::max(slot_bytes_, bytes(c));
        span = std::max(span, model_.blocks()[c].span);
        ++streamed;
      }
    // The prefetch depth: as many slots as the rest of the budget holds (never more than there
    // are streamed blocks).
    const int k = (int)std::min<size_t>((size_t)streamed, (budget - kept) / slot_bytes_);
    ZOF_ASSERT(k >= std::min(streamed, 2));
    slots_.resize(k);
    slot_off_.assign(planes, 0);
    for (int j = 1; j < planes; ++j) slot_off_[j] = slot_off_[j - 1] + plane_bytes(model_, span, j - 1);
    ZOF_ASSERT(slot_off_.back() + plane_bytes(model_, span, planes - 1) == slot_bytes_);
  }
}

// Device memory for the resident blocks and the slots, the copy streams and the events.
void BlockStreamer::allocate(int planes) {
  Backend& be = be_;
  const int nb = (int)model_.blocks().size();
  auto bytes = [&](int b) { return block_bytes(model_, b, planes); };
  compute_ = be.default_stream();
  up_ = be.create_stream();
  down_ = be.create_stream();
  holds_.assign(nb, 0);
  res_base_.assign(nb, nullptr);
  res_uploaded_.assign(nb, false);
  res_waited_.assign(nb, false);
  res_dirty_.assign(nb, false);
  res_ready_.assign(nb, nullptr);
  slot_of_.assign(nb, -1);
  written_.assign(nb, nullptr);
  written_recorded_.assign(nb, false);
  try {
    for (int b = 0; b < nb; ++b) {
      written_[b] = be.create_event();
      if (!resident_[b]) continue;
      res_base_[b] = (char*)be.alloc(bytes(b));
      res_ready_[b] = be.create_event();
      device_bytes_ += bytes(b);
    }
    for (Slot& s : slots_) {
      s.base = (char*)be.alloc(slot_bytes_);
      s.ready = be.create_event();
      s.consumed = be.create_event();
      s.free = be.create_event();
      device_bytes_ += slot_bytes_;
    }
  } catch (...) {
    for (char* p : res_base_)
      if (p) be.free(p);
    for (Slot& s : slots_)
      if (s.base) be.free(s.base);
    throw;
  }
}

BlockStreamer::~BlockStreamer() {
  be_.synchronize(up_);
  be_.synchronize(down_);
  be_.synchronize(compute_);
  for (char* p : res_base_)
    if (p) be_.free(p);
  for (Slot& s : slots_) be_.free(s.base);
  if (pinned_master_) be_.unregister_host(model_.storage_ptr());
}

std::string BlockStreamer::describe() const {
  const int nb = (int)resident_.size();
  int res = 0;
  for (bool r : resident_) res += r;
  std::string s = std::to_string(res) + " of " + std::to_string(nb) + " blocks resident";
  if (!slots_.empty())
    s += ", " + std::to_string(nb - res) + " streamed through " + std::to_string(slots_.size()) +
         " slots of " + format_bytes(slot_bytes_);
  return s + " (" + format_bytes(device_bytes_) + " of a " + format_bytes(budget_) +
         " budget for weights" + (num_planes() > 1 ? " and optimizer state)" : ")") +
         (pinned_master_ ? ", host master page-locked" : "");
}

void BlockStreamer::release_held() {
  // A walk that ended early (an exception) may have left blocks held: release them as changed,
  // which is always safe.
  for (int b = 0; b < (int)holds_.size(); ++b)
    while (holds_[b] > 0) release(b, true);
}

void BlockStreamer::begin_walk(std::vector<int> order) {
  release_held();
  order_ = std::move(order);
  pos_ = 0;
  prefetch();
}

// Past the walk's end the order is taken to repeat: the next step's walk (or a flush) starts the
// same way, so its first blocks are uploaded while this walk finishes.
int64_t BlockStreamer::next_use(int block) const {
  const size_t n = order_.size();
  for (size_t k = 0; k < n; ++k)
    if (order_[(pos_ + k) % n] == block) return (int64_t)(pos_ + k);
  return INT64_MAX;
}

int BlockStreamer::victim(int64_t after) const {
  int best = -1;
  int64_t best_use = after;
  for (int s = 0; s < (int)slots_.size(); ++s) {
    if (slots_[s].holds > 0) continue;
    const int64_t use = slots_[s].block < 0 ? INT64_MAX : next_use(slots_[s].block);
    if (use > best_use) {
      best = s;
      best_use = use;
    }
  }
  return best;
}

void BlockStreamer::load(int block, int slot) {
  Slot& s = slots_[slot];
  ZOF_ASSERT(s.holds == 0);
  if (s.block >= 0) slot_of_[s.block] = -1;
  // The slot's last reader (compute) or its write-back must be done before it is overwritten,
  // and the block's own last write-back must have reached the host before it is read again.
  if (s.freed) be_.wait(up_, s.free);
  if (written_recorded_[block]) be_.wait(up_, written_[block]);
  s.block = block;
  s.dirty = false;
  s.wrote = false;
  slot_of_[block] = slot;
  upload(block);
  be_.record(s.ready, up_);
}

void BlockStreamer::upload_resident(int block) {
  if (written_recorded_[block]) be_.wait(up_, written_[block]);
  upload(block);
  be_.record(res_ready_[block], up_);
  res_uploaded_[block] = true;
  res_waited_[block] = false;
}

void BlockStreamer::set_disk_tier(DiskTier* tier) {
  tier_ = tier;
  if (tier_) tier_->expect_write_backs();
}

void BlockStreamer::upload(int block) {
  if (tier_) tier_->acquire(block);
  for (int k = 0; k < num_planes(); ++k) {
    be_.copy_to_device(device_plane(block, k), host(block, k), span_bytes(block, k), up_);
    stats_.bytes_uploaded += span_bytes(block, k);
  }
  ++stats_.uploads;
  if (tier_) {
    be_.synchronize(up_);
    tier_->release(block, false);
  }
}

void BlockStreamer::write_back(int block) {
  if (tier_) tier_->acquire(block, /*overwrite=*/true);
  for (int k = 0; k < num_planes(); ++k) {
    be_.copy_to_host(host(block, k), device_plane(block, k), span_bytes(block, k), down_);
    stats_.bytes_written_back += span_bytes(block, k);
  }
  ++stats_.writebacks;
  if (tier_) {
    be_.synchronize(down_);
    tier_->release(block, true);
  }
}

void BlockStreamer::prefetch() {
  // Along the order, from the next acquire on: queue what is missing while slots allow, in order
  // (the upload stream runs them in the order they will be needed).
  const size_t n = order_.size();
  for (size_t p = pos_; p < pos_ + n; ++p) {
    const int b = order_[p % n];
    if (resident_[b]) {
      if (!res_uploaded_[b]) upload_resident(b);
      continue;
    }
    if (slot_of_[b] >= 0) continue;
    const int s = victim((int64_t)p);
    if (s < 0) break;
    load(b, s);
  }
}

float* BlockStreamer::acquire(int block) {
  for (size_t i = pos_; i < order_.size(); ++i)
    if (order_[i] == block) {
      pos_ = i + 1;
      break;
    }
  ++holds_[block];
  if (resident_[block]) {
    if (!res_uploaded_[block]) upload_resident(block);
    prefetch();
    if (!res_waited_[block]) {
      be_.wait(compute_, res_ready_[block]);
      res_waited_[block] = true;
    }
    return reinterpret_cast<float*>(res_base_[block]);
  }
  ++stats_.acquires;
  int s = slot_of_[block];
  if (s >= 0) {
    ++stats_.hits;
  } else {
    s = victim(-1);
    ZOF_ASSERT(s >= 0);  // at most two blocks are held at once, and there are >= 2 slots
    load(block, s);
  }
  Slot& sl = slots_[s];
  ++sl.holds;
  prefetch();
  be_.wait(compute_, sl.ready);
  // Still being written back from an earlier use: wait before the block can change again.
  if (sl.wrote) be_.wait(compute_, sl.free);
  return reinterpret_cast<float*>(sl.base);
}

void BlockStreamer::release(int block, bool dirty) {
  ZOF_ASSERT(holds_[block] > 0);
  --holds_[block];
  if (resident_[block]) {
    res_dirty_[block] = res_dirty_[block] || dirty;
    return;
  }
  const int s = slot_of_[block];
  ZOF_ASSERT(s >= 0 && slots_[s].holds > 0);
  Slot& sl = slots_[s];
  sl.dirty = sl.dirty || dirty;
  if (--sl.holds == 0) release_slot(s);
  prefetch();
}

void BlockStreamer::release_slot(int slot) {
  Slot& s = slots_[slot];
  if (s.dirty) {
    be_.record(s.consumed, compute_);
    be_.wait(down_, s.consumed);
    write_back(s.block);
    be_.record(s.free, down_);
    be_.record(written_[s.block], down_);
    written_recorded_[s.block] = true;
    s.wrote = true;
    s.dirty = false;
  } else {
    // If an earlier write-back was pending, compute waited for it at acquire: this event is
    // after it too.
    be_.record(s.free, compute_);
    s.wrote = false;
  }
  s.freed = true;
}

char* BlockStreamer::device_plane(int block, int k) const {
  if (resident_[block]) {
    size_t off = 0;
    for (int j = 0; j < k; ++j) off += plane_bytes(model_, model_.blocks()[block].span, j);
    return res_base_[block] + off;
  }
  return slots_[slot_of_[block]].base + slot_off_[k];
}

float* BlockStreamer::plane(int pi, int k) const {
  const int b = param_block_[pi];
  ZOF_ASSERT(b >= 0 && holds_[b] > 0 && k >= 1 && k < num_planes());
  return reinterpret_cast<float*>(device_plane(b, k)) + param_off_[pi];
}

Theta BlockStreamer::param(int pi) const {
  const int b = param_block_[pi];
  ZOF_ASSERT(b >= 0 && holds_[b] > 0);
  const DType t = model_.storage_dtype();
  return Theta(device_plane(b, 0) + param_off_[pi] * (int64_t)dtype_size(t), t);
}

void BlockStreamer::sync_to_host() {
  release_held();
  bool ordered = false;
  for (int b = 0; b < (int)resident_.size(); ++b) {
    if (!resident_[b] || !res_dirty_[b]) continue;
    if (!ordered) {
      be_.record(res_consumed_, compute_);
      be_.wait(down_, res_consumed_);
      ordered = true;
    }
    write_back(b);
    be_.record(written_[b], down_);
    written_recorded_[b] = true;
    res_dirty_[b] = false;
  }
  be_.synchronize(down_);
  be_.synchronize(up_);  // prefetches done too: the host may read and write its copy freely
}

void BlockStreamer::reload_from_host() {
  release_held();
  be_.synchronize(up_);
  be_.synchronize(down_);
  be_.synchronize(compute_);
  for (Slot& s : slots_) {
    if (s.block >= 0) slot_of_[s.block] = -1;
    s.block = -1;
    s.dirty = s.wrote = false;
  }
  res_uploaded_.assign(res_uploaded_.size(), false);
  res_waited_.assign(res_waited_.size(), false);
  res_dirty_.assign(res_dirty_.size(), false);
  order_.clear();
  pos_ = 0;
}

}  // namespace zof
