// The CLI's text commands as library calls, shared by the CLI (tools/) and the Python module:
// `zof eval` (perplexity over a text's documents) and `zof generate` (from a prompt string).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/disk_tier.h"
#include "zof/dist.h"
#include "zof/generate.h"
#include "zof/options.h"
#include "zof/model.h"
#include "zof/number_rule.h"
#include "zof/tokenizer.h"

namespace zof {

// Where eval and generate read the weights: the model's storage (a host backend, the default),
// or, on a device (--device cuda, --sim-device), blocks streamed through it from the model's
// storage within `budget` bytes of device memory in all (the forward's buffers included; 0:
// what the device has free), every block resident when they fit: a model larger than the
// device is evaluated and sampled from as the ZO walk streams it.
// compute: the type of the matrix products (Forward::set_compute; --dtype resolved).
struct WeightPlacement {
  bool stream = false;
  uint64_t budget = 0;
  DType compute = DType::F32;
  // A disk tier that holds the model's blocks beyond --host-mem (zof/disk_tier.h; null: the
  // model is whole in RAM): the forward acquires each block through it as it walks.
  BlockAccess* host = nullptr;
};

// The model eval and generate read, with the blocks beyond a host-memory budget in a scratch
// disk tier (zof/disk_tier.h: a model larger than RAM). The model must not move while the tier
// lives: both are held here, the tier going first.
struct TextWeights {
  Model model;
  std::unique_ptr<DiskTier> tier;
};
// The model of directory dir (checked as --model by the caller): loaded whole with host_mem 0,
// else laid out only (its weights read by read_text_weights) after a check that host_mem (the
// bytes of `flag`, --host-mem or the Python keyword) holds the model's least: zof::Error
// naming the flag and the least.
std::unique_ptr<TextWeights> lay_out_text_weights(const std::string& dir, uint64_t host_mem,
                                                  const std::string& flag);
// With host_mem: the blocks beyond it go into a disk tier in offload_dir ("": the current
// directory; zof::Error naming `dir_flag` where it is no directory) as the weights are read
// from dir, the rest stay in RAM; place.host is the tier (null where every block fits).
void read_text_weights(TextWeights& w, const std::string& dir, uint64_t host_mem,
                       const std::string& offload_dir, const std::string& dir_flag,
                       WeightPlacement& place);

// What the numbers of `zof eval` and `zof generate` accept (--seq-len and --batch as eval takes
// them, --max-windows, --max-new-tokens, --temperature, --top-p): one rule each for the CLI and
// Python alike. Null for any other flag.
const NumberRule* text_flag_rule(const std::string& flag);

// The text `zof eval --text PATH` scores: a regular file (never a FIFO, a device or a directory:
// zof::Error saying what the path is) read whole.
std::string read_eval_text(const std::string& path);

// Perplexity of text, documents separated by "<|endoftext|>" (each encoded alone and scored
// from its own BOS). seq_len 0: the context, at most 512. source names the text in errors
// ("--text FILE"). Returns `zof eval --json`'s object: nll, ppl, tokens, windows, seq_len,
// tokenize_s, eval_s, tokens_per_s, device (and streaming, when the weights streamed).
nlohmann::json evaluate_text(const Model& model, const Tokenizer& tok, Backend& backend,
                             const std::string& text, const std::string& source, int64_t seq_len,
                             int64_t batch, int64_t max_windows,
                             const WeightPlacement& place = {});

// A task's held-out metric (`zof eval --task`): opt's task, data, eval_examples, seed, seq_len,
// batch and micro_batches read as finetune reads them, so the examples, their batches and the
// metric are exactly those of a run's evaluation with the same options (its "before", or its
// "after" on the saved model). Returns `zof eval --json`'s object: task, metric, value,
// data (what was read), eval_s, examples_per_s, device.
nlohmann::json evaluate_task(const Model& model, const Tokenizer& tok, Backend& backend,
                             const TrainOptions& opt, const WeightPlacement& place = {});

// evaluate_text on T ranks of one tensor group (zof/tensor_parallel.h): every rank of world
// calls it with the same arguments and the whole model, holds its slice, and gets the same
// object (plus tensor_parallel, exchanged_bytes_per_rank: what this rank handed the group, and
// sent_bytes: what it sent through world). zof::Error for a model tensor parallel refuses, or
// unless world has exactly T ranks. fp32, host backends.
nlohmann::json evaluate_text_tensor_parallel(const Model& model, const Tokenizer& tok,
                                             Backend& backend, const std::string& text,
                                             const std::string& source, int64_t seq_len,
                                             int64_t batch, int64_t max_windows,
                                             dist::Communicator& world, int tensor);

// Generation after prompt (empty: from BOS, else EOS). on_text receives the decoded text so far
// (prompt included) each time it grows by whole characters. Returns `zof generate --json`'s
// object: prompt, completion, text, new_tokens, ids, tokens_per_s.
nlohmann::json generate_text(const Model& model, const Tokenizer& tok, Backend& backend,
                             const std::string& prompt, SampleOptions opt,
                             const std::function<void(const std::string&)>& on_text = nullptr,
                             const WeightPlacement& place = {});

}  // namespace zof
