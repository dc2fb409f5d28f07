// Post-processors of tokenizer.json (the tokenizers library's processors/): TemplateProcessing's
// single template, BertProcessing and RobertaProcessing, Sequence; ByteLevel (offsets only) is none.
#include <algorithm>
#include <memory>
#include <optional>

#include "hf/tokenizer_parts.h"

namespace zof::tok {
namespace {

// TemplateProcessing's single template, and Bert/RobertaProcessing ([cls] A [sep]).
struct TemplatePostProcessor : PostProcessor {
  std::vector<std::optional<std::vector<int32_t>>> items;  // nullopt: the sequence itself
  void apply(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& item : items) {
      if (item) out.insert(out.end(), item->begin(), item->end());
      else out.insert(out.end(), ids.begin(), ids.end());
    }
    ids.swap(out);
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (const auto& item : items)
      if (item)
        for (const int32_t id : *item) m = std::max(m, id);
    return m;
  }
};

struct SequencePostProcessor : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> steps;
  void apply(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps) s->apply(ids);
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (const auto& s : steps) m = std::max(m, s->max_id());
    return m;
  }
};

}  // namespace

std::unique_ptr<PostProcessor> parse_post_processor(const Source& src, const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = src.str(j, field, "type");
  if (type == "ByteLevel") return nullptr;  // only adjusts offsets
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePostProcessor>();
    const json& list = src.at(j, field, "processors");
    if (!list.is_array()) src.fail(field + ".processors", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      auto p = parse_post_processor(src, list[k], field + ".processors[" + std::to_string(k) + "]");
      if (p) seq->steps.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "TemplateProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    const json& single = src.at(j, field, "single");
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    if (!single.is_array()) src.fail(field + ".single", "expected a list");
    for (size_t k = 0; k < single.size(); ++k) {
      const std::string f = field + ".single[" + std::to_string(k) + "]";
      const json& item = single[k];
      if (item.is_object() && item.contains("Sequence")) {
        const std::string seq = src.str(item["Sequence"], f + ".Sequence", "id");
        if (seq != "A") src.fail(f, "the single-sequence template refers to sequence " + seq);
        t->items.emplace_back(std::nullopt);
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = src.str(item["SpecialToken"], f + ".SpecialToken", "id");
        if (!specials.contains(name)) src.fail(field + ".special_tokens", "no entry for \"" + name + "\"");
        const json& ids = src.at(specials[name], field + ".special_tokens[\"" + name + "\"]", "ids");
        if (!ids.is_array()) src.fail(field + ".special_tokens[\"" + name + "\"].ids", "expected a list");
        std::vector<int32_t> v;
        for (const json& id : ids) v.push_back(src.token_id(id, field + ".special_tokens[\"" + name + "\"].ids"));
        t->items.emplace_back(std::move(v));
      } else {
        src.fail(f, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    return t;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    auto token = [&](const char* key) {
      const json& v = src.at(j, field, key);
      if (!v.is_array() || v.size() != 2) src.fail(field + "." + key, "expected [token, id]");
      return std::vector<int32_t>{src.token_id(v[1], field + "." + key + "[1]")};
    };
    t->items.emplace_back(token("cls"));
    t->items.emplace_back(std::nullopt);
    t->items.emplace_back(token("sep"));
    return t;
  }
  src.fail(field + ".type", "post-processor \"" + type +
                                "\" is not supported (zof implements TemplateProcessing, ByteLevel, Sequence, "
                                "BertProcessing, RobertaProcessing)");
}

}  // namespace zof::tok
