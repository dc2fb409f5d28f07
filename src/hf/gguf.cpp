// GGUF reader (mmap; the header, every metadata value, every tensor's name, dimensions, type and
// offset validated before use) and atomic writer. Layout (llama.cpp docs/gguf.md): "GGUF", u32
// version, u64 tensor count, u64 metadata count, the metadata (string key, u32 type, value), the
// tensor infos (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset), padding to the
// alignment, then the data section; all little-endian, strings as u64 length + bytes.
#include "hf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "zof/dtype.h"
#include "util/files.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is read as little-endian");

namespace {

namespace fs = std::filesystem;

constexpr const char* kRedownload =
    "the file is truncated or corrupt, or was not written by a GGUF writer; re-download it or "
    "convert the model again";
constexpr uint64_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT
constexpr int kMaxArrayDepth = 4;           // arrays of arrays: gguf-py reads any depth
// Values in one metadata array, and in all of a file's arrays together: 2^24, beyond any real
// vocabulary or merges (256K tokens, a few 100K merges). Each value read takes a Value (~100
// bytes) however few bytes it took in the file: unbounded, a file could demand 12-96x its size.
constexpr uint64_t kMaxArrayValues = uint64_t(1) << 24;
constexpr size_t kMaxName = 63;             // GGML_MAX_NAME 64, with its NUL
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS

// Every ggml type id with its block (elements, bytes): ggml.h's ggml_type and ggml.c's
// type_traits (gguf-py's GGML_QUANT_SIZES). The ids left out were removed from ggml.
const TypeTraits kTypes[] = {
    {0, "F32", 1, 4, true},        {1, "F16", 1, 2, true},        {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, true},     {6, "Q5_0", 32, 22, false},    {7, "Q5_1", 32, 24, false},
    {8, "Q8_0", 32, 34, true},     {9, "Q8_1", 32, 36, false},    {10, "Q2_K", 256, 84, false},
    {11, "Q3_K", 256, 110, false}, {12, "Q4_K", 256, 144, true},  {13, "Q5_K", 256, 176, false},
    {14, "Q6_K", 256, 210, true},  {15, "Q8_K", 256, 292, false}, {16, "IQ2_XXS", 256, 66, false},
    {17, "IQ2_XS", 256, 74, false}, {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false}, {21, "IQ3_S", 256, 110, false}, {22, "IQ2_S", 256, 82, false},
    {23, "IQ4_XS", 256, 136, false}, {24, "I8", 1, 1, false},     {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},      {27, "I64", 1, 8, false},      {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, 56, false}, {30, "BF16", 1, 2, true},      {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false}, {39, "MXFP4", 32, 17, false},
};

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
// Bytes of a scalar value (0: not a fixed-size type).
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}
// The fewest bytes a value of type t takes: what bounds an array's count by the bytes left.
uint64_t min_size(ValueType t) {
  if (t == ValueType::String) return 8;
  if (t == ValueType::Array) return 12;
  return scalar_size(t);
}

std::string errno_str(int e) { return std::strerror(e); }

struct Mapping {
  const uint8_t* addr = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) munmap(const_cast<uint8_t*>(addr), size);
  }
};

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* const names[] = {"UINT8", "INT8",   "UINT16", "INT16", "UINT32",
                                      "INT32", "FLOAT32", "BOOL",  "STRING", "ARRAY",
                                      "UINT64", "INT64", "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "(unknown type)";
}

Value Value::of_u32(uint32_t v) {
  Value x;
  x.type = ValueType::U32;
  x.u = v;
  return x;
}
Value Value::of_i32(int32_t v) {
  Value x;
  x.type = ValueType::I32;
  x.i = v;
  return x;
}
Value Value::of_f32(float v) {
  Value x;
  x.type = ValueType::F32;
  x.f = v;
  return x;
}
Value Value::of_bool(bool v) {
  Value x;
  x.type = ValueType::Bool;
  x.u = v;
  return x;
}
Value Value::of_string(std::string v) {
  Value x;
  x.type = ValueType::String;
  x.s = std::move(v);
  return x;
}
Value Value::of_array(ValueType elem, std::vector<Value> items) {
  Value x;
  x.type = ValueType::Array;
  x.elem = elem;
  x.items = std::move(items);
  return x;
}

