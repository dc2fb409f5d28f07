// Parameter streaming: every weight lives in host memory (the Model's storage, the master copy)
// and the transformer blocks pass through device memory as the ZO walk reaches them. Within a
// byte budget the blocks that fit stay resident for the whole run; the others stream through a
// ring of k >= 2 slots, k (the prefetch depth) set by what the budget leaves. Only the Backend
// interface is used (streams, events, async copies), so a GPU backend drives it unchanged and the
// simulated device (sim_device.h) runs the same ordering in CI.
//
// A block travels with its planes: plane 0 is its span of the Model's storage (the weights, in
// the storage's type: a bf16 master crosses the bus in 2 bytes a parameter each way), planes
// 1.. the same span of further fp32 host arrays laid out as the storage (a stateful
// optimizer's m, and v for Adam), so the optimizer state is streamed like the weights and the
// budget counts it. On the device a block's planes sit one after another in one allocation (a
// resident block's or a slot's), each plane's stride rounded up to 256 bytes; there is one copy
// per plane, all queued between the same waits and records below.
//
// Ordering, all on the device, never by blocking the host:
//   upload stream:  [wait slot's free event][wait block's write-back event] copy each plane
//                   host->slot, record slot.ready
//   compute stream: wait slot.ready; ...the walk's ops on the block...
//   release(dirty): record slot.consumed on compute; write-back stream waits on it, copies each
//                   plane slot->host, records slot.free and the block's written event
//   release(clean): record slot.free on compute
// A slot is refilled only after its free event (its last reader or its write-back is done), and
// a block is uploaded only after its last write-back reached the host. Re-acquiring a block that
// is still in a slot costs no transfer (its write-back, if any, is waited for by compute before
// the block can change again). Resident blocks are uploaded once; the device holds their
// authoritative copy (every plane) and sync_to_host() writes back those that changed.
//
// On CUDA the host master must be page-locked for copies to be asynchronous: the streamer
// registers the Model's storage with the backend (Backend::register_host, cudaHostRegister) for
// its lifetime; ZOEngine allocates the optimizer state pinned. The walks (ZOEngine, Forward's
// whole-model methods, the JVP walk) hand the backend only device memory, so a CUDA backend runs
// them as the simulated device does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zof/backend.h"
#include "zof/model.h"

namespace zof {

// Bytes from a memory size as --gpu-mem takes it: "16GiB", "512MiB", "1.5GiB", "4096" (bytes).
// Units, case-insensitive: B; K, KiB, M, MiB, G, GiB, T, TiB (powers of 1024); kB, MB, GB, TB
// (powers of 1000). Throws zof::Error naming `flag` for anything else, zero included.
uint64_t parse_memory_size(const std::string& text, const std::string& flag);
// "1.50 MiB", "512 B".
std::string format_bytes(uint64_t bytes);

struct StreamingStats {
  int64_t acquires = 0;  // acquire() of a streamed block
  int64_t hits = 0;      // ... that found the block still in a slot (no transfer)
  int64_t uploads = 0, writebacks = 0;
  uint64_t bytes_uploaded = 0, bytes_written_back = 0;
};

class DiskTier;

class BlockStreamer {
 public:
  // Device bytes of plane k of a block of `span` elements: the weights (plane 0) in the
  // model's storage type (a bf16 master's: 2 bytes each), optimizer state in fp32; rounded up
  // to 256 bytes as allocators do.
  static size_t plane_bytes(const Model& m, int64_t span, int k);
  // Device bytes of block b with `planes` planes.
  static size_t block_bytes(const Model& m, int b, int planes = 1);
  // The least budget for the blocks: two slots of the largest block (the LM head's chunks may be
  // read while the embedding's token table is needed too, when they are tied).
  static size_t min_bytes(const Model& m, int planes = 1);
  // Every block resident.
  static size_t all_resident_bytes(const Model& m, int planes = 1);

  // Plans residency within `budget` bytes of device memory for the blocks (>= min_bytes with
  // 1 + extra_planes.size() planes) and allocates it from the backend. extra_planes: host arrays
  // of Model::storage_size() floats laid out as the storage, planes 1.. (the caller owns them;
  // they are read and written like the storage, see sync_to_host()). Nothing is uploaded until a
  // block is first acquired.
  BlockStreamer(Model& model, Backend& be, size_t budget, std::vector<float*> extra_planes = {});
  ~BlockStreamer();  // waits for the streams; does not write back (sync_to_host first)
  BlockStreamer(const BlockStreamer&) = delete;
  BlockStreamer& operator=(const BlockStreamer&) = delete;

