// The disk tier (zof/disk_tier.h): the plan of what a --host-mem budget keeps in RAM, the store
// file's slots, and the life of a disk block (read ahead, present, written behind, its pages
// given back).
#include "zof/disk_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "util/block_io.h"
#include "zof/error.h"
#include "zof/streaming.h"

namespace zof {
namespace fs = std::filesystem;

namespace {

// Transfers of a plane are cut into pieces of this size so that the pool's threads (or the
// ring's requests in flight) share a block.
constexpr uint64_t kChunk = uint64_t(4) << 20;
constexpr uintptr_t kHugePage = uintptr_t(2) << 20;  // x86-64's and arm64's (4 KiB pages)

uintptr_t page_down(uintptr_t a) { return a / kIoAlign * kIoAlign; }
uintptr_t page_up(uintptr_t a) { return (a + kIoAlign - 1) / kIoAlign * kIoAlign; }

size_t elem_bytes(const Model& m, int k) {
  return k == 0 ? dtype_size(m.storage_dtype()) : sizeof(float);
}

}  // namespace

bool DiskTierPlan::all_resident() const {
  return std::none_of(on_disk.begin(), on_disk.end(), [](bool d) { return d; });
}

uint64_t DiskTier::block_bytes(const Model& m, int b, int planes) {
  const uint64_t span = (uint64_t)m.blocks()[b].span;
  uint64_t bytes = 0;
  for (int k = 0; k < planes; ++k) bytes += span * elem_bytes(m, k);
  return bytes;
}

uint64_t DiskTier::all_bytes(const Model& m, int planes) {
  uint64_t s = 0;
  for (int b = 0; b < (int)m.blocks().size(); ++b) s += block_bytes(m, b, planes);
  return s;
}

uint64_t DiskTier::min_bytes(const Model& m, int planes, const std::vector<int>& keep) {
  uint64_t kept = 0, largest = 0;
  for (int b = 0; b < (int)m.blocks().size(); ++b) {
    if (std::find(keep.begin(), keep.end(), b) != keep.end())
      kept += block_bytes(m, b, planes);
    else
      largest = std::max(largest, block_bytes(m, b, planes));
  }
  return kept + 2 * largest;
}

uint64_t DiskTier::flight_bytes(const Model& m, int planes, const std::vector<int>& keep) {
  std::vector<uint64_t> walk;  // the blocks that can be on disk, in the walk's order
  uint64_t largest = 0;
  for (int b = 0; b < (int)m.blocks().size(); ++b)
    if (std::find(keep.begin(), keep.end(), b) == keep.end()) {
      walk.push_back(block_bytes(m, b, planes));
      largest = std::max(largest, walk.back());
    }
  const size_t n = walk.size();
  uint64_t three = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t sum = 0;
    for (size_t k = 0; k < std::min<size_t>(3, n); ++k) sum += walk[(i + k) % n];
    three = std::max(three, sum);
  }
  return std::max(three, 2 * largest);
}

std::vector<int> DiskTier::kept_blocks(const Model& m) {
  const int lm = m.lm_head(), last = (int)m.blocks().size() - 1;
  for (int b = 0; b < last; ++b)
    for (int pi : m.blocks()[b].params)
      if (pi == lm) return {b};
  return {};
}

