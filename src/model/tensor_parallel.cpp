// Tensor parallelism of the LLaMA family (zof/tensor_parallel.h): what each rank holds of every
// parameter, the slice and its way back, z of a slice by global element, the parallel
// cross-entropy, and the forward that runs block_graph.h's graphs on a slice with the group's
// exchanges (the all-reduces after o and down, the vocab-parallel gather, the head's loss).
#include "zof/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "model/graph_ops.h"
#include "util/philox.h"
#include "zof/error.h"
#include "zof/loss.h"

namespace zof::tp {

void sum_ordered(Group& g, float* v, int64_t n) {
  const int T = g.size();
  if (T == 1 || n == 0) return;
  std::vector<float> all((size_t)n * T);
  g.all_gather(v, (size_t)n * sizeof(float), all.data());
  for (int64_t i = 0; i < n; ++i) {
    float s = all[(size_t)i];
    for (int r = 1; r < T; ++r) s += all[(size_t)r * n + i];
    v[i] = s;
  }
}

int64_t ParamSplit::numel() const {
  switch (split) {
    case Split::Rows: {
      int64_t n = 0;
      for (const auto& [b, e] : ranges) n += e - b;
      return n * cols;
    }
    case Split::Columns: return rows * (end - begin);
    case Split::Replicated: break;
  }
  return rows * cols;
}

int64_t Plan::global_element(int pi, int64_t j) const {
  const ParamSplit& s = params[(size_t)pi];
  switch (s.split) {
    case Split::Rows: {
      int64_t row = j / s.cols;  // the local row, found among the ranges
      for (const auto& [b, e] : s.ranges) {
        if (row < e - b) return (b + row) * s.cols + j % s.cols;
        row -= e - b;
      }
      ZOF_ASSERT(!"a local element beyond the slice");
      return -1;
    }
    case Split::Columns: {
      const int64_t w = s.end - s.begin;
      return (j / w) * s.cols + s.begin + j % w;
    }
    case Split::Replicated: break;
  }
  return j;
}

namespace {
std::string t_flag(int T) { return "--tensor-parallel " + std::to_string(T); }
bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
int64_t lo(int64_t n, int t, int T) { return n * t / T; }
}  // namespace

void check(const ModelConfig& c, int T) {
  const std::string f = t_flag(T);
  ZOF_CHECK(T >= 1, "--tensor-parallel " + std::to_string(T) + ": must be 1 or more");
  if (T == 1) return;
  ZOF_CHECK(c.arch == Arch::Llama,
            f + ": the " + c.model_type + " family cannot be split yet (tensor parallel covers the "
                "LLaMA family: llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3); use --tensor-parallel 1");
  ZOF_CHECK(!c.o_bias && !c.mlp_bias,
            f + ": the model has biases on o_proj or down_proj (attention_bias/mlp_bias in "
                "config.json), which row-parallel layers do not add yet; use --tensor-parallel 1");
  ZOF_CHECK(c.num_heads % T == 0,
            f + " does not divide num_attention_heads " + std::to_string(c.num_heads) +
                " (config.json); use a T that divides it");
  ZOF_CHECK(c.num_kv_heads % T == 0 || T % c.num_kv_heads == 0,
            f + ": num_key_value_heads " + std::to_string(c.num_kv_heads) +
                " (config.json) is neither a multiple of T nor divides it; use a T that divides it");
  ZOF_CHECK(T <= c.intermediate_size && T <= c.vocab_size,
            f + " is more than intermediate_size " + std::to_string(c.intermediate_size) +
                " or vocab_size " + std::to_string(c.vocab_size) + " (config.json)");
}

Plan plan(const ModelConfig& c, int rank, int T) {
  check(c, T);
  ZOF_ASSERT(rank >= 0 && rank < T);
  Plan p;
  p.rank = rank, p.size = T;
  const int64_t D = c.head_dim, C = c.hidden_size;
  p.head_begin = c.num_heads / T * rank, p.head_end = c.num_heads / T * (rank + 1);
  p.kv_replicated = c.num_kv_heads % T != 0;
  if (p.kv_replicated) {  // T a multiple of the KV heads: the one KV head this rank's q heads use
    p.kv_begin = p.head_begin / (c.num_heads / c.num_kv_heads);
    p.kv_end = p.kv_begin + 1;
  } else {
    p.kv_begin = c.num_kv_heads / T * rank, p.kv_end = c.num_kv_heads / T * (rank + 1);
  }
  p.inter_begin = lo(c.intermediate_size, rank, T), p.inter_end = lo(c.intermediate_size, rank + 1, T);
  p.vocab_begin = lo(c.vocab_size, rank, T), p.vocab_end = lo(c.vocab_size, rank + 1, T);
  p.local = c;
  p.vocab = c.vocab_size;
  p.local.num_heads = p.head_end - p.head_begin;
  p.local.num_kv_heads = p.kv_end - p.kv_begin;
  p.local.intermediate_size = p.inter_end - p.inter_begin;
  p.local.vocab_size = p.vocab_end - p.vocab_begin;

  // Every parameter by its name (the LLaMA family's layout, model.cpp).
  const Model layout = Model::zeros(c, false);  // names and shapes only
  for (const Param& q : layout.params()) {
    ParamSplit s;
    s.rows = q.shape[0];
    s.cols = q.shape.size() > 1 ? q.shape[1] : 1;
    s.width = q.shape.size() > 1 ? q.shape.back() : 0;
    auto rows = [&](int64_t b, int64_t e) { s.split = Split::Rows, s.ranges.push_back({b, e}); };
    auto cols = [&](int64_t b, int64_t e) { s.split = Split::Columns, s.begin = b, s.end = e; };
    const std::string& n = q.name;
    const int64_t Hq = c.num_heads * D, Hk = c.num_kv_heads * D, I = c.intermediate_size;
    if (ends_with(n, "qkv_proj.weight")) {  // Phi-3: q's rows, then k's, then v's
      rows(p.head_begin * D, p.head_end * D);
      rows(Hq + p.kv_begin * D, Hq + p.kv_end * D);
      rows(Hq + Hk + p.kv_begin * D, Hq + Hk + p.kv_end * D);
    } else if (ends_with(n, "gate_up_proj.weight")) {  // Phi-3: gate's rows, then up's
      rows(p.inter_begin, p.inter_end);
      rows(I + p.inter_begin, I + p.inter_end);
    } else if (n == "model.embed_tokens.weight" || n == "lm_head.weight")
      rows(p.vocab_begin, p.vocab_end);
    else if (ends_with(n, "q_proj.weight") || ends_with(n, "q_proj.bias"))
      rows(p.head_begin * D, p.head_end * D);
    else if (ends_with(n, "k_proj.weight") || ends_with(n, "k_proj.bias") ||
             ends_with(n, "v_proj.weight") || ends_with(n, "v_proj.bias"))
      rows(p.kv_begin * D, p.kv_end * D);
    else if (ends_with(n, "o_proj.weight"))
      cols(p.head_begin * D, p.head_end * D);
    else if (ends_with(n, "gate_proj.weight") || ends_with(n, "up_proj.weight") ||
             ends_with(n, "gate_proj.bias") || ends_with(n, "up_proj.bias"))
      rows(p.inter_begin, p.inter_end);
    else if (ends_with(n, "down_proj.weight"))
      cols(p.inter_begin, p.inter_end);
    else {  // norms (C or head_dim): replicated
      ZOF_ASSERT(q.shape.size() == 1 && (s.rows == C || s.rows == D));
      s.begin = 0, s.end = s.rows;
    }
    p.params.push_back(s);
  }
  return p;
}

namespace {
// Copies between the full tensor (fp32) and the slice (local numel), one direction or the other.
void copy_slice(const ParamSplit& s, float* full, float* local, bool to_local) {
  auto mv = [&](float* f, float* l, int64_t n) {
    if (to_local)
      std::memcpy(l, f, (size_t)n * sizeof(float));
    else
      std::memcpy(f, l, (size_t)n * sizeof(float));
  };
  switch (s.split) {
    case Split::Rows:
      for (const auto& [b, e] : s.ranges) {
        mv(full + b * s.cols, local, (e - b) * s.cols);
        local += (e - b) * s.cols;
      }
      return;
    case Split::Columns: {
      const int64_t w = s.end - s.begin;
      for (int64_t r = 0; r < s.rows; ++r) mv(full + r * s.cols + s.begin, local + r * w, w);
      return;
    }
    case Split::Replicated: return mv(full, local, s.rows * s.cols);
  }
}
}  // namespace

Model slice(const Model& full, const Plan& p) {
  ZOF_CHECK(full.storage_dtype() == DType::F32,
            t_flag(p.size) + ": the weights are held in bf16 (--master bf16); tensor parallel "
                             "holds them in fp32 for now; use --master fp32");
  Model m = Model::zeros(p.local);
  ZOF_ASSERT(m.params().size() == full.params().size() && p.params.size() == m.params().size());
  for (size_t i = 0; i < m.params().size(); ++i) {
    Param& l = m.params()[i];
    const Param& f = full.params()[i];
    ZOF_ASSERT(l.name == f.name && l.numel == p.params[i].numel());
    copy_slice(p.params[i], const_cast<float*>(f.data), l.data, true);
  }
  return m;
}

void place(const Plan& p, const float* local_storage, Model& full,
           const std::vector<int>* params) {
  ZOF_ASSERT(full.storage_dtype() == DType::F32);
  const Model layout = Model::zeros(p.local, false);  // where each parameter sits in the slice
  auto one = [&](size_t i) {
    copy_slice(p.params[i], full.params()[i].data,
               const_cast<float*>(local_storage + layout.params()[i].offset), false);
  };
  if (params)
    for (int i : *params) one((size_t)i);
  else
    for (size_t i = 0; i < full.params().size(); ++i) one(i);
}

void gather(const Plan& p, Group& g, const Model& local, Model& full) {
  ZOF_ASSERT(g.size() == p.size && g.rank() == p.rank && full.storage_dtype() == DType::F32);
  const int T = p.size;
  // Slices differ in size (uneven FFN and vocabulary ranges): each is sent padded to the largest.
  std::vector<int64_t> sizes((size_t)T);
  const int64_t mine = local.storage_size();
  g.all_gather(&mine, sizeof(int64_t), sizes.data());
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> padded((size_t)widest, 0.f), all((size_t)(widest * T));
  std::memcpy(padded.data(), local.storage(), (size_t)mine * sizeof(float));
  g.all_gather(padded.data(), padded.size() * sizeof(float), all.data());
  for (int t = 0; t < T; ++t)
    place(plan(full.config(), t, T), all.data() + (size_t)t * (size_t)widest, full);
}

std::vector<ElementRun> element_runs(const Plan& p, int pi) {
  const ParamSplit& s = p.params[(size_t)pi];
  if (s.split == Split::Replicated) return {ElementRun{0, 0, s.numel()}};
  if (s.split == Split::Rows) {
    std::vector<ElementRun> runs;
    int64_t local = 0;
    for (const auto& [b, e] : s.ranges) {
      runs.push_back(ElementRun{local, b * s.cols, (e - b) * s.cols});
      local += (e - b) * s.cols;
    }
    return runs;
  }
  const int64_t w = s.end - s.begin;
  std::vector<ElementRun> runs((size_t)s.rows);
  for (int64_t r = 0; r < s.rows; ++r) runs[(size_t)r] = ElementRun{r * w, r * s.cols + s.begin, w};
  return runs;
}

ZKey param_key(const Plan& p, int pi, const ZKey& key) {
  ZKey k = key;
  k.cols = (uint32_t)p.params[(size_t)pi].width;
  return k;
}

void perturbed_copy(const Plan& p, Backend& be, const Model& local, const ZKey& key, float eps,
                    int sign, float* out, const std::vector<int>* params) {
  ZOF_ASSERT(local.storage_dtype() == DType::F32 && (sign == 1 || sign == -1));
  std::vector<int> all;
  if (!params) {
    for (int pi = 0; pi < (int)local.params().size(); ++pi) all.push_back(pi);
    params = &all;
  }
  for (int pi : *params) {
    const Param& q = local.params()[(size_t)pi];
    float* dst = out + q.offset;
    const ZKey k = param_key(p, pi, key);
    for (const ElementRun& r : element_runs(p, pi))
      be.zo_pass(Theta(q.data + r.local), r.n, (uint32_t)pi, r.global, nullptr, 0, 0.f, &k, eps,
                 sign > 0 ? dst + r.local : nullptr, sign < 0 ? dst + r.local : nullptr,
                 DType::F32);
  }
  be.synchronize(nullptr);
}

void slice_z(const Plan& p, const Model& local, const ZKey& key, int pi, float* out) {
  const int64_t n = local.params()[(size_t)pi].numel;
  const ZKey k = param_key(p, pi, key);
  for (int64_t j = 0; j < n; ++j) out[j] = z_element(k, (uint32_t)pi, (uint64_t)p.global_element(pi, j));
}

void perturb(const Plan& p, Model& local, const ZKey& key, float scale) {
  for (int pi = 0; pi < (int)local.params().size(); ++pi) {
    Param& q = local.params()[(size_t)pi];
    std::vector<float> z((size_t)q.numel);
    slice_z(p, local, key, pi, z.data());
    for (int64_t j = 0; j < q.numel; ++j) q.data[j] = zo_perturbed(q.data[j], z[(size_t)j], scale);
  }
}

void parallel_cross_entropy(Group& g, const float* logits, int64_t rows, int64_t vocab_begin,
                            int64_t vocab_end, const int32_t* targets, float* nll) {
  const int T = g.size();
  const int64_t Vt = vocab_end - vocab_begin;
  // Pass 1: each row's max over this slice, then over the group.
  std::vector<float> mx((size_t)rows), all_mx((size_t)rows * T);
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * Vt;
    float m = l[0];
    for (int64_t j = 1; j < Vt; ++j) m = std::max(m, l[j]);
    mx[(size_t)r] = m;
  }
  g.all_gather(mx.data(), (size_t)rows * sizeof(float), all_mx.data());
  // Pass 2: sum of exp(logit - max) and the target's logit (0 where another rank holds it).
  std::vector<double> part((size_t)rows * 2), all_part((size_t)rows * 2 * T);
  for (int64_t r = 0; r < rows; ++r) {
    double m = all_mx[(size_t)r];
    for (int t = 1; t < T; ++t) m = std::max(m, double(all_mx[(size_t)t * rows + r]));
    mx[(size_t)r] = (float)m;  // a float's max: exact
    const float* l = logits + r * Vt;
    double s = 0;
    for (int64_t j = 0; j < Vt; ++j) s += std::exp(double(l[j]) - m);
    const int32_t y = targets[r];
    part[(size_t)2 * r] = s;
    part[(size_t)2 * r + 1] = y >= vocab_begin && y < vocab_end ? double(l[y - vocab_begin]) : 0.0;
  }
  g.all_gather(part.data(), part.size() * sizeof(double), all_part.data());
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {
      nll[r] = 0.f;
      continue;
    }
    double s = 0, x = 0;
    for (int t = 0; t < T; ++t) {
      s += all_part[(size_t)t * rows * 2 + 2 * r];
      x += all_part[(size_t)t * rows * 2 + 2 * r + 1];  // one rank's logit, zeros elsewhere
    }
    nll[r] = float(double(mx[(size_t)r]) + std::log(s) - x);
  }
}

