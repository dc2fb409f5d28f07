// safetensors reader (mmap, every offset, size, dtype and shape validated before use) and atomic
// writer. The format: u64 LE header length N, N bytes of JSON, then the data section; see
// https://github.com/huggingface/safetensors (the Rust crate is the reference we match).
#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hf/json_depth.h"
#include "util/files.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The Rust crate refuses headers over 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kRedownload = "the file is corrupt or was not written by a safetensors writer; re-download or re-export it";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One line for the user: the file, the tensor when there is one, the problem and the fix.
[[noreturn]] void fail(const std::string& file, const std::string& tensor, const std::string& what) {
  std::string msg = "safetensors " + file;
  if (!tensor.empty()) msg += ", tensor " + tensor;
  throw Error(msg + ": " + what);
}

std::string errno_str(int e) { return std::strerror(e); }

// The safetensors dtype names; only the first three can be read.
bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else return false;
  return true;
}
bool known_unsupported_dtype(const std::string& s) {
  static const std::set<std::string> k = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
                                          "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                          "F6_E3M2", "C64", "E8M0"};
  return k.count(s) > 0;
}

// A read-only mapping of a whole file.
struct Mapping {
  std::string path;
  const uint8_t* addr = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) munmap(const_cast<uint8_t*>(addr), size);
  }
};

std::unique_ptr<Mapping> map_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  struct stat pre{};
  if (::stat(path.c_str(), &pre) == 0 || errno != ENOENT)  // a missing file: "cannot open" below
    check_regular_file(path, path, name + " must be a regular file: replace it with the model's own " +
                                       name + " (re-download it)");
  // Without blocking: a file swapped for a FIFO since the check fails below instead of hanging.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, "", "cannot open: " + errno_str(errno) + "; check the path");
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(path, "", "cannot stat: " + errno_str(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "", "not a regular file");
  }
  auto m = std::make_unique<Mapping>();
  m->path = path;
  m->size = size_t(st.st_size);
  if (m->size < 8) {
    ::close(fd);
    fail(path, "",
         "the file is truncated: it has " + std::to_string(m->size) +
             " bytes, fewer than the 8-byte header length; re-download the file");
  }
  void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail(path, "", "cannot mmap: " + errno_str(e));
  m->addr = static_cast<const uint8_t*>(p);
  return m;
}

// Parses JSON text refusing a key that appears twice in one object (nlohmann keeps the last
// copy silently: a second tensor entry of the same name would replace the first). dup gets the
// repeated key (empty: none), path the keys leading to its object ("" at the top level).
json parse_unique_keys(const char* begin, const char* end, std::string& dup, std::string& where) {
  std::vector<std::set<std::string>> open;  // the keys seen in each object being parsed
  std::vector<std::string> keys;            // the key each open object sits under
  std::string last_key;
  dup.clear();
  where.clear();
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.push_back(last_key);
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!open.empty() && !open.back().insert(last_key).second && dup.empty()) {
          dup = last_key;
          for (size_t i = 1; i < keys.size(); ++i) where += (i > 1 ? "." : "") + keys[i];
        }
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(begin, end, cb);
}

const json* field(const json& entry, const char* key) {
  auto it = entry.find(key);
  return it == entry.end() ? nullptr : &*it;
}

// The header of one mapped file: its JSON object, and n, its length in bytes after the first 8.
json read_header(const Mapping& m, uint64_t& n) {
  const std::string& path = m.path;
  n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | m.addr[i];
  if (n > kMaxHeaderBytes)
    fail(path, "",
         "header length " + std::to_string(n) + " exceeds the 100 MB limit; " + kRedownload);
  if (n > m.size - 8)
    fail(path, "",
         "the file is truncated: header says " + std::to_string(n) + " header bytes after the first 8, file has " +
             std::to_string(m.size - 8) + "; re-download the file");
  if (n < 2) fail(path, "", "header of " + std::to_string(n) + " bytes cannot hold a JSON object; " + kRedownload);
  const char* hb = reinterpret_cast<const char*>(m.addr + 8);
  check_json_depth(std::string_view(hb, size_t(n)), "safetensors " + path);
  json header;
  std::string dup, where;
  try {
    header = parse_unique_keys(hb, hb + n, dup, where);
  } catch (const json::exception& e) {
    fail(path, "", std::string("malformed header JSON (") + e.what() + "); " + kRedownload);
  }
  if (!dup.empty() && where.empty())
    fail(path, dup, "the header names this tensor twice (a reader would keep one copy silently); " +
                        std::string(kRedownload));
  if (!dup.empty())
    fail(path, where, "the header entry has key \"" + dup + "\" twice; " + std::string(kRedownload));
  if (!header.is_object())
    fail(path, "", std::string("header JSON is a ") + header.type_name() + ", not an object; " + kRedownload);
  return header;
}