DiskTierPlan DiskTier::plan(const Model& m, int planes, uint64_t budget,
                            const std::vector<int>& keep, bool writes_back) {
  const int n = (int)m.blocks().size();
  DiskTierPlan p;
  p.on_disk.assign(n, false);
  if (budget >= all_bytes(m, planes)) {
    p.resident_bytes = all_bytes(m, planes);
    return p;
  }
  const uint64_t least = min_bytes(m, planes, keep);
  ZOF_ASSERT(budget >= least);
  uint64_t kept = 0;
  for (int b : keep) kept += block_bytes(m, b, planes);
  // The ring first: three blocks in flight where the walk writes back and the budget holds
  // them, else two slots of the largest. (Measured, LLaMA-2-7B's shape with a quarter in RAM:
  // the walk waited 5.9-7.5 s a step on reads with two, none with three; bench/RESULTS.md.)
  const uint64_t flight = writes_back ? flight_bytes(m, planes, keep) : least - kept;
  uint64_t avail = budget >= kept + flight ? budget - kept - flight : budget - least;
  p.resident_bytes = kept;
  for (int b = 0; b < n; ++b) {
    if (std::find(keep.begin(), keep.end(), b) != keep.end()) continue;
    const uint64_t bytes = block_bytes(m, b, planes);
    if (bytes <= avail) {
      avail -= bytes;
      p.resident_bytes += bytes;
    } else {
      p.on_disk[b] = true;
    }
  }
  uint64_t largest = 0;
  int disk_blocks = 0;
  for (int b = 0; b < n; ++b)
    if (p.on_disk[b]) {
      largest = std::max(largest, block_bytes(m, b, planes));
      ++disk_blocks;
      // Its slots: the pages its planes touch (at most one more page at each end).
      p.store_bytes += block_bytes(m, b, planes) + (uint64_t)planes * 2 * kIoAlign;
    }
  if (disk_blocks == 0) return p;  // the reserved ring held the rest
  // The ring is bytes: what the budget leaves, at least two of the largest disk block, and as
  // many smaller ones as fit (a deeper read-ahead where the blocks are smaller than the largest).
  p.ring_bytes = budget - p.resident_bytes;
  p.ring = (int)std::min<uint64_t>(disk_blocks, p.ring_bytes / largest);
  ZOF_ASSERT(p.ring >= 2 || disk_blocks < 2);
  p.ring = std::max(p.ring, 1);
  return p;
}

DiskTier::DiskTier(Model& model, std::vector<float*> extra_planes, const DiskTierPlan& plan,
                   const fs::path& dir, int threads, bool try_direct, bool unwritten)
    : DiskTier(model, std::move(extra_planes), plan,
               DiskStore{dir / ("zof-blocks-" + std::to_string((long)::getpid()) + ".bin"), {},
                         /*persistent=*/false},
               threads, try_direct, unwritten) {}

uint64_t DiskTier::store_file_bytes(const Model& m, int planes) {
  // Both slots of every block: the pages each plane's span touches (planes start on a page).
  uint64_t bytes = 0;
  for (const Block& blk : m.blocks())
    for (int k = 0; k < planes; ++k) {
      const uint64_t a = (uint64_t)blk.offset * elem_bytes(m, k);
      bytes += 2 * (page_up(a + (uint64_t)blk.span * elem_bytes(m, k)) - page_down(a));
    }
  return bytes;
}