const TypeTraits* type_traits(uint32_t id) {
  for (const TypeTraits& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

std::string readable_type_names() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<int64_t> TensorInfo::shape() const { return {dims.rbegin(), dims.rend()}; }

std::string shown(const std::string& s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  return s.size() > max ? out + "..." : out;
}

struct File::Impl {
  std::string path;
  Mapping map;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  Metadata metadata;
  std::map<std::string, size_t> by_key;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t> by_name;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    // The field may be a key or a tensor's name of the file: shown, never echoed at any length.
    throw Error("GGUF " + path + (field.empty() ? "" : ", " + shown(field, 80)) + ": " + what);
  }
};

namespace {

// Reads the mapped bytes in order, each read checked against the end of the file.
struct Cursor {
  const File::Impl& f;
  uint64_t at = 0;
  uint64_t array_values = 0;  // the values of the metadata arrays read so far

  uint64_t left() const { return f.map.size - at; }
  void need(uint64_t n, const std::string& field, const std::string& what) const {
    if (n > left())
      f.fail(field, "the file ends inside " + what + " (" + std::to_string(n) + " bytes needed at byte " +
                        std::to_string(at) + ", " + std::to_string(left()) + " left): " + kRedownload);
  }
  template <class T>
  T scalar(const std::string& field, const std::string& what) {
    need(sizeof(T), field, what);
    T v;
    std::memcpy(&v, f.map.addr + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str(const std::string& field, const std::string& what, uint64_t max_len) {
    const uint64_t n = scalar<uint64_t>(field, what + "'s length");
    if (n > max_len)
      f.fail(field, what + " is " + std::to_string(n) + " bytes long, more than the " +
                        std::to_string(max_len) + " allowed; " + kRedownload);
    need(n, field, what);
    std::string s(reinterpret_cast<const char*>(f.map.addr + at), size_t(n));
    at += n;
    return s;
  }

  Value value(ValueType type, const std::string& field, int depth) {
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::U8: v.u = scalar<uint8_t>(field, "the value"); break;
      case ValueType::I8: v.i = scalar<int8_t>(field, "the value"); break;
      case ValueType::U16: v.u = scalar<uint16_t>(field, "the value"); break;
      case ValueType::I16: v.i = scalar<int16_t>(field, "the value"); break;
      case ValueType::U32: v.u = scalar<uint32_t>(field, "the value"); break;
      case ValueType::I32: v.i = scalar<int32_t>(field, "the value"); break;
      case ValueType::U64: v.u = scalar<uint64_t>(field, "the value"); break;
      case ValueType::I64: v.i = scalar<int64_t>(field, "the value"); break;
      case ValueType::F32: v.f = scalar<float>(field, "the value"); break;
      case ValueType::F64: v.f = scalar<double>(field, "the value"); break;
      case ValueType::Bool: {
        const uint8_t b = scalar<uint8_t>(field, "the value");
        if (b > 1)
          f.fail(field, "a BOOL holds " + std::to_string(b) + ", not 0 or 1; " + kRedownload);
        v.u = b;
        break;
      }
      case ValueType::String: v.s = str(field, "the string", left()); break;
      case ValueType::Array: {
        if (depth >= kMaxArrayDepth)
          f.fail(field, "arrays nest deeper than " + std::to_string(kMaxArrayDepth) +
                            " levels; " + kRedownload);
        const uint32_t et = scalar<uint32_t>(field, "the array's element type");
        if (et > static_cast<uint32_t>(ValueType::F64))
          f.fail(field, "array element type " + std::to_string(et) + " is not a GGUF type; " +
                            kRedownload);
        v.elem = static_cast<ValueType>(et);
        const uint64_t n = scalar<uint64_t>(field, "the array's length");
        if (n > kMaxArrayValues)
          f.fail(field, "an array of " + std::to_string(n) + " values, more than the " +
                            std::to_string(kMaxArrayValues) + " zof reads (beyond any real "
                            "vocabulary or merges); " + kRedownload);
        if (n > kMaxArrayValues - array_values)
          f.fail(field, "an array of " + std::to_string(n) + " values brings the file's metadata "
                            "arrays past the " + std::to_string(kMaxArrayValues) + " values zof "
                            "reads in all (beyond any real vocabulary and merges); " + kRedownload);
        array_values += n;
        // Each element takes bytes: a count beyond what is left is refused before allocating.
        if (n > left() / min_size(v.elem))
          f.fail(field, "an array of " + std::to_string(n) + " " + value_type_name(v.elem) +
                            " values cannot fit in the " + std::to_string(left()) +
                            " bytes left in the file; " + kRedownload);
        // No more room up front than the bytes left could back (a Value is larger than the
        // bytes of most elements); the rest grows as elements are actually read.
        v.items.reserve(size_t(std::min<uint64_t>(n, left() / sizeof(Value))));
        for (uint64_t k = 0; k < n; ++k)
          v.items.push_back(value(v.elem, field + "[" + std::to_string(k) + "]", depth + 1));
        break;
      }
    }
    return v;
  }
};

std::string dims_str(const std::vector<int64_t>& d) {
  std::string r = "[";
  for (size_t i = 0; i < d.size(); ++i) r += (i ? ", " : "") + std::to_string(d[i]);
  return r + "]";
}

void parse(File::Impl& f) {
  Cursor c{f};
  const uint32_t magic = c.scalar<uint32_t>("", "the header");
  if (magic != 0x46554747u)  // "GGUF"
    f.fail("", "not a GGUF file (it does not start with \"GGUF\"); give a GGUF file, or a Hugging "
               "Face model directory holding config.json and model.safetensors");
  f.version = c.scalar<uint32_t>("version", "the header");
  if (f.version == 1)
    f.fail("version", "GGUF version 1 (llama.cpp before August 2023) is not read; convert the "
                      "model again with a current llama.cpp");
  if (f.version != 2 && f.version != 3) {
    const uint32_t swapped = __builtin_bswap32(f.version);
    if (swapped == 2 || swapped == 3)
      f.fail("version", "a big-endian GGUF file; zof reads little-endian GGUF only: convert the "
                        "model again without --bigendian");
    f.fail("version", "version " + std::to_string(f.version) +
                          " is not a GGUF version zof reads (2 or 3); " + kRedownload);
  }
  const uint64_t n_tensors = c.scalar<uint64_t>("tensor_count", "the header");
  const uint64_t n_kv = c.scalar<uint64_t>("metadata_kv_count", "the header");
  // A metadata entry takes at least 13 bytes and a tensor info 24: counts beyond the file's
  // bytes are refused before anything is allocated.
  if (n_kv > c.left() / 13)
    f.fail("metadata_kv_count", std::to_string(n_kv) + " metadata entries cannot fit in the file's " +
                                    std::to_string(f.map.size) + " bytes; " + kRedownload);
  if (n_tensors > c.left() / 24)
    f.fail("tensor_count", std::to_string(n_tensors) + " tensors cannot fit in the file's " +
                               std::to_string(f.map.size) + " bytes; " + kRedownload);
  f.metadata.reserve(size_t(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string where = "metadata entry " + std::to_string(k);
    std::string key = c.str(where, "the key", 65535);
    if (key.empty()) f.fail(where, "the key is empty; " + std::string(kRedownload));
    const uint32_t t = c.scalar<uint32_t>(key, "the value's type");
    if (t > static_cast<uint32_t>(ValueType::F64))
      f.fail(key, "value type " + std::to_string(t) + " is not a GGUF type; " + kRedownload);
    Value v = c.value(static_cast<ValueType>(t), key, 0);
    if (!f.by_key.emplace(key, f.metadata.size()).second)
      f.fail(key, "the key appears twice (a reader would keep one copy silently); " +
                      std::string(kRedownload));
    f.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const Value* a = f.by_key.count("general.alignment")
                           ? &f.metadata[f.by_key["general.alignment"]].second
                           : nullptr) {
    if (a->type != ValueType::U32)
      f.fail("general.alignment", std::string("is ") + value_type_name(a->type) +
                                      ", not UINT32; " + kRedownload);
    if (a->u == 0 || (a->u & (a->u - 1)))
      f.fail("general.alignment", std::to_string(a->u) + " is not a power of two; " + kRedownload);
    f.alignment = a->u;
  }

  f.tensors.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const std::string where = "tensor info " + std::to_string(k);
    TensorInfo t;
    t.name = c.str(where, "the tensor's name", 1 << 16);
    if (t.name.empty()) f.fail(where, "the tensor's name is empty; " + std::string(kRedownload));
    if (t.name.size() > kMaxName)
      f.fail("tensor " + t.name.substr(0, kMaxName) + "...",
             "the name is " + std::to_string(t.name.size()) + " bytes, longer than ggml's " +
                 std::to_string(kMaxName) + "; " + kRedownload);
    const std::string tn = "tensor " + t.name;
    const uint32_t n_dims = c.scalar<uint32_t>(tn, "the number of dimensions");
    if (n_dims == 0 || n_dims > kMaxDims)
      f.fail(tn, std::to_string(n_dims) + " dimensions; ggml tensors have 1 to " +
                     std::to_string(kMaxDims) + ": " + kRedownload);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.scalar<uint64_t>(tn, "the dimensions");
      if (n > uint64_t(INT64_MAX) || (n != 0 && numel > uint64_t(INT64_MAX) / n))
        f.fail(tn, "dimension " + std::to_string(n) + " makes more elements than an int64 counts; " +
                       kRedownload);
      numel *= n;
      t.dims.push_back(int64_t(n));
    }
    const uint32_t type = c.scalar<uint32_t>(tn, "the type");
    const TypeTraits* tt = type_traits(type);
    if (!tt) f.fail(tn, "type " + std::to_string(type) + " is not a ggml type; " + kRedownload);
    t.type = static_cast<TensorType>(type);
    if (t.dims[0] % tt->block)
      f.fail(tn, "dimensions " + dims_str(t.dims) + ": the first (" + std::to_string(t.dims[0]) +
                     ") is not a multiple of " + tt->name + "'s block of " +
                     std::to_string(tt->block) + "; " + kRedownload);
    t.offset = c.scalar<uint64_t>(tn, "the data offset");
    if (t.offset % f.alignment)
      f.fail(tn, "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                     std::to_string(f.alignment) + "; " + kRedownload);
    // Bytes: blocks of the first dimension times the others; each step checked against the
    // file's size before it is taken, which also rules out overflow (2^62 + 32 F32 values would
    // wrap to 128 bytes).
    const uint64_t blocks0 = uint64_t(t.dims[0] / tt->block);
    bool too_big = blocks0 > f.map.size / uint64_t(tt->bytes);
    uint64_t bytes = too_big ? 0 : blocks0 * uint64_t(tt->bytes);
    for (size_t d = 1; d < t.dims.size() && !too_big && bytes; ++d) {
      const uint64_t n = uint64_t(t.dims[d]);
      if (n && bytes > f.map.size / n) too_big = true;
      else bytes *= n;
    }
    if (numel == 0) bytes = 0, too_big = false;
    if (too_big)
      f.fail(tn, std::string(tt->name) + " dimensions " + dims_str(t.dims) +
                     " need more bytes than the file holds (" + std::to_string(f.map.size) + "); " +
                     kRedownload);
    t.nbytes = size_t(bytes);
    if (!f.by_name.emplace(t.name, f.tensors.size()).second)
      f.fail(tn, "the tensor is listed twice; " + std::string(kRedownload));
    f.tensors.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  const uint64_t pad = (f.alignment - c.at % f.alignment) % f.alignment;
  const uint64_t data_start = c.at + std::min(pad, c.left());
  const uint64_t data_size = f.map.size - data_start;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (TensorInfo& t : f.tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      f.fail("tensor " + t.name,
             "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                 ") runs past the end of the data section (" + std::to_string(data_size) +
                 " bytes): " + kRedownload);
    t.data = f.map.addr + data_start + t.offset;
    if (t.nbytes) spans.push_back({t.offset, t.offset + t.nbytes, &t.name});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      f.fail("tensor " + *spans[i].name, "its data overlap those of " + shown(*spans[i - 1].name, 80) + "; " +
                                             kRedownload);
}

}  // namespace

File::File() : impl_(std::make_unique<Impl>()) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path) {
  File file;
  Impl& f = *file.impl_;
  f.path = path;
  check_regular_file("GGUF " + path, path,
                     "give a GGUF file, or a Hugging Face model directory");
  // Without blocking: a file swapped for a FIFO since the check fails below instead of hanging.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) f.fail("", "cannot open: " + errno_str(errno) + "; check the path");
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    f.fail("", "not a regular file; give a GGUF file");
  }
  f.map.size = size_t(st.st_size);
  if (f.map.size < 24) {
    ::close(fd);
    f.fail("", "the file has " + std::to_string(f.map.size) +
                   " bytes, fewer than a GGUF header's 24: " + kRedownload);
  }
  void* p = mmap(nullptr, f.map.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) f.fail("", "cannot mmap: " + errno_str(e));
  f.map.addr = static_cast<const uint8_t*>(p);
  parse(f);
  return file;
}

const std::string& File::path() const { return impl_->path; }
uint32_t File::version() const { return impl_->version; }
uint64_t File::alignment() const { return impl_->alignment; }
const Metadata& File::metadata() const { return impl_->metadata; }

const Value* File::find(const std::string& key) const {
  const auto it = impl_->by_key.find(key);
  return it == impl_->by_key.end() ? nullptr : &impl_->metadata[it->second].second;
}

void File::fail(const std::string& field, const std::string& what) const {
  impl_->fail(field, what);
}

namespace {
const Value& required(const File& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v)
    f.fail(key, "the metadata key is missing; the file is not a complete llama.cpp model "
                "(convert it again with llama.cpp's convert_hf_to_gguf.py)");
  return *v;
}
[[noreturn]] void wrong_type(const File& f, const std::string& key, const Value& v,
                             const char* want) {
  f.fail(key, std::string("is ") + value_type_name(v.type) + ", expected " + want + "; " +
                  kRedownload);
}
}  // namespace

std::string File::str(const std::string& key) const {
  const Value& v = required(*this, key);
  if (v.type != ValueType::String) wrong_type(*this, key, v, "a STRING");
  return v.s;
}
std::string File::str_or(const std::string& key, const std::string& fallback) const {
  return find(key) ? str(key) : fallback;
}

uint64_t File::whole(const std::string& key) const {
  const Value& v = required(*this, key);
  if (!is_integer(v.type)) wrong_type(*this, key, v, "a whole number");
  if (is_signed(v.type)) {
    if (v.i < 0) fail(key, "is " + std::to_string(v.i) + ", expected a whole number; " + kRedownload);
    return uint64_t(v.i);
  }
  return v.u;
}
uint64_t File::whole_or(const std::string& key, uint64_t fallback) const {
  return find(key) ? whole(key) : fallback;
}

double File::real(const std::string& key) const {
  const Value& v = required(*this, key);
  double x;
  if (v.type == ValueType::F32 || v.type == ValueType::F64) x = v.f;
  else if (is_integer(v.type)) x = is_signed(v.type) ? double(v.i) : double(v.u);
  else wrong_type(*this, key, v, "a number");
  if (!std::isfinite(x)) fail(key, "is not a finite number; " + std::string(kRedownload));
  return x;
}
double File::real_or(const std::string& key, double fallback) const {
  return find(key) ? real(key) : fallback;
}

bool File::flag_or(const std::string& key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->type != ValueType::Bool) wrong_type(*this, key, *v, "a BOOL");
  return v->u != 0;
}