// __metadata__: a string-to-string map.
void parse_metadata(const std::string& path, const json& v,
                    std::map<std::string, std::string>* metadata) {
  if (!v.is_object()) fail(path, "", "__metadata__ is not a string-to-string map; " + std::string(kRedownload));
  for (auto mt = v.begin(); mt != v.end(); ++mt) {
    if (!mt.value().is_string())
      fail(path, "", "__metadata__ value for key '" + mt.key() + "' is a " + mt.value().type_name() +
                         ", not a string; " + kRedownload);
    if (metadata) (*metadata)[mt.key()] = mt.value().get<std::string>();
  }
}

// One tensor's header entry, checked against the data section (data, data_size bytes): its
// dtype, shape and data offsets [b, e).
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& v,
                       const uint8_t* data, uint64_t data_size, uint64_t& b, uint64_t& e) {
  if (!v.is_object()) fail(path, name, std::string("header entry is a ") + v.type_name() + ", not an object; " + kRedownload);
  const json* jd = field(v, "dtype");
  const json* js = field(v, "shape");
  const json* jo = field(v, "data_offsets");
  if (!jd || !js || !jo)
    fail(path, name,
         std::string("header entry lacks ") + (!jd ? "dtype" : !js ? "shape" : "data_offsets") + "; " + kRedownload);
  if (!jd->is_string()) fail(path, name, "dtype is not a string; " + std::string(kRedownload));
  const std::string ds = jd->get<std::string>();
  TensorInfo t;
  t.name = name;
  t.file = path;
  if (!parse_dtype(ds, &t.dtype)) {
    if (known_unsupported_dtype(ds))
      fail(path, name,
           "dtype " + ds + " is not supported (zof reads F32, F16 and BF16); convert the checkpoint, e.g. with torch: "
           "model.to(torch.float32).save_pretrained(dir)");
    fail(path, name, "unknown dtype '" + ds + "' (zof reads F32, F16 and BF16); " + kRedownload);
  }
  if (!js->is_array()) fail(path, name, "shape is not an array; " + std::string(kRedownload));
  // numel * dtype size must fit the data section; checking each step against it also rules out
  // overflow.
  uint64_t bytes = dtype_size(t.dtype);
  bool too_big = false;
  for (const json& d : *js) {
    if (!d.is_number_integer())
      fail(path, name, "shape " + js->dump() + " holds a non-integer; " + kRedownload);
    if (d.is_number_unsigned()) {
      uint64_t u = d.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail(path, name, "shape " + js->dump() + " has a dimension too large; " + kRedownload);
      t.shape.push_back(int64_t(u));
    } else {
      int64_t s = d.get<int64_t>();
      if (s < 0) fail(path, name, "shape " + js->dump() + " has a negative dimension; " + kRedownload);
      t.shape.push_back(s);
    }
    uint64_t dim = uint64_t(t.shape.back());
    if (!too_big && dim != 0 && bytes > data_size / dim) too_big = true;
    else bytes *= dim;
  }
  bool has_zero = std::find(t.shape.begin(), t.shape.end(), int64_t(0)) != t.shape.end();
  if (has_zero) {
    // An empty tensor needs no bytes, but TensorInfo::numel multiplies its dimensions in order:
    // the non-zero ones must not overflow int64 ([2^62, 2^62, 0] would).
    uint64_t prod = 1;
    for (int64_t d : t.shape)
      if (d != 0 && prod > uint64_t(INT64_MAX) / uint64_t(d))
        fail(path, name, "shape " + shape_str(t.shape) + " has dimensions too large; " + kRedownload);
      else if (d != 0)
        prod *= uint64_t(d);
    bytes = 0, too_big = false;
  }
  if (too_big)
    fail(path, name,
         "shape " + shape_str(t.shape) + " of " + ds + " needs more bytes than the data section holds (" +
             std::to_string(data_size) + "); the file is truncated or corrupt, re-download it");
  if (!jo->is_array() || jo->size() != 2 || !(*jo)[0].is_number_unsigned() || !(*jo)[1].is_number_unsigned())
    fail(path, name, "data_offsets " + jo->dump() + " is not a pair of non-negative integers; " + kRedownload);
  b = (*jo)[0].get<uint64_t>(), e = (*jo)[1].get<uint64_t>();
  if (b > e) fail(path, name, "data_offsets " + jo->dump() + " end before they begin; " + kRedownload);
  if (e > data_size)
    fail(path, name,
         "data_offsets " + jo->dump() + " run past the end of the data section (" + std::to_string(data_size) +
             " bytes): the file is truncated or corrupt; re-download the file");
  if (e - b != bytes)
    fail(path, name,
         "shape " + shape_str(t.shape) + " of " + ds + " needs " + std::to_string(bytes) +
             " bytes but data_offsets " + jo->dump() + " span " + std::to_string(e - b) + "; " + kRedownload);
  t.data = data + b;
  t.nbytes = size_t(bytes);
  return t;
}