DiskTier::DiskTier(Model& model, std::vector<float*> extra_planes, const DiskTierPlan& plan,
                   const DiskStore& store, int threads, bool try_direct, bool unwritten)
    : model_(model), persistent_(store.persistent), plan_(plan), storage_(model.storage_ptr()) {
  const int n = (int)model.blocks().size();
  ZOF_ASSERT((int)plan.on_disk.size() == n);
  ZOF_ASSERT(store.adopt.empty() || ((int)store.adopt.size() == n && persistent_));
  planes_.push_back(static_cast<char*>(model.storage_ptr()));
  for (float* p : extra_planes) planes_.push_back(reinterpret_cast<char*>(p));
  // The store's layout is every block's (so that a resumed run with another plan finds them),
  // in block order: slot 0 of a block's planes, then slot 1. Each plane's part holds the pages
  // its span touches, so that its whole pages move straight between memory and the file; the
  // planes start on a page (the storage's pages, the host backend's large arrays), so the
  // layout is the same in every process.
  for (char* p : planes_)
    ZOF_CHECK(reinterpret_cast<uintptr_t>(p) % kIoAlign == 0,
              "the disk tier needs its planes to start on a page; run without --host-mem");
  spans_.resize(n);
  slot_bytes_.assign(n, 0);
  uint64_t cursor = 0;
  std::vector<std::pair<uint64_t, uint64_t>> reserve;
  for (int b = 0; b < n; ++b) {
    const Block& blk = model.blocks()[b];
    const uint64_t from = cursor;
    for (int k = 0; k < (int)planes_.size(); ++k) {
      Span s;
      s.addr = planes_[k] + blk.offset * (int64_t)elem_bytes(model, k);
      s.bytes = (uint64_t)blk.span * elem_bytes(model, k);
      s.file_off = cursor;
      const uintptr_t a = reinterpret_cast<uintptr_t>(s.addr);
      cursor += page_up(a + s.bytes) - page_down(a);
      spans_[b].push_back(s);
    }
    slot_bytes_[b] = cursor - from;
    cursor += slot_bytes_[b];  // slot 1
    // Space for the disk blocks' slots (both where checkpoints name them), and for the slots of
    // an adopted block (its bytes are there).
    const bool adopted = !store.adopt.empty() && store.adopt[b] >= 0;
    if (plan.on_disk[b] || adopted)
      reserve.push_back({from, persistent_ ? 2 * slot_bytes_[b] : slot_bytes_[b]});
  }
  ZOF_ASSERT(cursor == store_file_bytes(model, (int)planes_.size()));
  plan_.store_bytes = 0;
  for (int b = 0; b < n; ++b)
    if (plan.on_disk[b]) plan_.store_bytes += (persistent_ ? 2 : 1) * slot_bytes_[b];
  read_ahead_bytes_ = plan_.ring_bytes;
  state_.assign(n, State::Present);
  ticket_.resize(n);
  changed_.assign(n, false);
  holds_.assign(n, 0);
  slot_.assign(n, 0);
  committed_.assign(n, -1);
  const bool adopting = std::any_of(store.adopt.begin(), store.adopt.end(), [](int s) { return s >= 0; });
  for (int b = 0; b < n && !store.adopt.empty(); ++b) {
    ZOF_ASSERT(store.adopt[b] >= -1 && store.adopt[b] <= 1);
    committed_[b] = store.adopt[b];
    slot_[b] = std::max(store.adopt[b], 0);
  }
  referenced_ = adopting;
  if (const char* k = std::getenv("ZOF_FAULT_KILL_AT_WRITE"))
    kill_at_write_ = std::atoll(k);
  for (int b = 0; b < n; ++b) bytes_.push_back(block_bytes(model, b, (int)planes_.size()));
  if (plan.all_resident() && !adopting) return;
  // A disk block's pages are given back after each visit and taken again on the next: asked
  // for as transparent huge pages, a visit takes one fault per 2 MiB instead of per 4 KiB
  // (measured, LLaMA-2-7B's shape with a quarter in RAM: 14.8M faults in three steps down to
  // 0.9M, 25.2 s a step down to 24.3 s). Advice only: where the kernel has them off, nothing
  // changes.
  for (int b = 0; b < n; ++b)
    if (plan.on_disk[b])
      for (const Span& sp : spans_[b]) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(sp.addr);
        const uintptr_t lo = (a + kHugePage - 1) / kHugePage * kHugePage;
        const uintptr_t hi = (a + sp.bytes) / kHugePage * kHugePage;
        if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
      }
  // The engine first: a ZOF_IO it refuses leaves no store behind.
  io_ = make_io_engine(threads, io_engine_from_env());
  file_ = std::make_unique<BlockFile>(store.file, cursor, reserve, try_direct,
                                      /*existing=*/!store.adopt.empty());
  // Every disk block to its slot now (unless the caller writes them, or the store holds it):
  // from here the tier holds only the ring.
  try {
    for (int b = 0; b < n; ++b)
      if (plan.on_disk[b] && !unwritten && committed_[b] < 0) write_block(b);
    for (int b = 0; b < n; ++b)
      if (plan.on_disk[b]) {
        if (ticket_[b]) ticket_[b]->wait();
        evict(b);
        state_[b] = State::OnDisk;
      }
  } catch (...) {
    io_.reset();  // the transfers end before the file goes
    if (!referenced_) file_->remove();
    throw;
  }
  stats_ = DiskTierStats{};  // the moving out is not a walk's traffic
}

