// `zof eval` and `zof generate` over strings: tokenization, documents, and the JSON results the
// CLI prints and the Python module returns.
#include "zof/text.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "zof/data.h"
#include "zof/disk_tier.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/input_file.h"
#include "zof/perplexity.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/tensor_parallel.h"
#include "zof/trainer.h"

using json = nlohmann::json;

namespace zof {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A Forward over the backend and, on a device, the streamer it reads the weights from: the
// forward's buffers first, then the blocks within what the budget leaves.
struct Placed {
  std::unique_ptr<Forward> fwd;
  std::unique_ptr<BlockStreamer> weights;
  const DiskTier* disk = nullptr;
  json describe(const Backend& be) const {
    json j{{"device", be.name()},
           {"dtype", compute_dtype_word(fwd->compute())},
           {"compute", be.compute_info().isa}};
    if (disk)
      j["disk_tier"] = json{{"describe", disk->describe()},
                            {"bytes_read", disk->stats().bytes_read},
                            {"ring_peak_bytes", disk->stats().ring_peak}};
    if (weights)
      j["streaming"] = json{{"describe", weights->describe()},
                            {"device_bytes", weights->device_bytes()},
                            {"bytes_uploaded", weights->stats().bytes_uploaded}};
    return j;
  }
};

// cache_bytes: what the caller allocates on the device after this (generation's KV cache), kept
// out of the streamer's share.
Placed place_forward(const Model& model, Backend& be, int64_t rows, const WeightPlacement& p,
                     size_t cache_bytes = 0) {
  Placed out;
  const size_t free0 = be.free_memory();
  out.fwd = std::make_unique<Forward>(model, be, rows);
  out.fwd->set_compute(p.compute);
  if (p.host) {  // the blocks beyond --host-mem read from disk as the walk reaches them
    out.fwd->set_host_blocks(p.host);
    out.disk = dynamic_cast<const DiskTier*>(p.host);
  }
  if (!p.stream) return out;
  const size_t free1 = be.free_memory();
  // With bf16 products, each streamed block is converted into scratch the forward allocates.
  const size_t buffers = (free0 > free1 ? free0 - free1 : 0) + out.fwd->streamed_compute_bytes();
  // No --gpu-mem: what the device has free, less the engine's margin (ZOEngine::enable_streaming).
  const size_t margin = p.budget > 0 ? 0 : std::max<size_t>(size_t(256) << 20, free1 / 50);
  const size_t taken = buffers + cache_bytes;
  // Without a budget, what is free now less what is allocated later (the cache, the scratch).
  const size_t later = margin + cache_bytes + out.fwd->streamed_compute_bytes();
  const size_t blocks = p.budget > 0 ? (p.budget > taken ? p.budget - taken : 0)
                                     : (free1 > later ? free1 - later : 0);
  const size_t need = BlockStreamer::min_bytes(model);
  ZOF_CHECK(blocks >= need,
            "--gpu-mem " + format_bytes(p.budget > 0 ? p.budget : free1) +
                " leaves " + format_bytes(blocks) + " for the weights after " +
                format_bytes(buffers) + " of activation buffers" +
                (cache_bytes ? " and " + format_bytes(cache_bytes) + " of KV cache" : "") +
                ", below the " + format_bytes(need) +
                " (two slots of the largest block) that streaming needs; raise --gpu-mem, or "
                "lower --batch or --seq-len");
  // The streamer only reads the weights here (every release is clean): the host master is
  // never written.
  out.weights = std::make_unique<BlockStreamer>(const_cast<Model&>(model), be, blocks);
  out.fwd->set_weights(out.weights.get());
  return out;
}

const struct {
  const char* flag;
  NumberRule rule;
} kTextRules[] = {
    {"--max-new-tokens", {.whole = true, .lo = 1, .hi = double(int64_t(1) << 20)}},
    {"--temperature", {.lo = 0, .hi = 100, .note = "0: greedy"}},
    {"--top-p", {.lo = 0, .hi = 1, .lo_open = true, .note = "the probability mass sampled from"}},
    {"--seq-len", {.whole = true, .lo = 2, .hi = double(int64_t(1) << 20)}},
    {"--batch", {.whole = true, .lo = 1, .hi = 4096}},
    {"--max-windows", {.whole = true, .lo = 0, .note = "0: all"}},
    {"--tensor-parallel", {.whole = true, .lo = 1, .hi = 4096}},
};

}  // namespace

