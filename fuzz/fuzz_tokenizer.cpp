// Fuzz target: a tokenizer directory read by Tokenizer::load, as `zof` reads a model's, then a
// short text encoded and decoded. The input is tokenizer.json, optionally followed by a NUL and
// the text (a fixed mixed-script sentence without one), and optionally by another NUL and
// tokenizer_config.json (absent without one).
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "zof/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string kText = "Hello world!  It's 2024: caf\xC3\xA9 \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC\n\tok";
  const auto parts = zof::fuzz::split_parts(data, size, 3);
  zof::fuzz::write_file("tokenizer.json", parts[0]);
  if (parts.size() > 2) zof::fuzz::write_file("tokenizer_config.json", parts[2]);
  else zof::fuzz::remove_file("tokenizer_config.json");
  const std::string_view text = parts.size() > 1 ? parts[1].substr(0, 4096) : std::string_view(kText);
  ZOF_FUZZ_REFUSE_OK({
    const zof::Tokenizer tok = zof::Tokenizer::load(zof::fuzz::scratch_dir());
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = tok.encode(text, special);
      for (int32_t id : ids) tok.token_to_id(tok.id_to_token(id));
      const std::string back = tok.decode(ids, special);
      (void)tok.encode(back, false);
    }
    (void)tok.bos_id(), (void)tok.eos_id(), (void)tok.pad_id(), (void)tok.vocab_size();
  });
  return 0;
}