  bool resident(int block) const { return resident_[block]; }
  bool all_resident() const { return slots_.empty(); }
  int num_slots() const { return (int)slots_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t device_bytes() const { return device_bytes_; }  // resident blocks and slots
  int num_planes() const { return (int)host_planes_.size(); }
  std::string describe() const;  // one line: what is resident, slots, budget

  // The order in which the coming walk acquires blocks (repeats allowed): what prefetch follows,
  // taking the order to repeat after its end. Acquiring a block that is not next in the order is
  // allowed; it only stalls on its upload.
  void begin_walk(std::vector<int> order);
  // Device pointer of the block's weights, laid out as in Model::storage() from the block's
  // offset (in the storage's type); the compute (default) stream is ordered after the upload of
  // all its planes. Held until release.
  float* acquire(int block);
  // Done with the block on the compute stream; dirty: its planes changed (all written back to
  // the host when it leaves the device, or at sync_to_host() when it is resident).
  void release(int block, bool dirty);
  // Device pointer of parameter pi in plane k >= 1 (optimizer state, fp32); its block must be
  // held.
  float* plane(int pi, int k) const;
  // Parameter pi's weights on the device, in the storage's type (plane 0).
  Theta param(int pi) const;

  // Makes the host masters (the Model's storage and the extra planes) current: writes back
  // changed resident blocks and waits for every write-back and upload, after which the host may
  // read and write them (before evaluating, saving, at the end of a run; blocks still held by a
  // walk cut short are released first). Between walks the upload stream may be reading them (the
  // next walk's first blocks, prefetched): write them only after sync_to_host(), then call
  // reload_from_host().
  void sync_to_host();
  // A host master changed: drop every device copy (they are uploaded again when acquired).
  void reload_from_host();

  const StreamingStats& stats() const { return stats_; }

  // The host masters under a disk tier (disk_tier.h): every upload acquires the block's host
  // planes from it first and every write-back acquires them to be overwritten; the host waits
  // for the copy, then gives them back (a write-back's as changed, for the tier to write).
  // Those waits cost the copies their overlap with compute while a tier is set. null: none.
  void set_disk_tier(DiskTier* tier);

 private:
  struct Slot {
    char* base = nullptr;
    int block = -1;       // the block it holds (valid data), -1: empty
    int holds = 0;
    bool dirty = false;   // changed while held
    bool wrote = false;   // its last release wrote it back (free = the write-back's end)
    bool freed = false;   // `free` has been recorded at least once
    Event *ready = nullptr, *consumed = nullptr, *free = nullptr;
  };
  size_t elem_bytes(int k) const {
    return k == 0 ? dtype_size(model_.storage_dtype()) : sizeof(float);
  }
  char* host(int block, int k) const {
    return host_planes_[k] + model_.blocks()[block].offset * (int64_t)elem_bytes(k);
  }
  size_t span_bytes(int block, int k) const {
    return (size_t)model_.blocks()[block].span * elem_bytes(k);
  }
  // Plane k of the block's device copy (resident, or in its slot).
  char* device_plane(int block, int k) const;
  // The constructor's two halves: which blocks stay resident and how many slots stream the
  // rest, then the device memory, streams and events for them.
  void plan(int planes);
  void allocate(int planes);
  // Every plane of the block between its host masters and its device copy: uploads on the
  // upload stream, write-backs on the write-back stream (the caller orders them with events).
  void upload(int block);
  void write_back(int block);
  // Its next position from pos_ in order_ repeated (positions past the end: the next walk),
  // or INT64_MAX.
  int64_t next_use(int block) const;
  // Of the slots no one holds whose block is next needed after position `after`, the one
  // needed latest (an empty slot first); -1 when there is none.
  int victim(int64_t after) const;
  void load(int block, int slot);
  void upload_resident(int block);
  void prefetch();
  void release_slot(int slot);
  void release_held();  // releases (as changed) what a walk cut short left held

  Model& model_;
  Backend& be_;
  std::vector<char*> host_planes_;  // [0]: the Model's storage, then the extra planes
  Stream *compute_ = nullptr, *up_ = nullptr, *down_ = nullptr;
  std::vector<int> param_block_;
  std::vector<int64_t> param_off_;  // elements from the block's offset
  std::vector<bool> resident_;
  std::vector<int> holds_;  // per block
  // Resident blocks: device copy, uploaded yet, compute ordered after the upload, changed.
  std::vector<char*> res_base_;
  std::vector<bool> res_uploaded_, res_waited_, res_dirty_;
  std::vector<Event*> res_ready_;
  Event* res_consumed_ = nullptr;
  // Streamed blocks: their slot (-1: none), their latest write-back.
  std::vector<int> slot_of_;
  std::vector<Event*> written_;
  std::vector<bool> written_recorded_;
  std::vector<Slot> slots_;
  size_t slot_bytes_ = 0;
  std::vector<size_t> slot_off_;  // byte offset of each plane in a slot
  size_t device_bytes_ = 0, budget_ = 0;
  bool pinned_master_ = false;  // the Model's storage registered with the backend
  std::vector<int> order_;
  size_t pos_ = 0;  // order_ positions before pos_ are done (acquired)
  StreamingStats stats_;
  DiskTier* tier_ = nullptr;
};

}  // namespace zof