// ---- the forward on a slice ---------------------------------------------------------------

namespace {
enum Buf { H, XN, Q, K, V, ATT, TMP, FF1, FF2, ACT, LOGITS, ROPE, ROPE_LOCAL, NBUF };
enum IBuf { kIds, kPos, kTargets, kNIBuf };

// A group that counts what this rank hands it.
class Counted final : public Group {
 public:
  Counted(Group& g, uint64_t& bytes) : g_(g), bytes_(bytes) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  void all_gather(const void* in, size_t n, void* out) override {
    bytes_ += (uint64_t)n * (uint64_t)(g_.size() - 1);
    g_.all_gather(in, n, out);
  }

 private:
  Group& g_;
  uint64_t& bytes_;
};
}  // namespace

// The primal ops of the slice: as graph::Primal on the slice's dims, but the row-parallel
// products' outputs (the attention's and the FFN's, kAttOut and kFfnOut) are partial sums,
// all-reduced in rank order; the token table's gather reads only this rank's rows (zeros for
// the others' ids) and is summed likewise (exact: one rank's row plus zeros); the loss is the
// parallel cross-entropy.
class TensorPrimal : public graph::Primal<graph::BackendKernels> {
 public:
  TensorPrimal(graph::BackendKernels& k, const graph::Dims& d, graph::Frame<float>& f,
               TensorForward& tf, Group& g)
      : Primal(k, d, f), tf_(tf), g_(g) {}
  void matmul(graph::Value y, graph::Value x, Weight w, Weight b, int64_t N, int64_t Kd) {
    Primal::matmul(y, x, w, b, N, Kd);
    if (y == graph::kAttOut || y == graph::kFfnOut) reduce(v(y), f_.rows * N);
  }
  void gather(graph::Value y, Weight table, int64_t dim) {
    const int64_t rows = f_.rows, v0 = tf_.plan_.vocab_begin, v1 = tf_.plan_.vocab_end;
    std::vector<int32_t> ids((size_t)rows);
    tf_.be_.copy_to_host(ids.data(), f_.ids, (size_t)rows * sizeof(int32_t), nullptr);
    tf_.be_.synchronize(nullptr);
    std::vector<float> out((size_t)(rows * dim), 0.f), row((size_t)dim);
    const float* t = table.f32();
    for (int64_t r = 0; r < rows; ++r)
      if (ids[(size_t)r] >= v0 && ids[(size_t)r] < v1)
        tf_.be_.copy_to_host(out.data() + r * dim, t + (ids[(size_t)r] - v0) * dim,
                             (size_t)dim * sizeof(float), nullptr);
    tf_.be_.synchronize(nullptr);
    sum_ordered(g_, out.data(), rows * dim);
    tf_.be_.copy_to_device(v(y), out.data(), out.size() * sizeof(float), nullptr);
    tf_.be_.synchronize(nullptr);
  }
  void cross_entropy(graph::Value nll, graph::Value logits) {
    const int64_t rows = f_.rows, Vt = d_.V;
    std::vector<float> l((size_t)(rows * Vt)), out((size_t)rows);
    std::vector<int32_t> tg((size_t)rows);
    tf_.be_.copy_to_host(l.data(), v(logits), l.size() * sizeof(float), nullptr);
    tf_.be_.copy_to_host(tg.data(), f_.targets, tg.size() * sizeof(int32_t), nullptr);
    tf_.be_.synchronize(nullptr);
    parallel_cross_entropy(g_, l.data(), rows, tf_.plan_.vocab_begin, tf_.plan_.vocab_end,
                           tg.data(), out.data());
    tf_.be_.copy_to_device(v(nll), out.data(), out.size() * sizeof(float), nullptr);
    tf_.be_.synchronize(nullptr);
  }