struct Span {
  uint64_t begin, end;
  std::string name;
};

// No two tensors' bytes overlap.
void check_overlaps(const std::string& path, std::vector<Span>& spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      fail(path, spans[i].name,
           "data_offsets [" + std::to_string(spans[i].begin) + ", " + std::to_string(spans[i].end) +
               "] overlap those of " + spans[i - 1].name + " [" + std::to_string(spans[i - 1].begin) + ", " +
               std::to_string(spans[i - 1].end) + "]; " + kRedownload);
}

// Parses and validates the header of one mapped file; appends its tensors to out (name -> info).
void parse_file(const Mapping& m, std::map<std::string, TensorInfo>* out,
                std::map<std::string, std::string>* metadata) {
  const std::string& path = m.path;
  uint64_t n = 0;
  const json header = read_header(m, n);
  const uint8_t* data = m.addr + 8 + n;
  const uint64_t data_size = m.size - 8 - n;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      parse_metadata(path, it.value(), metadata);
      continue;
    }
    uint64_t b = 0, e = 0;
    TensorInfo t = parse_entry(path, name, it.value(), data, data_size, b, e);
    if (e > b) spans.push_back({b, e, name});
    if (out->count(name)) fail(path, name, "tensor appears twice");
    out->emplace(name, std::move(t));
  }
  check_overlaps(path, spans);
}

}  // namespace