const NumberRule* text_flag_rule(const std::string& flag) {
  for (const auto& r : kTextRules)
    if (flag == r.flag) return &r.rule;
  return nullptr;
}

std::string read_eval_text(const std::string& path) {
  const std::string want = "--text takes one plain-text file";
  ZOF_CHECK(!path.empty(), "--text is empty; " + want);
  // The whole file is held in memory: no limit beyond the memory's (1 TiB, far past it).
  return read_input_file("--text " + path, path, want, uint64_t(1) << 40);
}

namespace {
// The documents of text, "<|endoftext|>" separating them (TinyStories, GPT-2 style corpora):
// each encoded alone and scored from its own BOS, as the model saw documents in training.
std::vector<std::vector<int32_t>> documents_of(const Tokenizer& tok, const std::string& text,
                                               const std::string& source) {
  ZOF_CHECK(!text.empty(), source + " is empty");
  std::vector<std::vector<int32_t>> docs;
  const std::string sep = "<|endoftext|>";
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find(sep, pos);
    if (end == std::string::npos) end = text.size();
    std::string doc = text.substr(pos, end - pos);
    if (doc.find_first_not_of(" \t\r\n") != std::string::npos) {
      const size_t a = doc.find_first_not_of(" \t\r\n"), b = doc.find_last_not_of(" \t\r\n");
      docs.push_back(tok.encode(doc.substr(a, b - a + 1), false));
    }
    pos = end + sep.size();
  }
  ZOF_CHECK(!docs.empty(), source + " holds no text");
  return docs;
}

// eval's window length (seq_len_arg 0: the context, at most 512), its numbers checked.
int64_t eval_seq_len(const Model& model, int64_t seq_len_arg, int64_t batch, int64_t max_windows) {
  const int64_t ctx = model.config().max_position;
  const int64_t seq_len = seq_len_arg > 0 ? seq_len_arg : std::min<int64_t>(ctx, 512);
  ZOF_CHECK(seq_len >= 2, "--seq-len must be at least 2");
  ZOF_CHECK(seq_len <= ctx, "--seq-len " + std::to_string(seq_len) +
                                " exceeds the model's context of " + std::to_string(ctx) +
                                " tokens; use --seq-len " + std::to_string(ctx) + " or less");
  ZOF_CHECK(batch >= 1, "--batch must be at least 1");
  ZOF_CHECK(max_windows >= 0, "--max-windows must be 0 (all) or more");
  return seq_len;
}

}  // namespace

namespace {

// `zof eval --json`'s perplexity fields, for one process or a tensor group.
json perplexity_json(const PerplexityResult& r, int64_t seq_len, double tokenize_s, double eval_s) {
  return json{{"nll", r.nll},
              {"ppl", r.ppl},
              {"tokens", r.tokens},
              {"windows", r.windows},
              {"seq_len", seq_len},
              {"tokenize_s", tokenize_s},
              {"eval_s", eval_s},
              {"tokens_per_s", r.tokens / std::max(eval_s, 1e-9)}};
}

}  // namespace

json evaluate_text(const Model& model, const Tokenizer& tok, Backend& backend,
                   const std::string& text, const std::string& source, int64_t seq_len_arg,
                   int64_t batch, int64_t max_windows, const WeightPlacement& place) {
  const double t0 = now_s();
  const std::vector<std::vector<int32_t>> docs = documents_of(tok, text, source);
  const double t_tok = now_s() - t0;
  const int64_t seq_len = eval_seq_len(model, seq_len_arg, batch, max_windows);
  Placed p = place_forward(model, backend, seq_len * batch, place);
  const double t1 = now_s();
  auto r = perplexity(*p.fwd, docs, tok.bos_id(), seq_len, batch, max_windows);
  const double dt = now_s() - t1;
  json j = perplexity_json(r, seq_len, t_tok, dt);
  j.update(p.describe(backend));
  return j;
}