DiskTier::~DiskTier() {
  io_.reset();  // runs what is queued, then joins
  if (file_ && !(persistent_ && referenced_)) file_->remove();
}

std::vector<int> DiskTier::commit() {
  std::vector<int> slots(state_.size(), -1);
  if (!file_) return slots;
  for (int b = 0; b < (int)state_.size(); ++b)
    if (plan_.on_disk[b] && state_[b] == State::Present && changed_[b]) {
      ZOF_ASSERT(holds_[b] == 0);
      write_block(b);
    }
  for (int b = 0; b < (int)state_.size(); ++b) {
    if (!plan_.on_disk[b]) continue;
    if (state_[b] == State::Writing) {
      ticket_[b]->wait();
      state_[b] = State::Present;  // its pages hold it still; the next walk decides
    }
    slots[b] = slot_[b];
  }
  file_->sync();
  return slots;
}

void DiskTier::committed(const std::vector<int>& slots) {
  ZOF_ASSERT(slots.size() == committed_.size());
  committed_ = slots;
  referenced_ = true;
}

void DiskTier::uncommitted() {
  std::fill(committed_.begin(), committed_.end(), -1);
  referenced_ = false;
}

void DiskTier::read_now(int b) {
  uint64_t bytes = 0;
  io_->submit(transfers(b, 'r', &bytes))->wait();
  ++stats_.reads;
  stats_.bytes_read += bytes;
}

void DiskTier::restore_committed() {
  if (!file_) return;
  for (int b = 0; b < (int)state_.size(); ++b) {
    if (committed_[b] < 0) continue;
    ZOF_ASSERT(holds_[b] == 0);
    if (!plan_.on_disk[b]) {  // resident now: its bytes from the slot, once
      slot_[b] = committed_[b];
      read_now(b);
      continue;
    }
    if (ticket_[b]) ticket_[b]->wait();
    if (state_[b] != State::OnDisk) evict(b);
    state_[b] = State::OnDisk;
    changed_[b] = false;
    slot_[b] = committed_[b];
  }
  // A block now resident keeps its committed slot until the next checkpoint names none (its
  // bytes go into that checkpoint itself): the latest checkpoint still names it.
  materialized_ = false;
}

uint64_t DiskTier::block_hash(int b) const {
  ZOF_ASSERT(present(b));
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)b;
  for (const Span& s : spans_[b]) h = hash_bytes(s.addr, s.bytes, h);
  return h;
}

void DiskTier::release_free_slots() {
  if (!file_) return;
  for (int b = 0; b < (int)state_.size(); ++b) {
    const uint64_t base = slot_off(b);
    for (int k = 0; k < 2; ++k)
      if (committed_[b] != k) file_->punch(base + k * slot_bytes_[b], slot_bytes_[b]);
  }
}

void DiskTier::expect_write_backs() {
  uint64_t largest = 0;
  for (int b = 0; b < (int)bytes_.size(); ++b)
    if (plan_.on_disk[b]) largest = std::max(largest, bytes_[b]);
  // The plan's ring holds two of the largest at least: one read ahead, one written back.
  read_ahead_bytes_ = plan_.ring_bytes - std::min(plan_.ring_bytes, largest);
}

bool DiskTier::present(int block) const {
  return !plan_.on_disk[block] || state_[block] == State::Present ||
         state_[block] == State::Writing;
}

bool DiskTier::in_ring(int block) const {
  return plan_.on_disk[block] && state_[block] != State::OnDisk;
}

bool DiskTier::direct() const { return file_ && file_->direct(); }

const fs::path& DiskTier::store_path() const {
  static const fs::path none;
  return file_ ? file_->path() : none;
}

