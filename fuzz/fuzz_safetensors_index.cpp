// Fuzz target: a sharded model directory read by Archive::open_dir, as `zof` reads one. The input
// is model.safetensors.index.json, optionally followed by a NUL and the bytes of the first shard
// (model-00001-of-00002.safetensors); without one, that shard is a fixed valid file. The second
// shard is always the fixed valid file model-00002-of-00002.safetensors.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "hf/safetensors.h"

namespace {

// A valid safetensors file holding one F32 tensor of shape [2] named `name`.
std::string small_shard(const std::string& name) {
  std::string header = "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  file += header;
  const float v[2] = {1.5f, -2.0f};
  file.append(reinterpret_cast<const char*>(v), sizeof(v));
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string shard1 = small_shard("a.weight"), shard2 = small_shard("b.weight");
  static const bool once = [] {
    zof::fuzz::write_file("model-00002-of-00002.safetensors", shard2);
    return true;
  }();
  (void)once;
  const auto parts = zof::fuzz::split_parts(data, size, 2);
  zof::fuzz::write_file("model.safetensors.index.json", parts[0]);
  zof::fuzz::write_file("model-00001-of-00002.safetensors", parts.size() > 1 ? parts[1] : shard1);
  ZOF_FUZZ_REFUSE_OK({
    const auto archive = zof::safetensors::Archive::open_dir(zof::fuzz::scratch_dir());
    std::vector<float> out;
    for (const std::string& name : archive.names()) {
      const zof::safetensors::TensorInfo* t = archive.find(name);
      out.resize(size_t(t->numel()));
      zof::safetensors::to_f32(*t, out.data());
    }
  });
  return 0;
}