 private:
  void reduce(float* p, int64_t n) {
    if (g_.size() == 1) return;
    std::vector<float> h((size_t)n);
    tf_.be_.copy_to_host(h.data(), p, (size_t)n * sizeof(float), nullptr);
    tf_.be_.synchronize(nullptr);
    sum_ordered(g_, h.data(), n);
    tf_.be_.copy_to_device(p, h.data(), (size_t)n * sizeof(float), nullptr);
    tf_.be_.synchronize(nullptr);
  }
  TensorForward& tf_;
  Group& g_;
};

TensorForward::TensorForward(const Model& local, const Plan& p, Backend& be, Group& g,
                             int64_t max_rows)
    : local_(local), plan_(p), be_(be), g_(g), max_rows_(max_rows) {
  ZOF_ASSERT(g.size() == p.size && g.rank() == p.rank);
  const ModelConfig& c = p.local;
  const int64_t C = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_heads * D, Hk = c.num_kv_heads * D, I = c.intermediate_size;
  const int64_t R = max_rows;
  const int64_t sizes[NBUF] = {R * C, R * C, R * Hq, R * Hk, R * Hk, R * Hq, R * C,
                               R * I, R * I, R * I, R * c.vocab_size,
                               std::max<int64_t>(1, (int64_t)c.rope_inv_freq.size()),
                               std::max<int64_t>(1, (int64_t)c.rope_local_inv_freq.size())};
  try {
    for (int i = 0; i < NBUF; ++i) bufs_.push_back((float*)be_.alloc(sizes[i] * sizeof(float)));
    for (int i = 0; i < kNIBuf; ++i) ibufs_.push_back((int32_t*)be_.alloc(R * sizeof(int32_t)));
    mask_ = (uint8_t*)be_.alloc((size_t)R);
  } catch (...) {
    for (float* q : bufs_) be_.free(q);
    for (int32_t* q : ibufs_) be_.free(q);
    throw;
  }
  if (!c.rope_inv_freq.empty())
    be_.copy_to_device(bufs_[ROPE], c.rope_inv_freq.data(), c.rope_inv_freq.size() * sizeof(float),
                       nullptr);
  if (!c.rope_local_inv_freq.empty())
    be_.copy_to_device(bufs_[ROPE_LOCAL], c.rope_local_inv_freq.data(),
                       c.rope_local_inv_freq.size() * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

TensorForward::~TensorForward() {
  for (float* q : bufs_) be_.free(q);
  for (int32_t* q : ibufs_) be_.free(q);
  be_.free(mask_);
}

void TensorForward::hidden(const Batch& b) {
  const ModelConfig& c = plan_.local;
  check_batch_layout(b);
  const int64_t rows = b.rows();
  ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) +
                                   " tokens exceeds this forward's capacity of " +
                                   std::to_string(max_rows_));
  ZOF_CHECK(b.T <= c.max_position, "a sequence of " + std::to_string(b.T) +
                                       " tokens is beyond the model's context");
  for (int64_t i = 0; i < rows; ++i)  // a rank holds only its ids' rows: check against all
    ZOF_CHECK(b.ids[(size_t)i] >= 0 && b.ids[(size_t)i] < plan_.vocab,
              "token id " + std::to_string(b.ids[(size_t)i]) +
                  " is outside the model's vocabulary of " + std::to_string(plan_.vocab));
  std::vector<int32_t> pos((size_t)rows);
  std::vector<uint8_t> mask((size_t)rows);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t < (b.packed() ? b.lengths[(size_t)i] : b.T); ++t) {
      pos[(size_t)b.row(i, t)] = (int32_t)t;
      mask[(size_t)b.row(i, t)] = t < b.lengths[(size_t)i];
    }
  be_.copy_to_device(ibufs_[kIds], b.ids.data(), (size_t)rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibufs_[kPos], pos.data(), (size_t)rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(mask_, mask.data(), (size_t)rows, nullptr);
  be_.synchronize(nullptr);

  Counted counted(g_, bytes_);
  graph::BackendKernels k{be_};
  float* const* B = bufs_.data();
  if (!embed_) {  // a later pipeline stage: the previous stage's output
    std::vector<float> h((size_t)(rows * c.hidden_size));
    recv_(h.data(), (int64_t)h.size());
    be_.copy_to_device(B[H], h.data(), h.size() * sizeof(float), nullptr);
    be_.synchronize(nullptr);
  } else {  // the embedding
    const graph::Dims d = graph::Dims::of(c);
    graph::Frame<float> f;
    f.v[graph::kHOut] = B[H];
    f.rows = rows, f.ids = ibufs_[kIds];
    TensorPrimal o(k, d, f, *this, counted);
    graph::embed(o, d, local_.embed());
  }
  const int hi = layer_hi_ < 0 ? (int)c.num_layers : layer_hi_;
  for (int li = layer_lo_; li < hi; ++li) {
    const graph::Dims d = graph::Dims::of(c, li);
    graph::Frame<float> f;
    using namespace graph;
    f.set({kHIn, kH1, kH2, kHOut}, B[H]);
    f.v[kXn1] = B[XN];
    f.v[kX2] = B[XN];
    f.v[kQ] = f.v[kQp] = B[Q], f.v[kK] = f.v[kKp] = B[K], f.v[kV] = B[V], f.v[kAtt] = B[ATT];
    f.set({kAttOut, kFfnOut, kAttN, kFfnN}, B[TMP]);
    f.v[kF1] = B[FF1], f.v[kF2] = B[FF2], f.v[kAct] = B[ACT];
    f.rows = rows, f.B = b.B, f.S = b.T, f.pos = ibufs_[kPos];
    f.key_mask = b.packed() ? nullptr : mask_;
    f.starts = b.packed() ? b.starts.data() : nullptr;
    f.inv_freq = B[ROPE], f.inv_freq_local = B[ROPE_LOCAL];
    TensorPrimal o(k, d, f, *this, counted);
    graph::layer(o, d, local_.layer(li));
  }
}

