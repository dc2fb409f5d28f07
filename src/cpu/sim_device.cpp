// make_sim_device: the simulated device of sim_device.h. Memory is budgeted host memory; each
// stream but the default one is a worker thread draining a queue of tasks (copies, ops, event
// records, event waits) in order; the default stream runs on the calling thread after the event
// waits queued on it. One mutex guards all bookkeeping; copies and ops run outside it.
#include "cpu/sim_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <source_location>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cpu/host_backend.h"
#include "zof/error.h"

namespace zof::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One record of an event: done when the recording stream reaches it; vc is that stream's clock
// at the record, what a stream waiting on it becomes ordered after.
struct Marker {
  bool done = false;
  std::vector<uint64_t> vc;
};

// An event remembers its latest record only: a wait orders after the record current at the time
// of the wait (cudaStreamWaitEvent), and a wait on a never-recorded event does nothing.
struct SimEvent {
  std::shared_ptr<Marker> latest;
};

struct Task {
  enum Kind { Run, Wait, Record } kind = Run;
  std::function<void()> fn;        // Run: a copy or an op
  std::shared_ptr<Marker> marker;  // Wait, Record
  uint64_t to_device = 0, to_host = 0;
};

struct SimStream {
  int id = 0;
  std::vector<uint64_t> vc;  // vector clock; vc[id] counts this stream's work
  std::deque<Task> queue;    // worker streams
  bool busy = false, stop = false;
  std::vector<std::shared_ptr<Marker>> pending;  // default stream: waits not yet honoured
  std::thread worker;
};

// A range of memory an op or copy reads or writes.
struct Access {
  const void* p;
  size_t bytes;
  bool write;
};
Access R(const void* p, int64_t bytes) { return {p, p ? (size_t)std::max<int64_t>(bytes, 0) : 0, false}; }
Access W(const void* p, int64_t bytes) { return {p, p ? (size_t)std::max<int64_t>(bytes, 0) : 0, true}; }
constexpr int64_t F = sizeof(float);