json evaluate_task(const Model& model, const Tokenizer& tok, Backend& backend,
                   const TrainOptions& opt, const WeightPlacement& place) {
  check_task_data(opt.task, opt.data);
  std::unique_ptr<TrainData> data = make_train_data(opt, tok, model.config().max_position);
  Placed p = place_forward(model, backend, data->max_rows(), place);
  const double t0 = now_s();
  const TrainData::Metric m = data->evaluate(*p.fwd);
  const double dt = now_s() - t0;
  json j{{"task", word(opt.task)},
         {"metric", m.name},
         {"value", m.value},
         {"data", data->describe()},
         {"eval_s", dt}};
  j.update(p.describe(backend));
  return j;
}

json evaluate_text_tensor_parallel(const Model& model, const Tokenizer& tok, Backend& backend,
                                   const std::string& text, const std::string& source,
                                   int64_t seq_len_arg, int64_t batch, int64_t max_windows,
                                   dist::Communicator& world, int tensor) {
  tp::check(model.config(), tensor);
  const dist::Grid grid = dist::Grid::make(world.size(), 1, tensor);
  ZOF_CHECK(grid.replicas == 1,
            "--tensor-parallel " + std::to_string(tensor) + " with " +
                std::to_string(world.size()) + " ranks: zof eval runs one tensor group; start "
                "mpirun -np " + std::to_string(tensor));
  const int me = grid.tensor_rank(world.rank());
  const double t0 = now_s();
  const std::vector<std::vector<int32_t>> docs = documents_of(tok, text, source);
  const double t_tok = now_s() - t0;
  const int64_t seq_len = eval_seq_len(model, seq_len_arg, batch, max_windows);
  const tp::Plan plan = tp::plan(model.config(), me, tensor);
  const Model local = tp::slice(model, plan);
  const std::unique_ptr<tp::Group> g = make_tensor_group(world, grid);
  tp::TensorForward fwd(local, plan, backend, *g, seq_len * batch);
  const uint64_t sent0 = world.bytes_sent();
  const double t1 = now_s();
  auto r = perplexity([&fwd](const Batch& b, std::vector<float>& nll) { fwd.next_token_nll(b, nll); },
                      docs, tok.bos_id(), seq_len, batch, max_windows);
  const double dt = now_s() - t1;
  json j = perplexity_json(r, seq_len, t_tok, dt);
  j.update(json{{"device", backend.name()},
                {"tensor_parallel", tensor},
                {"exchanged_bytes_per_rank", fwd.bytes_exchanged()},
                {"sent_bytes", world.bytes_sent() - sent0}});
  return j;
}

