// The bounds config.json's size fields are read within (src/hf/config.cpp), for the same bounds on
// a size read from elsewhere: a GGUF file's llama.* keys (gguf_llama.cpp), refused by their names.
#pragma once
#include <cstdint>
#include <string>

namespace zof {

// The largest value config.json's size field `key` ("hidden_size", "num_attention_heads", ...)
// may hold.
int64_t config_size_limit(const std::string& key);

}  // namespace zof
