// Writes a model with random weights in Hugging Face layout (config.json, model.safetensors) for
// zof finetune to train: a built-in shape (gpt2-124m, llama-125m, llama2-7b) or a config.json,
// in bf16 or fp32, drawn as Model::random draws it (each tensor from its own generator) and held
// in the dtype it is written in (a 6.7B model in bf16 never takes 27 GB). The tokenizer files of
// --tokenizer-from are copied beside it (their ids must be below the model's vocabulary).
//   build/random_model --model-config llama2-7b --dtype bf16 --out /tmp/llama2-7b-random
//       --tokenizer-from ../shared/assets/models/stories260K     (one command line)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "bench_common.h"
#include "zof/error.h"
#include "zof/model.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"A model with random weights, in Hugging Face layout"};
  std::string config = "llama-125m", dtype = "bf16", out, tokenizer_from;
  uint64_t seed = 0;
  app.add_option("--model-config", config, "gpt2-124m, llama-125m, llama2-7b or a config.json")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "bf16 or fp32")->capture_default_str();
  app.add_option("--out", out, "the new model's directory (new or empty)")->required();
  app.add_option("--tokenizer-from", tokenizer_from,
                 "a model directory whose tokenizer files are copied");
  app.add_option("--seed", seed, "seed of the weights")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    ZOF_CHECK(dtype == "bf16" || dtype == "fp32", "--dtype must be bf16 or fp32, not " + dtype);
    std::error_code ec;
    ZOF_CHECK(!fs::exists(out, ec) || fs::is_empty(out, ec),
              "--out " + out + " is not empty; give a new directory");
    const zof::DType t = dtype == "bf16" ? zof::DType::BF16 : zof::DType::F32;
    const zof::Model m = zof::Model::random(zof_bench::config_named(config), seed, t);
    m.save(out, t);
    if (!tokenizer_from.empty())
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                            "special_tokens_map.json"})
        if (fs::exists(fs::path(tokenizer_from) / f))
          fs::copy_file(fs::path(tokenizer_from) / f, fs::path(out) / f,
                        fs::copy_options::overwrite_existing);
    std::printf("%s: %.2fB parameters in %s\n", out.c_str(), m.num_params() / 1e9, dtype.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "random_model: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
