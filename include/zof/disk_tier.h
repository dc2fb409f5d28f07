// The disk tier: the host masters of the blocks that do not fit --host-mem live in a file under
// --offload-dir, and pass through host memory as the ZO walk reaches them. It sits under the
// walk's acquire/release as BlockStreamer (streaming.h) sits under them for the device, and
// never changes a bit: a block's bytes go to disk and come back as they were.
//
// A block keeps its place in the Model's storage (and in the optimizer-state planes laid out as
// the storage): what the tier does is take its memory away. A block homed on disk is written
// to its slot of the store, then the whole pages inside its span are given back to the system
// (madvise MADV_DONTNEED); reading it back fills them again. Every pointer into the storage
// stays valid, so every walk runs unchanged; between walks the tier holds the disk blocks'
// pages only for the ring (blocks read ahead, or being written behind).
//
// I/O without copies: a block's slot in the file starts at the same offset modulo 4096 as its
// span in memory, so the whole pages of the span go to and from the file directly (O_DIRECT
// where the file system takes it); only the first and last partial pages pass through a page of
// their own, both ways (a partial page is shared with the neighbouring block, which stays
// resident in it and may be changing, or runs past the plane's allocation: only the span's bytes
// are touched). The transfers run on io_uring where the kernel takes it, else on a pool of
// pread/pwrite threads (src/util/block_io.h; ZOF_IO=pool or uring forces one); describe() says
// which, and why the pool.
//
// Order of a block's life, all decided on the walk's thread:
//   on disk -> reading (read ahead, up to the ring's size, in the coming walk order) -> present
//   (acquired by the walk) -> released: changed -> writing -> on disk (pages given back when the
//   write is done), or present again where the walk wants it within the ring's read-ahead;
//   unchanged -> on disk at once (the store holds it).
// A block is never read while its write is in flight: acquire() waits for the write first. The
// ring's bytes bound what is present: an acquire that finds it full waits for the writes in
// flight, then drops the read-ahead needed last (never a held or changed block).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "zof/model.h"

namespace zof {

class BlockFile;
class IoEngine;
class IoTicket;
struct IoTransfer;

struct DiskTierStats {
  int64_t reads = 0, writes = 0;  // blocks read from and written to the store
  uint64_t bytes_read = 0, bytes_written = 0;
  int64_t stalls = 0;     // acquire() that waited for a read not yet done
  double stall_s = 0;     // seconds acquire() waited
  uint64_t ring_peak = 0;  // the most bytes of disk blocks present at once (the ring's use)
};

// Which blocks a --host-mem budget keeps in RAM and how many of the rest it holds at once.
struct DiskTierPlan {
  std::vector<bool> on_disk;  // per block
  // Bytes of disk blocks present at once (read ahead, held, being written, or kept after their
  // write for a use soon): the budget less the resident blocks, at least two of the largest disk
  // block (ring of them).
  int ring = 0;
  uint64_t resident_bytes = 0, ring_bytes = 0, store_bytes = 0;
  bool all_resident() const;
};

// Where a run's store lives, for a tier whose checkpoints refer to it instead of copying the
// model (a kill -9 at any moment leaves a run that resumes bit-identically):
// Each block has two slots in the file (the layout is the model's, every block's, so that a
// resumed run with another --host-mem finds its blocks; only the slots of the blocks on disk
// take space). A block's write goes to the slot that the last checkpoint does not name; a
// checkpoint makes every write durable (commit(): fdatasync) and records each disk block's slot
// and hash; once it is in place (renamed, `latest` written) the tier takes those slots as
// committed(). Whatever a kill interrupts (a read, a write-back, a checkpoint), the slots the
// latest complete checkpoint names were not written since it.
struct DiskStore {
  std::filesystem::path file;
  // Per block: the slot a checkpoint names (0 or 1), -1: none. Empty: a new store (created;
  // it must not exist); else the existing file is opened and these are its committed slots.
  std::vector<int> adopt;
  // false: a scratch store (one slot a block, removed with the tier; nothing adopted).
  bool persistent = true;
};

class DiskTier : public BlockAccess {
 public:
  // Host bytes of block b with `planes` planes: its weights in the storage's type and fp32 for
  // each further plane.
  static uint64_t block_bytes(const Model& m, int b, int planes = 1);
  static uint64_t all_bytes(const Model& m, int planes = 1);
  // The least budget: the `keep` blocks (read twice a walk, so never on disk) and two slots of
  // the largest other block.
  static uint64_t min_bytes(const Model& m, int planes, const std::vector<int>& keep);
  // The blocks a tier keeps resident: the block holding a tied LM head (the embedding's table,
  // which a walk reads first and last), none for an untied one.
  static std::vector<int> kept_blocks(const Model& m);
  // The ring a walk that writes back keeps busy: the most bytes of three blocks in a row of
  // the walk's order (block order, wrapping into the next walk; `keep` skipped), and no less
  // than min_bytes' two slots of the largest. Three: the block the walk computes, the next
  // read ahead and the last written behind; with two, the read of the next waits for the
  // last one's write. Taken over every block that could be on disk, before the plan knows
  // which are: where some of them stay resident, three disk blocks in a row may be more
  // (then they take the ring's two slots, a speed matter only).
  static uint64_t flight_bytes(const Model& m, int planes, const std::vector<int>& keep);
  // The blocks kept resident: `keep`, then the others from block 0 while the budget, less the
  // ring, holds them; the ring as large as the rest of the budget allows. The ring set aside
  // is flight_bytes where writes_back (a training walk) and the budget holds it with `keep`,
  // else min_bytes' two slots of the largest (evaluation and generation, which only read).
  // So a budget that just reaches kept + flight_bytes keeps fewer blocks resident than one a
  // byte below it: the third slot is worth a block more on disk (bench/RESULTS.md).
  // budget >= min_bytes.
  static DiskTierPlan plan(const Model& m, int planes, uint64_t budget,
                           const std::vector<int>& keep, bool writes_back);