std::string DiskTier::describe() const {
  const int n = (int)plan_.on_disk.size();
  const int disk = (int)std::count(plan_.on_disk.begin(), plan_.on_disk.end(), true);
  if (disk == 0) return "every block in host memory (" + format_bytes(plan_.resident_bytes) + ")";
  return std::to_string(disk) + " of " + std::to_string(n) + " blocks on disk (" +
         format_bytes(plan_.store_bytes) + " in " + file_->path().string() + "), " +
         format_bytes(plan_.resident_bytes) + " resident, a ring of " +
         format_bytes(plan_.ring_bytes) + " (" + std::to_string(plan_.ring) +
         " of the largest disk block); I/O: " + io_->describe() + ", " +
         (file_->direct() ? std::string("O_DIRECT") : "buffered: " + file_->note());
}

// A span's transfers: its whole pages straight between memory and the file (in pieces of
// kChunk), and each partial page through a page of its own that holds only the span's bytes.
// The rest of a partial page is the neighbouring block's (which the walk may be changing) or
// no one's (before or after the plane's allocation): it is neither read nor written.
// `then` of a partial page's read copies its span's bytes in; a partial write's page is filled
// now, and its `then` keeps the page alive until the transfer is done.
std::vector<IoTransfer> DiskTier::transfers(int b, char op, uint64_t* bytes) const {
  std::vector<IoTransfer> jobs;
  const BlockFile* f = file_.get();
  const uint64_t slot = (uint64_t)slot_[b] * slot_bytes_[b];
  for (const Span& sp : spans_[b]) {
    Span s = sp;
    s.file_off += slot;
    const uintptr_t a = reinterpret_cast<uintptr_t>(s.addr), end = a + s.bytes;
    const uintptr_t lo = page_down(a), full0 = page_up(a), full1 = page_down(end);
    auto partial = [&](uintptr_t from, uintptr_t to) {
      const uintptr_t page = page_down(from);
      auto buf = std::make_shared<AlignedBuffer>(kIoAlign);  // zeroed
      char* data = buf->data;
      const uint64_t off = s.file_off + (page - lo);
      if (op == 'w') {
        std::memcpy(data + (from - page), reinterpret_cast<const char*>(from), to - from);
        jobs.push_back({'w', f, data, kIoAlign, off, [buf = std::move(buf)] {}});
      } else {
        jobs.push_back({'r', f, data, kIoAlign, off, [buf = std::move(buf), page, from, to] {
                          std::memcpy(reinterpret_cast<char*>(from), buf->data + (from - page),
                                      to - from);
                        }});
      }
      *bytes += kIoAlign;
    };
    if (full0 > full1) {  // within one page
      partial(a, end);
      continue;
    }
    if (a < full0) partial(a, full0);
    for (uintptr_t c = full0; c < full1; c += kChunk) {
      const uint64_t m = std::min<uint64_t>(kChunk, full1 - c);
      jobs.push_back({op, f, reinterpret_cast<char*>(c), m, s.file_off + (c - lo), {}});
      *bytes += m;
    }
    if (full1 < end) partial(full1, end);
  }
  return jobs;
}

void DiskTier::write_block(int b) {
  // Never over the slot a checkpoint names: a kill mid-write leaves that one whole.
  if (slot_[b] == committed_[b]) slot_[b] = 1 - slot_[b];
  uint64_t bytes = 0;
  ticket_[b] = io_->submit(transfers(b, 'w', &bytes));
  // Fault injection for the crash tests: die with the Nth write of a run's store in flight.
  if (kill_at_write_ > 0 && ++writes_started_ == kill_at_write_) ::raise(SIGKILL);
  state_[b] = State::Writing;
  changed_[b] = false;
  ++stats_.writes;
  stats_.bytes_written += bytes;
}

void DiskTier::read_block(int b) {
  uint64_t bytes = 0;
  ticket_[b] = io_->submit(transfers(b, 'r', &bytes));
  state_[b] = State::Reading;
  ++stats_.reads;
  stats_.bytes_read += bytes;
}