struct Archive::Impl {
  std::string source;  // as given to open_*
  std::string where;   // the file that lists the tensors: model.safetensors or the index.json
  std::vector<std::unique_ptr<Mapping>> maps;
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

Archive::Archive() : impl_(std::make_unique<Impl>()) {}
Archive::Archive(Archive&&) noexcept = default;
Archive& Archive::operator=(Archive&&) noexcept = default;
Archive::~Archive() = default;

Archive Archive::open_file(const std::string& path) {
  Archive a;
  a.impl_->source = path;
  a.impl_->where = path;
  a.impl_->maps.push_back(map_file(path));
  parse_file(*a.impl_->maps.back(), &a.impl_->tensors, &a.impl_->metadata);
  return a;
}

Archive Archive::open_dir(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(single, ec) || ec) {  // an unreachable one is named by open_file
    Archive a = open_file(single.string());
    a.impl_->source = dir;
    return a;
  }
  if (!fs::exists(index, ec))
    throw Error("no model.safetensors or model.safetensors.index.json in " + dir +
                "; point zof at a Hugging Face model directory with safetensors weights");
  const std::string ip = index.string();
  const std::string text = read_input_file(
      ip, ip, "model.safetensors.index.json must be a regular file of at most " +
                  size_words(kMaxModelJsonBytes) + ": re-download it",
      kMaxModelJsonBytes);
  check_json_depth(text, ip);
  json j;
  std::string dup, where;
  try {
    j = parse_unique_keys(text.data(), text.data() + text.size(), dup, where);
  } catch (const json::exception& e) {
    throw Error(ip + ": malformed JSON (" + e.what() + "); re-download the file");
  }
  if (!dup.empty())
    throw Error(ip + ": " + (where == "weight_map" ? "weight_map names tensor " + dup + " twice"
                                                   : "key \"" + dup + "\" appears twice" +
                                                         (where.empty() ? "" : " in " + where)) +
                "; re-download the file");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(ip + ": no \"weight_map\" object mapping tensor names to shard files; re-download the file");
  const json& wm = j["weight_map"];
  std::map<std::string, std::string> want;  // tensor -> shard
  std::set<std::string> shards;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it.value().is_string())
      throw Error(ip + ": weight_map entry for tensor " + it.key() + " is not a file name; re-download the file");
    std::string s = it.value().get<std::string>();
    fs::path sp(s);
    if (s.empty() || sp.is_absolute() || std::find(sp.begin(), sp.end(), fs::path("..")) != sp.end())
      throw Error(ip + ": weight_map entry for tensor " + it.key() + " names shard '" + s +
                  "' outside the model directory; re-download the file");
    want[it.key()] = s;
    shards.insert(s);
  }
  if (want.empty()) throw Error(ip + ": weight_map is empty; re-download the file");
  for (const auto& s : shards) {
    const fs::path sp = fs::path(dir) / s;
    if (!fs::exists(sp, ec) && !ec)
      throw Error(ip + " names shard " + s + ", which is missing from " + dir + "; download it");
  }
  Archive a;
  a.impl_->source = dir;
  a.impl_->where = ip;
  std::map<std::string, std::string> found;  // tensor -> shard that holds it
  bool first = true;
  for (const auto& s : shards) {
    const std::string sp = (fs::path(dir) / s).string();
    a.impl_->maps.push_back(map_file(sp));
    std::map<std::string, TensorInfo> ts;
    parse_file(*a.impl_->maps.back(), &ts, first ? &a.impl_->metadata : nullptr);
    first = false;
    for (auto& [name, t] : ts) {
      auto [it, fresh] = found.emplace(name, s);
      if (!fresh)
        throw Error(ip + ": tensor " + name + " is in two shards, " + it->second + " and " + s +
                    "; re-download the model");
      a.impl_->tensors.emplace(name, std::move(t));
    }
  }
  for (const auto& [name, s] : want) {
    auto it = found.find(name);
    if (it == found.end())
      throw Error(ip + " maps tensor " + name + " to shard " + s + ", which does not hold it; re-download the model");
    if (it->second != s)
      throw Error(ip + " maps tensor " + name + " to shard " + s + " but it is in " + it->second +
                  "; re-download the model");
  }
  return a;
}

const TensorInfo* Archive::find(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  return it == impl_->tensors.end() ? nullptr : &it->second;
}

const TensorInfo& Archive::require(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t)
    throw Error("missing tensor " + name + " in " + impl_->where +
                "; the checkpoint does not match config.json (wrong model directory?)");
  if (t->shape != shape)
    throw Error("tensor " + name + " in " + t->file + " has shape " + shape_str(t->shape) + ", expected " +
                shape_str(shape) + " from config.json; the checkpoint does not match its config");
  return *t;
}

std::vector<std::string> Archive::names() const {
  std::vector<std::string> r;
  r.reserve(impl_->tensors.size());
  for (const auto& kv : impl_->tensors) r.push_back(kv.first);
  return r;
}

const std::map<std::string, std::string>& Archive::metadata() const { return impl_->metadata; }
std::string Archive::source() const { return impl_->source; }

void to_f32(const TensorInfo& t, float* out) { to_f32(t, out, 0, t.numel()); }