  // Moves the plan's disk blocks out: creates DIR/zof-blocks-<pid>.bin (space reserved:
  // a full file system is refused here), whose slots are written as the first walk releases
  // each block. extra_planes: host arrays of Model::storage_size() floats laid out as the
  // storage (the optimizer state), moved with their blocks. The storage and the planes must
  // not move while the tier lives. threads: the pread/pwrite pool's, where it runs (the engine
  // is chosen here: io_engine_from_env()'s kind; ZOF_IO=uring where io_uring cannot run throws).
  // unwritten: the storage and planes do not hold the blocks yet; nothing is written now, and
  // the caller writes every disk block (acquire with overwrite, release changed) before any is
  // read (a model loaded straight into the tier, never whole in RAM).
  DiskTier(Model& model, std::vector<float*> extra_planes, const DiskTierPlan& plan,
           const std::filesystem::path& dir, int threads = 2, bool try_direct = true,
           bool unwritten = false);
  // A run's store (DiskStore): store.file created, or opened with store.adopt's slots taken as
  // committed (with unwritten, the caller writes every disk block, then restore_committed()
  // takes the adopted ones back). A tier with an adopted store exists even when the plan keeps
  // every block in RAM (restore_committed() reads them in).
  DiskTier(Model& model, std::vector<float*> extra_planes, const DiskTierPlan& plan,
           const DiskStore& store, int threads, bool try_direct, bool unwritten);
  // Waits for the transfers, removes the store unless a checkpoint names it (committed(), or
  // adopted). Does not bring blocks back: materialize() first.
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  bool on_disk(int block) const { return plan_.on_disk[block]; }
  // Whether the block's pages hold its bytes now (resident, or a disk block in the ring).
  bool present(int block) const;
  // A disk block in the ring: being read, present or being written (its pages in use).
  bool in_ring(int block) const;
  const DiskTierPlan& plan() const { return plan_; }
  bool direct() const;
  std::string describe() const;  // one line: what is on disk, the ring, the store, the I/O
  const std::filesystem::path& store_path() const;

  // A device above the tier writes blocks back (acquire with overwrite) between its reads: the
  // read-ahead leaves room in the ring for one such block, so that a write-back never drops a
  // block read ahead (which would be read again).
  void expect_write_backs();