void DiskTier::evict(int b) {
  for (const Span& s : spans_[b]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(s.addr);
    const uintptr_t full0 = page_up(a), full1 = page_down(a + s.bytes);
    if (full0 < full1)
      ZOF_CHECK(::madvise(reinterpret_cast<void*>(full0), full1 - full0, MADV_DONTNEED) == 0,
                std::string("the disk tier cannot give a block's memory back (madvise: ") +
                    std::strerror(errno) + "); run without --host-mem");
  }
}

void DiskTier::reap() {
  for (int b = 0; b < (int)state_.size(); ++b)
    if (state_[b] == State::Writing && ticket_[b]->done()) {
      ticket_[b]->wait();  // throws a failed write's error
      // Wanted again within the read-ahead (a small model's next micro-batch, a device's
      // upload after its write-back): its pages hold it, in the ring's bytes already.
      if (wanted_soon(b)) {
        state_[b] = State::Present;
        continue;
      }
      evict(b);
      state_[b] = State::OnDisk;
    }
}

bool DiskTier::wanted_soon(int block) const {
  // The blocks prefetch() would hold: along the order while the ring's bytes take them.
  const size_t n = order_.size();
  uint64_t bytes = 0;
  std::vector<char> seen(state_.size(), 0);  // counted already (the order repeats a block)
  for (size_t p = pos_; p < pos_ + n; ++p) {
    const int b = order_[p % n];
    if (!plan_.on_disk[b] || seen[b]) continue;
    seen[b] = 1;
    bytes += bytes_[b];
    if (bytes > read_ahead_bytes_) return false;
    if (b == block) return true;
  }
  return false;
}

void DiskTier::make_room(int block) {
  // Writes in flight finish first (their pages go); then read-ahead nobody holds goes, the
  // block needed last first. (An acquire out of the walk's order, or a device's write-back,
  // would else take the ring past its bytes.)
  for (int w = 0; w < (int)state_.size() && in_ring() + bytes_[block] > plan_.ring_bytes; ++w)
    if (state_[w] == State::Writing) {
      ticket_[w]->wait();
      evict(w);
      state_[w] = State::OnDisk;
    }
  while (in_ring() + bytes_[block] > plan_.ring_bytes) {
    int victim = -1;
    size_t victim_use = 0;
    const size_t n = order_.size();
    for (int w = 0; w < (int)state_.size(); ++w) {
      if (w == block || !plan_.on_disk[w] || holds_[w] > 0 || changed_[w]) continue;
      if (state_[w] != State::Reading && state_[w] != State::Present) continue;
      size_t use = n;  // not in the order: needed last
      for (size_t k = 0; k < n; ++k)
        if (order_[(pos_ + k) % n] == w) {
          use = k;
          break;
        }
      if (victim < 0 || use > victim_use) {
        victim = w;
        victim_use = use;
      }
    }
    if (victim < 0) return;  // every block in the ring is held: the walk's own need
    if (state_[victim] == State::Reading) ticket_[victim]->wait();
    evict(victim);
    state_[victim] = State::OnDisk;
  }
}

void DiskTier::note_ring() {
  // Materialized, every block is present by request (an evaluation between walks): not the ring.
  if (!materialized_) stats_.ring_peak = std::max(stats_.ring_peak, in_ring());
}

uint64_t DiskTier::in_ring() const {
  uint64_t bytes = 0;
  for (int b = 0; b < (int)state_.size(); ++b)
    if (plan_.on_disk[b] && state_[b] != State::OnDisk) bytes += bytes_[b];
  return bytes;
}

void DiskTier::prefetch() {
  if (order_.empty()) return;
  reap();
  uint64_t bytes = in_ring();
  const size_t n = order_.size();
  // In walk order, while the ring's bytes hold them (less a block's room for a device's
  // write-back, where one comes): the next block needed is always read first.
  for (size_t p = pos_; p < pos_ + n; ++p) {
    const int b = order_[p % n];
    if (!plan_.on_disk[b] || state_[b] != State::OnDisk) continue;
    if (bytes + bytes_[b] > read_ahead_bytes_) break;
    read_block(b);
    bytes += bytes_[b];
  }
  note_ring();
}

