// Fuzz target: one GGUF file read by gguf::File::open as `zof --model FILE.gguf` reads it, every
// tensor of a type zof reads dequantized, then the config.json and tokenizer files its metadata
// make (hf/gguf_llama.h) and the tokenizer Tokenizer::load builds from it, run on a sample.
#include <vector>

#include "fuzz_common.h"
#include "hf/gguf.h"
#include "hf/gguf_llama.h"
#include "zof/config.h"
#include "zof/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace gg = zof::gguf;
  const std::string path =
      zof::fuzz::write_file("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  bool llama = false;
  ZOF_FUZZ_REFUSE_OK({
    const gg::File f = gg::File::open(path);
    std::vector<float> out;
    for (const gg::TensorInfo& t : f.tensors()) {
      // The reader promised the bytes are inside the file, and that they hold the elements.
      const gg::TypeTraits* tt = gg::type_traits(static_cast<uint32_t>(t.type));
      if (t.nbytes > size || t.numel() < 0 ||
          (unsigned __int128)t.numel() / tt->block * tt->bytes != t.nbytes)
        __builtin_trap();
      if (!tt->readable) continue;
      out.resize(size_t(t.numel()));
      gg::dequantize(t.type, t.data, t.numel(), out.data());
    }
    const nlohmann::json cfg = gg::llama_config(f);
    (void)zof::ModelConfig::from_json(cfg, path);
    (void)gg::llama_tokenizer(f, cfg);
    llama = true;
  });
  if (!llama) return 0;
  ZOF_FUZZ_REFUSE_OK({
    const zof::Tokenizer tok = zof::Tokenizer::load(path);
    (void)tok.decode(tok.encode("Hello 123, w\xc3\xb6rld!<|endoftext|>"), false);
  });
  return 0;
}