  // The order in which the coming walk acquires blocks (repeats allowed; taken to repeat after
  // its end): what is read ahead.
  void begin_walk(std::vector<int> order) override;
  // The block's planes are in host memory and current until release. overwrite: the caller
  // writes every byte of them before reading any (a device's write-back): nothing is read.
  void acquire(int block, bool overwrite = false) override;
  // Done with the block; changed: its planes were written (they go to disk behind the walk).
  void release(int block, bool changed) override;
  // Every block in host memory and current; changed: the caller will write the host masters.
  // Until the next begin_walk() the host may read (and, with changed, write) them all; that
  // begin_walk() writes them back (with changed) and gives the disk blocks' pages back.
  void materialize(bool changed = false);

  const DiskTierStats& stats() const { return stats_; }

  // A run's store (DiskStore): the checkpoint's part.
  bool persistent() const { return persistent_; }
  int planes() const { return (int)planes_.size(); }
  // Every disk block's bytes in its slot and durable (changed blocks written, writes waited
  // for, fdatasync): per block, the slot that holds it (-1: not on disk). Between commit() and
  // committed() nothing may be written.
  std::vector<int> commit();
  // A checkpoint naming `slots` (commit()'s) is in place: from now on writes go around them, and
  // the store outlives the tier.
  void committed(const std::vector<int>& slots);
  // A checkpoint that names no slot is in place (every block in it): the store may go.
  void uncommitted();
  // The committed slots back as the blocks' bytes: a disk block's written since (a resume that
  // read the base through the tier) is dropped, and the slot taken again; a block now resident
  // is read into memory. Then the slots that are not committed are free.
  void restore_committed();
  // A hash of block b's bytes in every plane, as its slot holds them (the block present).
  uint64_t block_hash(int block) const;
  // The space of every slot no checkpoint names given back (a finished run keeps its final
  // checkpoint's blocks only).
  void release_free_slots();
  // The store's file layout for plane count `planes`: bytes of the file (both slots of every
  // block), and the bytes a plan reserves (the disk blocks' slots).
  static uint64_t store_file_bytes(const Model& m, int planes);

 private:
  enum class State { OnDisk, Reading, Present, Writing };
  struct Span {  // plane k of a block: its bytes in memory and its slot in the store
    char* addr = nullptr;
    uint64_t bytes = 0, file_off = 0;
  };
  std::vector<IoTransfer> transfers(int block, char op, uint64_t* bytes) const;
  void read_block(int block);
  void write_block(int block);
  void evict(int block);  // its whole pages given back
  void reap();  // finished writes -> on disk (present if wanted soon); a failed one throws
  bool wanted_soon(int block) const;  // within what prefetch() reads ahead along the order
  void make_room(int block);          // the ring's bytes left for the block (writes, read-ahead)
  void prefetch();
  uint64_t in_ring() const;  // bytes of the disk blocks in the ring
  void note_ring();          // stats_.ring_peak

  uint64_t slot_off(int block) const { return spans_[block].empty() ? 0 : spans_[block][0].file_off; }
  void read_now(int block);  // a resident block from its slot, waited for

  Model& model_;
  bool persistent_ = false, referenced_ = false;
  std::vector<int> slot_, committed_;  // per block: the slot holding it, the one a checkpoint names
  std::vector<uint64_t> slot_bytes_;   // per block: one slot's length
  int64_t kill_at_write_ = 0, writes_started_ = 0;  // ZOF_FAULT_KILL_AT_WRITE (crash tests)
  std::vector<char*> planes_;
  DiskTierPlan plan_;
  const void* storage_ = nullptr;  // the storage's start when planned: it must not move
  std::vector<std::vector<Span>> spans_;  // per block, per plane (disk blocks only)
  std::unique_ptr<BlockFile> file_;
  std::unique_ptr<IoEngine> io_;
  std::vector<State> state_;
  std::vector<std::shared_ptr<IoTicket>> ticket_;
  std::vector<bool> changed_;
  std::vector<int> holds_;
  std::vector<uint64_t> bytes_;  // per block, every plane
  std::vector<int> order_;
  size_t pos_ = 0;
  uint64_t read_ahead_bytes_ = 0;  // of the ring's bytes, what prefetch() may fill
  bool materialized_ = false;  // every block present since materialize()
  DiskTierStats stats_;
};

}  // namespace zof