void DiskTier::begin_walk(std::vector<int> order) {
  ZOF_ASSERT(model_.storage_ptr() == storage_);  // the storage did not move under the tier
  order_ = std::move(order);
  pos_ = 0;
  if (!file_) return;
  if (materialized_) {  // back to the ring: what the host changed goes to disk first
    for (int b = 0; b < (int)state_.size(); ++b)
      if (plan_.on_disk[b] && state_[b] == State::Present && holds_[b] == 0 && changed_[b])
        write_block(b);
    for (int b = 0; b < (int)state_.size(); ++b) {
      if (!plan_.on_disk[b] || holds_[b] > 0) continue;
      if (state_[b] == State::Writing) ticket_[b]->wait();
      if (state_[b] == State::Writing || state_[b] == State::Present) {
        evict(b);
        state_[b] = State::OnDisk;
      }
    }
    materialized_ = false;
  }
  // Blocks kept present after their writes for the old order's use: the new order's read-ahead
  // decides (a block it wants soon stays, the others give their pages back).
  for (int b = 0; b < (int)state_.size(); ++b)
    if (plan_.on_disk[b] && state_[b] == State::Present && holds_[b] == 0 && !changed_[b] &&
        !wanted_soon(b)) {
      evict(b);
      state_[b] = State::OnDisk;
    }
  prefetch();
}

void DiskTier::acquire(int b, bool overwrite) {
  if (!plan_.on_disk[b]) return;
  // Its place in the walk order (a block acquired out of order is allowed). A device's
  // write-back (overwrite) is not a use in the walk's order: it leaves the place as it is.
  const size_t n = order_.size();
  for (size_t p = pos_; p < pos_ + n && !overwrite; ++p)
    if (order_[p % n] == b) {
      pos_ = p + 1;
      break;
    }
  // Released and wanted again while (or since) its write runs: its pages still hold it. Before
  // reap(), which judges by the place past this use and would give them back.
  if (state_[b] == State::Writing) {
    ticket_[b]->wait();
    state_[b] = State::Present;
  }
  reap();
  if (state_[b] == State::OnDisk) {
    make_room(b);
    if (overwrite)
      state_[b] = State::Present;  // every byte is about to be written: nothing to read
    else
      read_block(b);
  }
  if (state_[b] == State::Reading) {
    if (!ticket_[b]->done()) {
      const auto t0 = std::chrono::steady_clock::now();
      ticket_[b]->wait();
      ++stats_.stalls;
      stats_.stall_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ticket_[b]->wait();  // a failed read's error
    state_[b] = State::Present;
  }
  ++holds_[b];
  note_ring();
  prefetch();
}

void DiskTier::release(int b, bool changed) {
  if (!plan_.on_disk[b]) return;
  ZOF_ASSERT(holds_[b] > 0 && state_[b] == State::Present);
  changed_[b] = changed_[b] || changed;
  // Materialized (an evaluation streaming through a device between walks): the block stays,
  // and the next begin_walk() writes it if it changed.
  if (--holds_[b] > 0 || materialized_) return;
  if (changed_[b]) {
    write_block(b);
  } else {
    evict(b);  // the store holds it as it is
    state_[b] = State::OnDisk;
  }
  prefetch();
}

void DiskTier::materialize(bool changed) {
  if (!file_) return;
  for (int b = 0; b < (int)state_.size(); ++b) {
    if (!plan_.on_disk[b]) continue;
    if (state_[b] == State::Writing) {
      ticket_[b]->wait();
      state_[b] = State::Present;
    }
    if (state_[b] == State::OnDisk) read_block(b);
  }
  for (int b = 0; b < (int)state_.size(); ++b) {
    if (!plan_.on_disk[b]) continue;
    if (state_[b] == State::Reading) {
      ticket_[b]->wait();
      state_[b] = State::Present;
    }
    if (changed) changed_[b] = true;
  }
  materialized_ = true;
  order_.clear();
  pos_ = 0;
}

}  // namespace zof