const std::vector<Value>& File::array(const std::string& key, ValueType elem) const {
  const Value& v = required(*this, key);
  if (v.type != ValueType::Array) wrong_type(*this, key, v, "an ARRAY");
  const bool ok = v.elem == elem || (is_integer(elem) && is_integer(v.elem));
  if (!ok)
    fail(key, std::string("is an ARRAY of ") + value_type_name(v.elem) + ", expected " +
                  (is_integer(elem) ? "integers" : value_type_name(elem)) + "; " + kRedownload);
  return v.items;
}

const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }

const TensorInfo* File::tensor(const std::string& name) const {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

bool is_file_path(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

void release_pages(const TensorInfo& t) {
  if (!t.data || t.nbytes == 0) return;
  const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
  const uintptr_t lo = ((uintptr_t)t.data + page - 1) / page * page;  // whole pages inside it
  const uintptr_t hi = ((uintptr_t)t.data + t.nbytes) / page * page;
  if (hi > lo) ::madvise((void*)lo, hi - lo, MADV_DONTNEED);  // advice: failure changes nothing
}

// ---- writing ----------------------------------------------------------------------------------

namespace {

void put_bytes(std::string& b, const void* p, size_t n) {
  b.append(static_cast<const char*>(p), n);
}
template <class T>
void put(std::string& b, T v) {
  put_bytes(b, &v, sizeof v);
}
void put_str(std::string& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b += s;
}

// A value's bytes; `where` names it for messages.
void put_value(std::string& b, const Value& v, ValueType type, const std::string& path,
               const std::string& where, int depth) {
  ZOF_CHECK(v.type == type, "cannot write " + path + ": metadata " + where + " is " +
                                value_type_name(v.type) + " in an array of " +
                                value_type_name(type));
  switch (type) {
    case ValueType::U8: put<uint8_t>(b, uint8_t(v.u)); break;
    case ValueType::I8: put<int8_t>(b, int8_t(v.i)); break;
    case ValueType::U16: put<uint16_t>(b, uint16_t(v.u)); break;
    case ValueType::I16: put<int16_t>(b, int16_t(v.i)); break;
    case ValueType::U32: put<uint32_t>(b, uint32_t(v.u)); break;
    case ValueType::I32: put<int32_t>(b, int32_t(v.i)); break;
    case ValueType::U64: put<uint64_t>(b, v.u); break;
    case ValueType::I64: put<int64_t>(b, v.i); break;
    case ValueType::F32: put<float>(b, float(v.f)); break;
    case ValueType::F64: put<double>(b, v.f); break;
    case ValueType::Bool: put<uint8_t>(b, v.u ? 1 : 0); break;
    case ValueType::String: put_str(b, v.s); break;
    case ValueType::Array:
      ZOF_CHECK(depth < kMaxArrayDepth, "cannot write " + path + ": metadata " + where +
                                            " nests arrays too deep");
      put<uint32_t>(b, static_cast<uint32_t>(v.elem));
      put<uint64_t>(b, v.items.size());
      for (size_t k = 0; k < v.items.size(); ++k)
        put_value(b, v.items[k], v.elem, path, where + "[" + std::to_string(k) + "]", depth + 1);
      break;
  }
}


}  // namespace

void write(const std::string& path, const Metadata& metadata,
           const std::vector<TensorOut>& tensors) {
  // Everything checked and the header built before the file system is touched.
  uint64_t alignment = kDefaultAlignment;
  std::set<std::string> keys;
  std::string head;
  put<uint32_t>(head, 0x46554747u);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors.size());
  put<uint64_t>(head, metadata.size());
  for (const auto& [key, v] : metadata) {
    ZOF_CHECK(!key.empty() && keys.insert(key).second,
              "cannot write " + path + ": metadata key '" + key + "' is empty or given twice");
    if (key == "general.alignment") {
      ZOF_CHECK(v.type == ValueType::U32 && v.u && !(v.u & (v.u - 1)),
                "cannot write " + path + ": general.alignment must be a UINT32 power of two");
      alignment = v.u;
    }
    put_str(head, key);
    put<uint32_t>(head, static_cast<uint32_t>(v.type));
    put_value(head, v, v.type, path, key, 0);
  }
  std::set<std::string> names;
  std::vector<uint64_t> offsets, sizes;
  uint64_t offset = 0;
  for (const TensorOut& t : tensors) {
    ZOF_CHECK(!t.name.empty() && t.name.size() <= kMaxName && names.insert(t.name).second,
              "cannot write " + path + ": tensor name '" + t.name +
                  "' is empty, longer than 63 bytes or given twice");
    ZOF_CHECK(t.type == TensorType::F32 || t.type == TensorType::F16 || t.type == TensorType::BF16,
              "cannot write " + path + ": tensor " + t.name + " must be F32, F16 or BF16");
    ZOF_CHECK(!t.dims.empty() && t.dims.size() <= kMaxDims && t.rows,
              "cannot write " + path + ": tensor " + t.name + " needs 1 to 4 dimensions and data");
    uint64_t numel = 1;
    for (int64_t d : t.dims) {
      ZOF_CHECK(d > 0 && numel <= (uint64_t(1) << 60) / uint64_t(d),
                "cannot write " + path + ": tensor " + t.name + " has dimensions " + dims_str(t.dims));
      numel *= uint64_t(d);
    }
    const uint64_t bytes = numel * (t.type == TensorType::F32 ? 4 : 2);
    put_str(head, t.name);
    put<uint32_t>(head, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, uint64_t(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offsets.push_back(offset);
    sizes.push_back(bytes);
    offset += (bytes + alignment - 1) / alignment * alignment;
  }
  head.append((alignment - head.size() % alignment) % alignment, '\0');

  AtomicFile tmp(path);

  tmp.write(head.data(), head.size());
  std::vector<float> wide;
  std::vector<uint16_t> half;
  const std::string zeros(size_t(alignment), '\0');
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorOut& t = tensors[k];
    const int64_t row = t.dims[0];
    int64_t rows = 1;
    for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
    const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 20) / row);  // rows per write
    for (int64_t r = 0; r < rows; r += chunk) {
      const int64_t m = std::min(chunk, rows - r);
      wide.resize(size_t(m * row));
      t.rows(r, m, wide.data());
      if (t.type == TensorType::F32) {
        tmp.write(wide.data(), wide.size() * 4);
        continue;
      }
      half.resize(wide.size());
      const bool bf = t.type == TensorType::BF16;
      for (size_t i = 0; i < wide.size(); ++i)
        half[i] = bf ? f32_to_bf16(wide[i]) : f32_to_f16(wide[i]);
      tmp.write(half.data(), half.size() * 2);
    }
    const uint64_t padded = (sizes[k] + alignment - 1) / alignment * alignment;
    // Every tensor padded, the last too: ggml's readers size the data section so.
    if (padded > sizes[k])
      tmp.write(zeros.data(), size_t(padded - sizes[k]));
  }
  tmp.commit();
}

}  // namespace zof::gguf
