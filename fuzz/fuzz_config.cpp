// Fuzz target: config.json read by ModelConfig::load, as `zof` reads a model's.
#include "fuzz_common.h"
#include "zof/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      zof::fuzz::write_file("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  ZOF_FUZZ_REFUSE_OK({
    const zof::ModelConfig c = zof::ModelConfig::load(path);
    // What the model builder reads next must be what validation promised.
    if (c.hidden_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 ||
        c.head_dim <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0 || c.num_heads % c.num_kv_heads != 0)
      __builtin_trap();
  });
  return 0;
}