uint64_t at(const std::vector<uint64_t>& vc, int i) { return i < (int)vc.size() ? vc[i] : 0; }
void merge(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

class SimDeviceImpl final : public SimDevice {
 public:
  using Backend::attention;
  using Backend::attention_jvp;
  using Backend::matmul;
  using Backend::rms_norm;
  using Backend::rms_norm_jvp;
  using Backend::zo_pass;
  SimDeviceImpl(std::unique_ptr<Backend> host, SimDeviceOptions opt)
      : host_(std::move(host)), opt_(opt) {
    ZOF_ASSERT(host_);
    ZOF_CHECK(opt.copy_bandwidth >= 0, "the simulated device's copy bandwidth must be >= 0");
    if (opt_.budget == 0) opt_.budget = available_host_memory();
    auto d = std::make_unique<SimStream>();
    d->id = 0;
    d->vc.assign(1, 0);
    def_ = d.get();
    streams_.push_back(std::move(d));
  }

  ~SimDeviceImpl() override {
    std::unique_lock lk(mu_);
    for (auto& s : streams_)
      if (s->id != 0) cv_.wait(lk, [&] { return s->queue.empty() && !s->busy; });
    for (auto& s : streams_) s->stop = true;
    cv_.notify_all();
    lk.unlock();
    for (auto& s : streams_)
      if (s->worker.joinable()) s->worker.join();
  }

  std::string name() const override { return "sim:" + host_->name(); }

  // ---- memory ----------------------------------------------------------------------------
  void* alloc(size_t bytes) override {
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    {
      std::lock_guard lk(mu_);
      ZOF_CHECK(rounded >= bytes && used_ + rounded <= opt_.budget,
                "the simulated device is out of memory: " + std::to_string(bytes) +
                    " bytes requested with " + std::to_string(used_) + " of its " +
                    std::to_string(opt_.budget) + "-byte budget (--gpu-mem) in use; raise --gpu-mem, or "
                    "lower --batch or --seq-len");
      used_ += rounded;
      peak_ = std::max(peak_, used_);
    }
    void* p = nullptr;
    try {
      p = aligned_host_alloc(bytes);
    } catch (...) {
      std::lock_guard lk(mu_);
      used_ -= rounded;
      throw;
    }
    std::lock_guard lk(mu_);
    sizes_[p] = rounded;
    ranges_[(uintptr_t)p] = rounded;
    forget(p, rounded);  // earlier accesses there were to host memory since freed
    return p;
  }
  void free(void* ptr) override {
    if (!ptr) return;
    // As on a GPU, memory is freed once the work queued so far on every stream is done.
    std::unique_lock lk(mu_);
    for (auto& s : streams_) drain_all(lk, *s);
    auto it = sizes_.find(ptr);
    ZOF_ASSERT(it != sizes_.end());
    used_ -= it->second;
    const uintptr_t lo = (uintptr_t)ptr, hi = lo + it->second;
    sizes_.erase(it);
    ranges_.erase(lo);
    forget(ptr, hi - lo);
    lk.unlock();
    std::free(ptr);
  }
  void* alloc_host_pinned(size_t bytes) override { return aligned_host_alloc(bytes); }
  void* alloc_host_pinned_zeroed(size_t bytes) override {
    return aligned_host_alloc_zeroed(bytes);
  }
  void free_host_pinned(void* ptr) override { std::free(ptr); }
  size_t free_memory() const override {
    std::lock_guard lk(mu_);
    return opt_.budget - used_;
  }

  // ---- streams and events --------------------------------------------------------------------
  Stream* default_stream() override { return reinterpret_cast<Stream*>(def_); }
  Stream* create_stream() override {
    std::lock_guard lk(mu_);
    auto s = std::make_unique<SimStream>();
    s->id = (int)streams_.size();
    s->vc = host_vc_;
    s->vc.resize(s->id + 1, 0);
    SimStream* raw = s.get();
    streams_.push_back(std::move(s));
    raw->worker = std::thread([this, raw] { work(*raw); });
    return reinterpret_cast<Stream*>(raw);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override {
    on_device("copy_to_device (destination)", {W(dst, bytes)});
    on_host("copy_to_device (source)", src, bytes);
    submit_unchecked(s, {W(dst, bytes), R(src, bytes)}, [=] { if (bytes) std::memcpy(dst, src, bytes); },
           bytes, 0);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream* s) override {
    on_device("copy_to_host (source)", {R(src, bytes)});
    on_host("copy_to_host (destination)", dst, bytes);
    submit_unchecked(s, {W(dst, bytes), R(src, bytes)}, [=] { if (bytes) std::memcpy(dst, src, bytes); },
           0, bytes);
  }
  void copy_device(void* dst, const void* src, size_t bytes, Stream* s) override {
    on_device("copy_device", {W(dst, bytes), R(src, bytes)});
    submit_unchecked(s, {W(dst, bytes), R(src, bytes)}, [=] { if (bytes) std::memcpy(dst, src, bytes); });
  }
  void copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t rows, Stream* s) override {
    // The accesses span from the first row's start to the last row's end.
    const int64_t wb = rows ? int64_t((rows - 1) * dpitch + width) : 0;
    const int64_t rb = rows ? int64_t((rows - 1) * spitch + width) : 0;
    submit(s, {W(dst, width ? wb : 0), R(src, width ? rb : 0)}, [=, h = host_.get()] {
      h->copy_device_2d(dst, dpitch, src, spitch, width, rows, nullptr);
    });
  }
  Event* create_event() override {
    std::lock_guard lk(mu_);
    events_.push_back(std::make_unique<SimEvent>());
    return reinterpret_cast<Event*>(events_.back().get());
  }
  void record(Event* e, Stream* sh) override {
    SimStream& s = stream(sh);
    auto m = std::make_shared<Marker>();
    std::unique_lock lk(mu_);
    merge(s.vc, host_vc_);
    m->vc = s.vc;
    reinterpret_cast<SimEvent*>(e)->latest = m;
    if (s.id == 0) {
      drain(lk, s);  // everything before it on the default stream has run
      m->done = true;
      cv_.notify_all();
    } else {
      s.queue.push_back(Task{Task::Record, {}, m});
      cv_.notify_all();
    }
  }
  void wait(Stream* sh, Event* e) override {
    SimStream& s = stream(sh);
    std::lock_guard lk(mu_);
    std::shared_ptr<Marker> m = reinterpret_cast<SimEvent*>(e)->latest;
    if (!m) return;
    merge(s.vc, host_vc_);
    merge(s.vc, m->vc);
    if (s.id == 0) {
      s.pending.push_back(std::move(m));
    } else {
      s.queue.push_back(Task{Task::Wait, {}, std::move(m)});
      cv_.notify_all();
    }
  }
  void synchronize(Stream* sh) override {
    std::unique_lock lk(mu_);
    drain_all(lk, stream(sh));
  }

  // ---- ops: the host backend's math, on the stream ------------------------------------------
  ComputeInfo compute_info() const override {
    ComputeInfo ci = host_->compute_info();
    ci.isa = "simulated device over " + ci.isa;
    return ci;
  }
  void matmul(const float* x, const void* w, DType wt, const float* bias, float* y, int64_t M,
              int64_t N, int64_t K, Stream* s) override {
    submit(s, {R(x, M * K * F), R(w, N * K * (int64_t)dtype_size(wt)), R(bias, N * F),
               W(y, M * N * F)},
           [=, h = host_.get()] { h->matmul(x, w, wt, bias, y, M, N, K, nullptr); });
  }
  void cast(const float* x, void* y, DType yt, int64_t n, Stream* s) override {
    submit(s, {R(x, n * F), W(y, n * (int64_t)dtype_size(yt))},
           [=, h = host_.get()] { h->cast(x, y, yt, n, nullptr); });
  }
  void widen(const void* x, DType xt, float* y, int64_t n, Stream* s) override {
    submit(s, {R(x, n * (int64_t)dtype_size(xt)), W(y, n * F)},
           [=, h = host_.get()] { h->widen(x, xt, y, n, nullptr); });
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset, Stream* s) override {
    submit(s, {R(x, rows * dim * F), R(w, dim * F), W(y, rows * dim * F)},
           [=, h = host_.get()] { h->rms_norm(x, w, y, rows, dim, eps, w_offset, nullptr); });
  }
  void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                  int64_t dim, float eps, Stream* s) override {
    submit(s, {R(x, rows * dim * F), R(w, dim * F), R(b, dim * F), W(y, rows * dim * F)},
           [=, h = host_.get()] { h->layer_norm(x, w, b, y, rows, dim, eps, nullptr); });
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, const float* inv_freq, Stream* s) override {
    submit(s, {W(x, rows * n_heads * head_dim * F), R(pos, rows * 4), R(inv_freq, rotary_dim / 2 * F)},
           [=, h = host_.get()] {
             h->rope(x, pos, rows, n_heads, head_dim, rotary_dim, inv_freq, nullptr);
           });
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                 float softcap, DType t, Stream* s) override {
    submit(s,
           {R(q, B * Tq * H * D * F), R(k, B * Tk * Hkv * D * F), R(v, B * Tk * Hkv * D * F),
            R(key_mask, B * Tk), W(out, B * Tq * H * D * F)},
           [=, h = host_.get()] {
             h->attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window,
                          softcap, t, nullptr);
           });
  }
  void attention_packed(const float* q, const float* k, const float* v, float* out,
                        const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float scale, int64_t window, float softcap, DType t, Stream* s) override {
    if (B <= 0) return;
    // starts is host memory the caller may reuse once this returns: the work keeps a copy.
    auto st = std::make_shared<std::vector<int32_t>>(starts, starts + B + 1);
    const int64_t rows = st->back();
    submit(s,
           {R(q, rows * H * D * F), R(k, rows * Hkv * D * F), R(v, rows * Hkv * D * F),
            W(out, rows * H * D * F)},
           [=, h = host_.get()] {
             h->attention_packed(q, k, v, out, st->data(), B, H, Hkv, D, scale, window, softcap,
                                 t, nullptr);
           });
  }
  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n,
                     Stream* s) override {
    submit(s, {R(gate, n * F), R(up, n * F), W(out, n * F)},
           [=, h = host_.get()] { h->gelu_tanh_mul(gate, up, out, n, nullptr); });
  }
  void mul_scalar(float* x, float a, int64_t n, Stream* s) override {
    submit(s, {W(x, n * F)}, [=, h = host_.get()] { h->mul_scalar(x, a, n, nullptr); });
  }
  void softcap(const float* x, float* y, float cap, int64_t n, Stream* s) override {
    submit(s, {R(x, n * F), W(y, n * F)},
           [=, h = host_.get()] { h->softcap(x, y, cap, n, nullptr); });
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n, Stream* s) override {
    submit(s, {R(gate, n * F), R(up, n * F), W(out, n * F)},
           [=, h = host_.get()] { h->silu_mul(gate, up, out, n, nullptr); });
  }
  void gelu_tanh(float* x, int64_t n, Stream* s) override {
    submit(s, {W(x, n * F)}, [=, h = host_.get()] { h->gelu_tanh(x, n, nullptr); });
  }
  void gelu_erf(float* x, int64_t n, Stream* s) override {
    submit(s, {W(x, n * F)}, [=, h = host_.get()] { h->gelu_erf(x, n, nullptr); });
  }
  void relu(float* x, int64_t n, Stream* s) override {
    submit(s, {W(x, n * F)}, [=, h = host_.get()] { h->relu(x, n, nullptr); });
  }
  void add(float* y, const float* x, int64_t n, Stream* s) override {
    submit(s, {W(y, n * F), R(x, n * F)}, [=, h = host_.get()] { h->add(y, x, n, nullptr); });
  }
  void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                 bool accumulate, Stream* s) override {
    // The table's rows read are data-dependent: only ids and out are tracked (and the table's
    // first row checked for being device memory).
    on_device("embedding (table)", {R(table, dim * F)});
    submit(s, {R(ids, n * 4), W(out, n * dim * F)}, [=, h = host_.get()] {
      h->embedding(ids, table, out, n, dim, accumulate, nullptr);
    });
  }
  void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                     int64_t vocab, Stream* s) override {
    submit(s, {R(logits, rows * vocab * F), R(targets, rows * 4), W(nll, rows * F)},
           [=, h = host_.get()] { h->cross_entropy(logits, targets, nll, rows, vocab, nullptr); });
  }
  void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* round, const ZKey* cur, float eps,
               void* plus, void* minus, DType copy_t, Stream* s) override {
    // The terms and keys are host values the caller may reuse: copied into the task.
    std::vector<ZOUpdateTerm> terms(upd, upd + std::max(n_update, 0));
    const bool has_cur = cur != nullptr, has_round = round != nullptr;
    const ZKey key = has_cur ? *cur : ZKey{}, rkey = has_round ? *round : ZKey{};
    const int64_t cb = n * (int64_t)dtype_size(copy_t);
    const int64_t tb = n * (int64_t)dtype_size(theta.dtype);
    submit(s, {n_update > 0 ? W(theta.p, tb) : R(theta.p, tb), W(plus, cb), W(minus, cb)},
           [=, h = host_.get(), terms = std::move(terms)] {
             h->zo_pass(theta, n, tensor, first, terms.data(), (int)terms.size(), lr_wd,
                        has_round ? &rkey : nullptr, has_cur ? &key : nullptr, eps, plus, minus,
                        copy_t, nullptr);
           });
  }
  void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
               uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
               Stream* s) override {
    // The rows read are data-dependent: theta's first row is checked for being device memory.
    on_device("zo_rows (theta)", {R(theta.p, width * (int64_t)dtype_size(theta.dtype))});
    submit(s, {R(rows, n_rows * 4), W(plus, n_rows * width * F), W(minus, n_rows * width * F)},
           [=, h = host_.get(), key = cur] {
             h->zo_rows(theta, width, rows, n_rows, tensor, key, eps, plus, minus, nullptr);
           });
  }
  void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                       int64_t first, const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                       const ZKey* round, Stream* s) override {
    std::vector<ZOUpdateTerm> terms(upd, upd + std::max(n_update, 0));
    const bool has_round = round != nullptr;
    const ZKey rkey = has_round ? *round : ZKey{};
    submit(s, {W(theta.p, n * (int64_t)dtype_size(theta.dtype)), W(m, n * F), W(v, n * F)},
           [=, h = host_.get(), terms = std::move(terms)] {
             h->zo_update_state(theta, m, v, n, tensor, first, terms.data(), (int)terms.size(), o,
                                has_round ? &rkey : nullptr, nullptr);
           });
  }
  void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                           int64_t v0, float* max, float* sum, float* target, Stream* s) override {
    submit(s,
           {R(logits, rows * n * F), R(targets, rows * 4), W(max, rows * F), W(sum, rows * F),
            W(target, rows * F)},
           [=, h = host_.get()] {
             h->cross_entropy_chunk(logits, targets, rows, n, v0, max, sum, target, nullptr);
           });
  }

  void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first, const ZKey& key,
                             Stream* s) override {
    submit(s, {W(x, n * F)}, [=, h = host_.get()] {
      h->round_bf16_stochastic(x, n, tensor, first, key, nullptr);
    });
  }

  // ---- tangents ------------------------------------------------------------------------------
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, float w_offset, Stream* s) override {
    const int64_t n = rows * dim * F;
    submit(s, {R(x, n), R(dx, n), R(w, dim * F), R(dw, dim * F), W(dy, n)},
           [=, h = host_.get()] {
             h->rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, w_offset, nullptr);
           });
  }
  void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                      const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                      Stream* s) override {
    const int64_t n = rows * dim * F;
    submit(s, {R(x, n), R(dx, n), R(w, dim * F), R(dw, dim * F), R(db, dim * F), W(dy, n)},
           [=, h = host_.get()] {
             h->layer_norm_jvp(x, dx, w, dw, db, dy, rows, dim, eps, nullptr);
           });
  }
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                     int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                     int64_t window, float softcap, Stream* s) override {
    const int64_t nq = B * S * H * D * F, nk = B * S * Hkv * D * F;
    submit(s,
           {R(q, nq), R(dq, nq), R(k, nk), R(dk, nk), R(v, nk), R(dv, nk), R(key_mask, B * S),
            W(dout, nq)},
           [=, h = host_.get()] {
             h->attention_jvp(q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, window,
                              softcap, nullptr);
           });
  }
  void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                         float* dout, int64_t n, Stream* s) override {
    submit(s, {R(gate, n * F), R(dgate, n * F), R(up, n * F), R(dup, n * F), W(dout, n * F)},
           [=, h = host_.get()] {
             h->gelu_tanh_mul_jvp(gate, dgate, up, dup, dout, n, nullptr);
           });
  }
  void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                   Stream* s) override {
    submit(s, {R(x, n * F), R(dx, n * F), W(dy, n * F)},
           [=, h = host_.get()] { h->softcap_jvp(x, dx, dy, cap, n, nullptr); });
  }
  void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                    float* dout, int64_t n, Stream* s) override {
    submit(s, {R(gate, n * F), R(dgate, n * F), R(up, n * F), R(dup, n * F), W(dout, n * F)},
           [=, h = host_.get()] { h->silu_mul_jvp(gate, dgate, up, dup, dout, n, nullptr); });
  }
  void gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    submit(s, {R(x, n * F), R(dx, n * F), W(dy, n * F)},
           [=, h = host_.get()] { h->gelu_tanh_jvp(x, dx, dy, n, nullptr); });
  }
  void gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    submit(s, {R(x, n * F), R(dx, n * F), W(dy, n * F)},
           [=, h = host_.get()] { h->gelu_erf_jvp(x, dx, dy, n, nullptr); });
  }
  void relu_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    submit(s, {R(x, n * F), R(dx, n * F), W(dy, n * F)},
           [=, h = host_.get()] { h->relu_jvp(x, dx, dy, n, nullptr); });
  }
  void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                         float* dnll, int64_t rows, int64_t vocab, Stream* s) override {
    submit(s,
           {R(logits, rows * vocab * F), R(dlogits, rows * vocab * F), R(targets, rows * 4),
            W(dnll, rows * F)},
           [=, h = host_.get()] {
             h->cross_entropy_jvp(logits, dlogits, targets, dnll, rows, vocab, nullptr);
           });
  }

  // ---- statistics ----------------------------------------------------------------------------
  SimDeviceStats stats() const override {
    std::lock_guard lk(mu_);
    SimDeviceStats st = stats_;
    st.budget = opt_.budget;
    st.in_use = used_;
    st.peak = peak_;
    return st;
  }
  void reset_counters() override {
    std::lock_guard lk(mu_);
    const int64_t hazards = stats_.hazards, foreign = stats_.foreign;
    const std::string first = stats_.first_hazard, first_foreign = stats_.first_foreign;
    stats_ = SimDeviceStats{};
    stats_.hazards = hazards;  // hazards and foreign pointers are never forgotten
    stats_.first_hazard = first;
    stats_.foreign = foreign;
    stats_.first_foreign = first_foreign;
    peak_ = used_;
  }

 private:
  SimStream& stream(Stream* s) {
    return s ? *reinterpret_cast<SimStream*>(s) : *def_;
  }

  // Enqueues fn on stream s (runs it now on the default stream) after checking its accesses.
  // An op: its operands must be device memory (named by the calling op in the report).
  void submit(Stream* sh, std::initializer_list<Access> acc, std::function<void()> fn,
              std::source_location where = std::source_location::current()) {
    on_device(where.function_name(), acc);
    submit_unchecked(sh, acc, std::move(fn));
  }
  void submit_unchecked(Stream* sh, std::initializer_list<Access> acc, std::function<void()> fn,
                        uint64_t to_device = 0, uint64_t to_host = 0) {
    SimStream& s = stream(sh);
    std::unique_lock lk(mu_);
    merge(s.vc, host_vc_);
    ++s.vc[s.id];
    if (opt_.check_hazards) check(s, acc);
    if (s.id != 0) {
      s.queue.push_back(Task{Task::Run, std::move(fn), nullptr, to_device, to_host});
      cv_.notify_all();
      return;
    }
    drain(lk, s);
    stats_.bytes_to_device += to_device;
    stats_.bytes_to_host += to_host;
    stats_.copies += (to_device || to_host) ? 1 : 0;
    lk.unlock();
    fn();
  }

  // The default stream honours its queued waits (the host blocks: it is the device here).
  void drain(std::unique_lock<std::mutex>& lk, SimStream& s) {
    if (s.pending.empty()) return;
    const auto t0 = Clock::now();
    bool blocked = false;
    for (auto& m : s.pending)
      if (!m->done) {
        blocked = true;
        cv_.wait(lk, [&] { return m->done; });
      }
    if (blocked) stats_.compute_wait_s += seconds(Clock::now() - t0);
    s.pending.clear();
  }

  // The host waits until everything queued on s has run.
  void drain_all(std::unique_lock<std::mutex>& lk, SimStream& s) {
    if (s.id == 0)
      drain(lk, s);
    else
      cv_.wait(lk, [&] { return s.queue.empty() && !s.busy; });
    merge(host_vc_, s.vc);
  }

  void work(SimStream& s) {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return s.stop || !s.queue.empty(); });
      if (s.queue.empty()) return;  // stopped
      Task t = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
      if (t.kind == Task::Wait) {
        cv_.wait(lk, [&] { return t.marker->done; });
      } else if (t.kind == Task::Record) {
        t.marker->done = true;
      } else {
        const uint64_t bytes = t.to_device + t.to_host;
        lk.unlock();
        const auto t0 = Clock::now();
        t.fn();
        if (bytes && opt_.copy_bandwidth > 0)
          std::this_thread::sleep_until(
              t0 + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>((double)bytes / opt_.copy_bandwidth)));
        const double dt = seconds(Clock::now() - t0);
        lk.lock();
        if (bytes) {
          stats_.bytes_to_device += t.to_device;
          stats_.bytes_to_host += t.to_host;
          stats_.copies += 1;
          stats_.copy_busy_s += dt;
        }
      }
      s.busy = false;
      cv_.notify_all();
    }
  }

  // Whether [p, p + bytes) lies within one live device allocation.
  bool device_range(const void* p, size_t bytes) const {
    const uintptr_t lo = (uintptr_t)p;
    auto it = ranges_.upper_bound(lo);
    if (it == ranges_.begin()) return false;
    --it;
    return lo + bytes <= it->first + it->second;
  }
  void foreign(const std::string& what) {
    if (stats_.foreign++ == 0) stats_.first_foreign = what;
  }
  // The pointer checker: every access of an op (and the device side of a copy) in device memory.
  void on_device(const char* op, std::initializer_list<Access> acc) {
    if (!opt_.check_pointers) return;
    std::lock_guard lk(mu_);
    for (const Access& a : acc)
      if (a.p && !device_range(a.p, std::max<size_t>(a.bytes, 1)))
        foreign(std::string(op) + " was handed " + std::to_string(a.bytes) + " bytes at " +
                std::to_string((uintptr_t)a.p) + " that are not device memory");
  }
  // ... and the host side of a copy outside it (cudaMemcpyAsync's direction would be wrong).
  void on_host(const char* op, const void* p, size_t bytes) {
    if (!opt_.check_pointers || !p || !bytes) return;
    std::lock_guard lk(mu_);
    auto it = ranges_.upper_bound((uintptr_t)p);
    if (it != ranges_.begin() && (uintptr_t)p < std::prev(it)->first + std::prev(it)->second)
      foreign(std::string(op) + " is device memory");
  }

  // Drops the checker's history of [p, p + bytes): memory that changes owner starts fresh.
  void forget(const void* p, size_t bytes) {
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    auto h = history_.lower_bound({lo > max_len_ ? lo - max_len_ : 0, 0, 0, false});
    while (h != history_.end() && std::get<0>(h->first) < hi)
      h = std::get<1>(h->first) > lo ? history_.erase(h) : std::next(h);
  }

  // An access conflicts with an earlier one by another stream (one of them writes, the ranges
  // overlap) unless s's clock shows that stream's access as happened-before. The history keeps,
  // per (stream, range, mode), the latest access: unordered with any earlier one means unordered
  // with the latest. Entries every stream is already ordered after are dropped.
  void check(SimStream& s, std::initializer_list<Access> acc) {
    for (const Access& a : acc) {
      if (a.bytes == 0) continue;
      const uintptr_t lo = (uintptr_t)a.p, hi = lo + a.bytes;
      // Entries are ordered by start; none is longer than max_len_.
      auto h = history_.lower_bound({lo > max_len_ ? lo - max_len_ : 0, 0, 0, false});
      for (; h != history_.end() && std::get<0>(h->first) < hi; ++h) {
        const auto& [hlo, hhi, hs, hw] = h->first;
        const uint64_t seq = h->second;
        if (hs == s.id || hhi <= lo || !(hw || a.write) || at(s.vc, hs) >= seq) continue;
        if (stats_.hazards++ == 0)
          stats_.first_hazard = "stream " + std::to_string(s.id) + (a.write ? " writes " : " reads ") +
                                std::to_string(a.bytes) + " bytes that stream " + std::to_string(hs) +
                                (hw ? " writes" : " reads") + " (its access " + std::to_string(seq) +
                                ") with no event ordering the two";
      }
    }
    for (const Access& a : acc) {
      if (a.bytes == 0) continue;
      const uintptr_t lo = (uintptr_t)a.p;
      history_[{lo, lo + a.bytes, s.id, a.write}] = s.vc[s.id];
      max_len_ = std::max<uintptr_t>(max_len_, a.bytes);
    }
    if (++since_prune_ >= 4096) {
      since_prune_ = 0;
      for (auto h = history_.begin(); h != history_.end();) {
        const int hs = std::get<2>(h->first);
        bool everyone = at(host_vc_, hs) >= h->second;
        if (!everyone) {
          everyone = true;
          for (auto& t : streams_) everyone = everyone && at(t->vc, hs) >= h->second;
        }
        h = everyone ? history_.erase(h) : std::next(h);
      }
    }
  }

  std::unique_ptr<Backend> host_;
  SimDeviceOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t used_ = 0, peak_ = 0;
  std::unordered_map<void*, size_t> sizes_;
  std::map<uintptr_t, size_t> ranges_;  // the same allocations by address (pointer checker)
  std::vector<std::unique_ptr<SimStream>> streams_;  // [0]: the default stream
  SimStream* def_ = nullptr;
  std::vector<std::unique_ptr<SimEvent>> events_;
  std::vector<uint64_t> host_vc_;  // what the host has synchronized with
  // (start, end, stream, writes) -> the stream's clock at its latest such access.
  std::map<std::tuple<uintptr_t, uintptr_t, int, bool>, uint64_t> history_;
  uintptr_t max_len_ = 0;
  int since_prune_ = 0;
  SimDeviceStats stats_;
};

}  // namespace
}  // namespace zof::cpu

namespace zof {
std::unique_ptr<SimDevice> make_sim_device(std::unique_ptr<Backend> host, SimDeviceOptions opt) {
  return std::make_unique<cpu::SimDeviceImpl>(std::move(host), opt);
}
}  // namespace zof
