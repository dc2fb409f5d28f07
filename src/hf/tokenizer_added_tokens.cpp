// Added tokens (the tokenizers library's AddedVocabulary, tokenizer/added_vocabulary.rs): the
// byte trie of their patterns and the splits of a text around their matches.
#include <algorithm>
#include <numeric>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"

namespace zof::tok {

void AddedTokenMatcher::build() {
  // In byte order (std::string compares as unsigned char) the patterns below one trie node are
  // a contiguous range, the one ending at the node first. Stable: of equal patterns (two tokens
  // that normalize alike) the first added comes first and wins.
  std::vector<uint32_t> order(entries_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return entries_[a].pattern < entries_[b].pattern; });
  auto pattern = [&](size_t k) -> const std::string& { return entries_[order[k]].pattern; };
  nodes_.assign(1, Node{});
  edge_byte_.clear();
  edge_child_.clear();
  // The nodes still to fill, on a stack rather than by recursion (a pattern may be megabytes
  // long): the patterns under a node at depth d are order[lo, hi), sharing their first d bytes.
  // A node's edges are made at once, so they are contiguous.
  struct Range {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Range> todo{{0, 0, order.size(), 0}};
  while (!todo.empty()) {
    auto [node, lo, hi, depth] = todo.back();
    todo.pop_back();
    if (lo < hi && pattern(lo).size() == depth) nodes_[node].entry = static_cast<int32_t>(order[lo]);
    while (lo < hi && pattern(lo).size() == depth) ++lo;
    nodes_[node].first_edge = static_cast<uint32_t>(edge_byte_.size());
    while (lo < hi) {
      const char byte = pattern(lo)[depth];
      size_t end = lo + 1;
      while (end < hi && pattern(end)[depth] == byte) ++end;
      const auto next = static_cast<uint32_t>(nodes_.size());
      edge_byte_.push_back(static_cast<uint8_t>(byte));
      edge_child_.push_back(next);
      nodes_.emplace_back();
      todo.push_back({next, lo, end, depth + 1});
      lo = end;
    }
    nodes_[node].end_edge = static_cast<uint32_t>(edge_byte_.size());
  }
  root_child_.fill(0);
  for (uint32_t e = nodes_[0].first_edge; e < nodes_[0].end_edge; ++e) root_child_[edge_byte_[e]] = edge_child_[e];
}

uint32_t AddedTokenMatcher::child(uint32_t node, unsigned char byte) const {
  const auto first = edge_byte_.begin() + nodes_[node].first_edge, last = edge_byte_.begin() + nodes_[node].end_edge;
  const auto it = std::lower_bound(first, last, byte);
  return it != last && *it == byte ? edge_child_[static_cast<size_t>(it - edge_byte_.begin())] : 0;
}

// The longest pattern that s has at pos (nullptr: none): down the trie along s, keeping the
// last node a pattern ends at.
const AddedTokenMatcher::Entry* AddedTokenMatcher::longest_match(std::string_view s, size_t pos) const {
  const Entry* found = nullptr;
  for (uint32_t node = root_child_[static_cast<unsigned char>(s[pos])]; node != 0;) {
    if (nodes_[node].entry >= 0) found = &entries_[static_cast<size_t>(nodes_[node].entry)];
    if (++pos == s.size()) break;
    node = child(node, static_cast<unsigned char>(s[pos]));
  }
  return found;
}

namespace {

char32_t last_char(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return unicode::next_code_point(s, k);
}

}  // namespace

void AddedTokenMatcher::split(std::string_view s, std::vector<Split>& out) const {
  out.clear();
  if (s.empty() || entries_.empty()) {
    out.push_back({0, s.size(), -1});
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const Entry* found = nullptr;
    size_t mstart = pos;
    for (; mstart < s.size(); ++mstart)
      if ((found = longest_match(s, mstart))) break;
    if (!found) break;
    size_t start = mstart, stop = mstart + found->pattern.size();
    pos = stop;  // the search resumes after the match itself, whatever lstrip/rstrip take
    const AddedToken& tok = *found->token;
    if (tok.single_word) {  // no \w character (Rust regex) right before or after
      const bool start_space = start == 0 || !unicode::is_word_char(last_char(s.substr(0, start)));
      size_t k = stop;
      const bool stop_space = stop == s.size() || !unicode::is_word_char(unicode::next_code_point(s, k));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!unicode::is_whitespace(unicode::next_code_point(s, tmp))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!unicode::is_whitespace(unicode::next_code_point(s, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace zof::tok