json generate_text(const Model& model, const Tokenizer& tok, Backend& backend,
                   const std::string& prompt_text, SampleOptions opt,
                   const std::function<void(const std::string&)>& on_text,
                   const WeightPlacement& place) {
  std::vector<int32_t> prompt = tok.encode(prompt_text, true);
  if (prompt.empty()) {
    const int32_t start = tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id();
    ZOF_CHECK(start >= 0, "the prompt is empty and the tokenizer in " + model.source() +
                              " has neither a BOS nor an EOS token to start from; give --prompt");
    prompt.push_back(start);
  }
  opt.eos_id = tok.eos_id();
  // The KV cache generate() allocates: every layer's keys and values for the whole text.
  const ModelConfig& cfg = model.config();
  // Every new token but the last is read back at the next position: at most context - prompt
  // + 1 fit (a prompt that fills the context is refused by generate()). More would be cut short.
  const int64_t room = cfg.max_position - (int64_t)prompt.size() + 1;
  if (opt.max_new_is_default && room >= 1) opt.max_new_tokens = std::min(opt.max_new_tokens, room);
  ZOF_CHECK(room <= 1 || opt.max_new_tokens <= room,
            "--max-new-tokens " + std::to_string(opt.max_new_tokens) + " does not fit: the " +
                "prompt's " + std::to_string(prompt.size()) + " token(s) and the new tokens " +
                "exceed the model's context of " + std::to_string(cfg.max_position) +
                " tokens (max_position_embeddings in " + model.source() +
                "/config.json); use --max-new-tokens " + std::to_string(room) + " or less");
  const int64_t positions =
      std::min<int64_t>(cfg.max_position, (int64_t)prompt.size() + opt.max_new_tokens);
  const size_t cache = (size_t)cfg.num_layers * 2 * (size_t)positions *
                       (size_t)(cfg.num_kv_heads * cfg.head_dim) * sizeof(float);
  Placed p = place_forward(model, backend, std::max<int64_t>((int64_t)prompt.size(), 1), place,
                           cache);
  Forward& fwd = *p.fwd;
  std::vector<int32_t> all = prompt;
  std::string printed = tok.decode(prompt, true);
  if (on_text) on_text(printed);
  const double t0 = now_s();
  auto out = generate(fwd, prompt, opt, [&](int32_t t) {
    all.push_back(t);
    if (!on_text) return;
    // Decode the whole text each time so multi-token characters show once complete.
    std::string text = tok.decode(all, true);
    if (text.size() >= printed.size() && text.compare(0, printed.size(), printed) == 0) {
      printed = text;
      on_text(printed);
    }
  });
  const double dt = now_s() - t0;
  json j{{"prompt", prompt_text},
              {"completion", tok.decode(out, true)},
              {"text", tok.decode(all, true)},
              {"new_tokens", out.size()},
              {"ids", out},
              {"tokens_per_s", out.size() / std::max(dt, 1e-9)}};
  j.update(p.describe(backend));
  return j;
}

std::unique_ptr<TextWeights> lay_out_text_weights(const std::string& dir, uint64_t host_mem,
                                                  const std::string& flag) {
  auto w = std::make_unique<TextWeights>(
      TextWeights{host_mem > 0 ? Model::load_unread(dir, DType::F32) : Model::load(dir), nullptr});
  if (host_mem > 0) {
    const uint64_t least = DiskTier::min_bytes(w->model, 1, DiskTier::kept_blocks(w->model));
    ZOF_CHECK(host_mem >= least,
              flag + " " + format_bytes(host_mem) + " is below this model's least of " +
                  std::to_string(least) + " bytes (" + format_bytes(least) +
                  ": the block of a tied LM head, which stays resident, and two blocks in "
                  "flight from disk); raise " + flag);
  }
  return w;
}

void read_text_weights(TextWeights& w, const std::string& dir, uint64_t host_mem,
                       const std::string& offload_dir, const std::string& dir_flag,
                       WeightPlacement& place) {
  if (host_mem == 0) return;
  // Evaluation and generation only read: no block is written behind, two slots suffice.
  const DiskTierPlan plan =
      DiskTier::plan(w.model, 1, host_mem, DiskTier::kept_blocks(w.model), /*writes_back=*/false);
  if (!plan.all_resident()) {
    const std::filesystem::path off =
        offload_dir.empty() ? std::filesystem::path(".") : std::filesystem::path(offload_dir);
    std::error_code ec;
    ZOF_CHECK(std::filesystem::is_directory(off, ec),
              dir_flag + " " + off.string() + " is not a directory: create it (on a local "
              "file system with " + std::to_string(plan.store_bytes) + " bytes free), or give "
              "another");
    w.tier = std::make_unique<DiskTier>(w.model, std::vector<float*>{}, plan, off, 2, true,
                                        /*unwritten=*/true);
  }
  w.model.read_weights(dir, w.tier.get());
  place.host = w.tier.get();
}

}  // namespace zof