void TensorForward::set_stage(int first, int last, Recv recv, Send send) {
  const int L = (int)plan_.local.num_layers;
  ZOF_ASSERT(0 <= first && first <= last && last <= L + 1);
  embed_ = first == 0;
  head_ = last == L + 1;
  layer_lo_ = std::max(first, 1) - 1;
  layer_hi_ = std::min(last, L);
  ZOF_ASSERT((embed_ || recv) && (head_ || send));
  recv_ = std::move(recv);
  send_ = std::move(send);
}

void TensorForward::local_logits(const Batch& b, std::vector<float>& out) {
  ZOF_ASSERT(embed_ && head_);  // the whole model's walk
  hidden(b);
  const int64_t rows = b.rows(), Vt = plan_.local.vocab_size;
  Counted counted(g_, bytes_);
  graph::BackendKernels k{be_};
  const graph::Dims d = graph::Dims::of(plan_.local);
  graph::Frame<float> f;
  f.rows = rows;
  f.v[graph::kHIn] = bufs_[H];
  f.v[graph::kHn] = bufs_[XN];
  f.set({graph::kLogitsRaw, graph::kLogits}, bufs_[LOGITS]);
  TensorPrimal o(k, d, f, *this, counted);
  graph::head_logits(o, d, local_.head());
  out.resize((size_t)(rows * Vt));
  be_.copy_to_host(out.data(), bufs_[LOGITS], out.size() * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

void TensorForward::logits(const Batch& b, std::vector<float>& out) {
  std::vector<float> mine;
  local_logits(b, mine);
  // Slices differ in width by one at most: each is gathered padded to the widest.
  const int T = plan_.size;
  const int64_t rows = b.rows(), Vfull = plan_.vocab, Vt = plan_.local.vocab_size;
  std::vector<int64_t> begin((size_t)T + 1);
  for (int t = 0; t <= T; ++t) begin[(size_t)t] = lo(Vfull, t, T);
  int64_t widest = 0;
  for (int t = 0; t < T; ++t) widest = std::max(widest, begin[(size_t)t + 1] - begin[(size_t)t]);
  Counted counted(g_, bytes_);
  std::vector<float> padded((size_t)(rows * widest), 0.f), all((size_t)(rows * widest * T));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(mine.begin() + r * Vt, mine.begin() + (r + 1) * Vt, padded.begin() + r * widest);
  counted.all_gather(padded.data(), padded.size() * sizeof(float), all.data());
  out.assign((size_t)(rows * Vfull), 0.f);
  for (int t = 0; t < T; ++t) {
    const int64_t w = begin[(size_t)t + 1] - begin[(size_t)t];
    for (int64_t r = 0; r < rows; ++r)
      std::copy(all.begin() + (t * rows + r) * widest, all.begin() + (t * rows + r) * widest + w,
                out.begin() + r * Vfull + begin[(size_t)t]);
  }
}

void TensorForward::nll(const Batch& b, const int32_t* targets, float* nll) {
  const int64_t rows = b.rows();
  std::vector<int32_t> sel, tg;
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] >= 0) sel.push_back((int32_t)r), tg.push_back(targets[r]);
  std::vector<float> out(sel.size());
  nll_at(b, sel.data(), tg.data(), (int64_t)sel.size(), out.data());
  std::fill(nll, nll + rows, 0.f);
  for (size_t i = 0; i < sel.size(); ++i) nll[sel[i]] = out[i];
}

