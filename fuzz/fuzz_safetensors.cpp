// Fuzz target: one .safetensors file (8-byte header length, JSON header, data section) read by
// Archive::open_file, as `zof` reads model.safetensors, then every tensor converted to fp32.
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = zof::fuzz::write_file("model.safetensors",
                                                 std::string_view(reinterpret_cast<const char*>(data), size));
  ZOF_FUZZ_REFUSE_OK({
    const auto archive = zof::safetensors::Archive::open_file(path);
    std::vector<float> out;
    for (const std::string& name : archive.names()) {
      const zof::safetensors::TensorInfo& t = archive.require(name, archive.find(name)->shape);
      // The reader promised the bytes are inside the file: numel * dtype size == nbytes <= size.
      if (t.nbytes > size) __builtin_trap();
      out.resize(size_t(t.numel()));
      zof::safetensors::to_f32(t, out.data());
    }
    for (const auto& [key, value] : archive.metadata()) (void)key, (void)value;
  });
  return 0;
}
