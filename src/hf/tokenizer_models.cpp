// The tokenizer's model (the tokenizers library's models/): BPE, with the merges applied as
// Word::merge_all does, byte fallback, unknown-token fusing and a cache of tokenized words.
#include <algorithm>
#include <cstdio>
#include <functional>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"
#include "zof/error.h"

namespace zof::tok {

void Bpe::load(const Source& src, const json& model) {
  file = src.file;
  const json& v = src.at(model, "model", "vocab");
  if (!v.is_object()) src.fail("model.vocab", "expected an object of token: id");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it)
    vocab[it.key()] = src.token_id(it.value(), "model.vocab[\"" + it.key() + "\"]");
  auto optional_string = [&](const char* key) -> std::optional<std::string> {
    if (!model.contains(key) || model[key].is_null()) return std::nullopt;
    return src.str(model, "model", key);
  };
  unk_token = optional_string("unk_token");
  prefix = optional_string("continuing_subword_prefix").value_or("");
  suffix = optional_string("end_of_word_suffix").value_or("");
  fuse_unk = src.flag(model, "model", "fuse_unk", false);
  byte_fallback = src.flag(model, "model", "byte_fallback", false);
  ignore_merges = src.flag(model, "model", "ignore_merges", false);
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    if (!model["dropout"].is_number()) src.fail("model.dropout", "expected a number or null");
    if (model["dropout"].get<double>() > 0.0)
      src.fail("model.dropout", "BPE dropout is for training; set it to null to tokenize deterministically");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = vocab.find(std::string_view(name));
    byte_ids_[b] = it == vocab.end() ? -1 : it->second;
  }

  const json& m = model.contains("merges") ? model["merges"] : json::array();
  if (!m.is_array()) src.fail("model.merges", "expected a list");
  merges_.reserve(m.size());
  auto id_of = [&](const std::string& tok, size_t rank) {
    const auto it = vocab.find(tok);
    if (it == vocab.end())
      src.fail("model.merges[" + std::to_string(rank) + "]", "token \"" + tok + "\" is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < m.size(); ++rank) {
    const json& e = m[rank];
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        src.fail("model.merges[" + std::to_string(rank) + "]", "expected two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      src.fail("model.merges[" + std::to_string(rank) + "]", "expected \"a b\" or [\"a\", \"b\"]");
    }
    const std::string merged = a + b.substr(std::min(prefix.size(), b.size()));
    merges_[pair_key(id_of(a, rank), id_of(b, rank))] = {static_cast<int32_t>(rank), id_of(merged, rank)};
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const auto it = vocab.find(word);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (word.size() > kMaxCachedWord) return;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheCapacity) cache_.clear();
  cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<long>(first), out.end()));
}

// Word::merge_all of tokenizers: apply the lowest-ranked merge present, leftmost first, until none
// applies; a heap of candidate merges over a linked list of symbols, stale entries skipped.
void Bpe::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  thread_local std::string key;
  symbols.clear();
  auto add = [&](int32_t id, size_t len) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  int32_t unk_id = -1;  // pending unknown token, if >= 0, and its byte length
  size_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t len = unicode::utf8_length(static_cast<unsigned char>(word[i]));
    const bool is_first = i == 0, is_last = i + len >= word.size();
    std::string_view s = word.substr(i, len);
    if ((!is_first && !prefix.empty()) || (is_last && !suffix.empty())) {
      key.assign(is_first ? "" : prefix);
      key.append(s);
      if (is_last) key.append(suffix);
      s = key;
    }
    i += len;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(it->second, len);
      continue;
    }
    if (byte_fallback &&
        std::all_of(s.begin(), s.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)], 1);
      continue;
    }
    if (unk_token) {
      const auto it = vocab.find(*unk_token);
      if (it == vocab.end()) throw Error(file + ": model.unk_token \"" + *unk_token + "\" is not in model.vocab");
      if (unk_id >= 0 && fuse_unk) {
        unk_len += len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = it->second;
        unk_len = len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  heap.clear();
  initial_symbols(word, symbols);

  auto lookup = [&](int32_t a, int32_t b) -> const MergeInfo* {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t pos, const MergeInfo& m) {
    heap.push_back({m.rank, pos, m.new_id});
    std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k)
    if (const MergeInfo* m = lookup(symbols[k].id, symbols[k + 1].id)) push(static_cast<int32_t>(k), *m);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = symbols[static_cast<size_t>(cur.next)];
    const MergeInfo* m = lookup(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale: a neighbour changed since it was queued
    symbols[static_cast<size_t>(cur.next)].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const MergeInfo* pm = lookup(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) push(cur.prev, *pm);
    if (cur.next >= 0)
      if (const MergeInfo* nm = lookup(cur.id, symbols[static_cast<size_t>(cur.next)].id)) push(top.pos, *nm);
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

}  // namespace zof::tok