void to_f32(const TensorInfo& t, float* out, int64_t first, int64_t n) {
  ZOF_ASSERT(size_t(t.numel()) * dtype_size(t.dtype) == t.nbytes);
  ZOF_ASSERT(first >= 0 && n >= 0 && first + n <= t.numel());
  // May be unaligned: the header length need not be a multiple of 4.
  const uint8_t* src = t.data + size_t(first) * dtype_size(t.dtype);
  switch (t.dtype) {
    case DType::F32:
      if (n) std::memcpy(out, src, size_t(n) * 4);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
  }
  ZOF_ABORT("unknown dtype");
}

namespace {


}  // namespace

void write(const std::string& path, const std::vector<TensorOut>& tensors,
           const std::map<std::string, std::string>& metadata, const OpenTensor& open) {
  // Validate everything before touching the file system.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") throw Error("cannot write " + path + ": a tensor may not be named __metadata__");
    if (!seen.insert(t.name).second) throw Error("cannot write " + path + ": tensor " + t.name + " given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        throw Error("cannot write " + path + ": tensor " + t.name + " has negative shape " + shape_str(t.shape));
      if (d != 0 && numel > (uint64_t(1) << 62) / uint64_t(d))
        throw Error("cannot write " + path + ": tensor " + t.name + " shape " + shape_str(t.shape) + " is too large");
      numel *= uint64_t(d);
    }
    if (numel > 0 && !t.data && !t.bf16 && !open) throw Error("cannot write " + path + ": tensor " + t.name + " has no data");
    const uint64_t bytes = numel * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // as the Rust writer pads, so the data starts 8-aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));

  AtomicFile tmp(path);
  tmp.write(len, 8);
  tmp.write(hs.data(), hs.size());
  std::vector<uint16_t> buf;
  constexpr size_t kChunk = size_t(1) << 20;  // elements converted per write
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    TensorOut t = tensors[ti];
    if (open) open(ti, t);
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= size_t(d);
    ZOF_ASSERT(numel == 0 || t.data || t.bf16);
    if (t.bf16) {
      if (t.dtype == DType::BF16) {
        tmp.write(t.bf16, numel * 2);
        continue;
      }
      std::vector<float> wide(std::min(numel, kChunk));
      buf.resize(std::min(numel, kChunk));
      for (size_t at = 0; at < numel; at += kChunk) {
        const size_t m = std::min(kChunk, numel - at);
        for (size_t i = 0; i < m; ++i) wide[i] = bf16_to_f32(t.bf16[at + i]);
        if (t.dtype == DType::F32) {
          tmp.write(wide.data(), m * 4);
          continue;
        }
        for (size_t i = 0; i < m; ++i) buf[i] = f32_to_f16(wide[i]);
        tmp.write(buf.data(), m * 2);
      }
      continue;
    }
    if (t.dtype == DType::F32) {
      tmp.write(t.data, numel * 4);
      continue;
    }
    buf.resize(std::min(numel, kChunk));
    for (size_t at = 0; at < numel; at += kChunk) {
      const size_t m = std::min(kChunk, numel - at);
      const float* src = t.data + at;
      if (t.dtype == DType::F16)
        for (size_t i = 0; i < m; ++i) buf[i] = f32_to_f16(src[i]);
      else
        for (size_t i = 0; i < m; ++i) buf[i] = f32_to_bf16(src[i]);
      tmp.write(buf.data(), m * 2);
    }
  }
  tmp.commit();
}

void release_pages(const TensorInfo& t) { release_pages(t, 0, t.numel()); }

void release_pages(const TensorInfo& t, int64_t first, int64_t n) {
  if (!t.data || t.nbytes == 0 || n <= 0) return;
  const size_t es = dtype_size(t.dtype);
  const uint8_t* from = t.data + size_t(first) * es;
  const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
  const uintptr_t lo = ((uintptr_t)from + page - 1) / page * page;  // whole pages inside it
  const uintptr_t hi = ((uintptr_t)from + size_t(n) * es) / page * page;
  if (hi > lo) ::madvise((void*)lo, hi - lo, MADV_DONTNEED);  // advice: failure changes nothing
}

}  // namespace zof::safetensors