void TensorForward::nll_at(const Batch& b, const int32_t* sel, const int32_t* targets, int64_t n,
                           float* nll) {
  hidden(b);
  const int64_t rows = b.rows(), C = plan_.local.hidden_size;
  std::vector<float> h((size_t)(rows * C));
  be_.copy_to_host(h.data(), bufs_[H], h.size() * sizeof(float), nullptr);
  be_.synchronize(nullptr);
  if (!head_) {  // the next stage goes on from here
    send_(h.data(), (int64_t)h.size());
    std::fill(nll, nll + n, 0.f);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    ZOF_CHECK(sel[i] >= 0 && sel[i] < rows && targets[i] >= 0 && targets[i] < plan_.vocab,
              "pair " + std::to_string(i) + " (position " + std::to_string(sel[i]) +
                  ", target " + std::to_string(targets[i]) + ") is outside the batch of " +
                  std::to_string(rows) + " positions or the vocabulary of " +
                  std::to_string(plan_.vocab));
  // The pairs' rows gathered on the host, at most `rows` at a time (the buffers' capacity).
  Counted counted(g_, bytes_);
  graph::BackendKernels k{be_};
  const graph::Dims d = graph::Dims::of(plan_.local);
  std::vector<float> g;
  for (int64_t s0 = 0; s0 < n; s0 += rows) {
    const int64_t used = std::min(rows, n - s0);
    // A lone pair runs twice where the buffers hold two rows: a product of one row is the
    // backends' decoding path (Backend::matmul), and a replica must score it as the whole batch.
    const int64_t m = used == 1 && rows >= 2 ? 2 : used;
    g.resize((size_t)(m * C));
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(h.begin() + (int64_t)sel[s0 + std::min(i, used - 1)] * C, C, g.begin() + i * C);
    const int32_t tg2[2] = {targets[s0], targets[s0]};
    be_.copy_to_device(bufs_[H], g.data(), g.size() * sizeof(float), nullptr);
    be_.copy_to_device(ibufs_[kTargets], m > used ? tg2 : targets + s0,
                       (size_t)m * sizeof(int32_t), nullptr);
    be_.synchronize(nullptr);
    graph::Frame<float> f;
    f.rows = m, f.targets = ibufs_[kTargets];
    f.v[graph::kHIn] = bufs_[H];
    f.v[graph::kHn] = bufs_[XN];
    f.set({graph::kLogitsRaw, graph::kLogits}, bufs_[LOGITS]);
    f.v[graph::kNll] = bufs_[TMP];
    TensorPrimal o(k, d, f, *this, counted);
    graph::head_loss(o, d, local_.head());
    be_.copy_to_host(nll + s0, bufs_[TMP], (size_t)used * sizeof(float), nullptr);
    be_.synchronize(nullptr);
  }
}

void TensorForward::next_token_nll(const Batch& b, std::vector<float>& out) {
  std::vector<int32_t> targets((size_t)b.rows(), -1);
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t + 1 < b.lengths[(size_t)r]; ++t)
      targets[(size_t)b.row(r, t)] = b.ids[(size_t)b.row(r, t + 1)];
  out.resize((size_t)b.rows());
  nll(b, targets.data(), out.data());
}

}  // namespace zof::tp
