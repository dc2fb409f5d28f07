// GGUF, llama.cpp's model file: a memory-mapped reader that validates every count, length, type,
// dimension and offset before anything is read; the dequantization of the block types zof reads
// (gguf_quants.cpp); and an atomic writer of F32/F16/BF16 files. The format is llama.cpp's
// docs/gguf.md (version 3); gguf-py (PyPI gguf) is the reference we match.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zof::gguf {

// Metadata value types (gguf_type).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12
};
const char* value_type_name(ValueType t);  // "UINT32", as gguf-py names them

// A string of the file as an error shows it: at most `max` bytes (then "..."), control bytes as
// \xNN, so that a hostile value cannot make the one-line error long or break it into lines.
std::string shown(const std::string& s, size_t max = 40);

// One metadata value. Integers are held in u (unsigned types, bool) or i (signed types), floats
// in f, strings in s; an array has its element type and its items (each of that type).
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  ValueType elem = ValueType::U8;
  std::vector<Value> items;

  static Value of_u32(uint32_t v);
  static Value of_i32(int32_t v);
  static Value of_f32(float v);
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  static Value of_array(ValueType elem, std::vector<Value> items);
};

// Metadata in file order: (key, value).
using Metadata = std::vector<std::pair<std::string, Value>>;

// ggml's tensor types: the ones zof reads (dequantized to fp32) and writes, and the names of the
// others for messages.
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30
};
struct TypeTraits {
  uint32_t id;
  const char* name;    // "Q4_K"
  int64_t block;       // elements per block
  int64_t bytes;       // bytes per block
  bool readable;       // zof dequantizes it
};
const TypeTraits* type_traits(uint32_t id);  // null: an id ggml does not define
std::string readable_type_names();           // "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K"

// The n values (a whole number of blocks) of type `type` at src as fp32, bit for bit as gguf-py's
// gguf.quants.dequantize computes them (fp32 arithmetic, no fused multiply-adds).
void dequantize(TensorType type, const uint8_t* src, int64_t n, float* out);

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::F32;
  std::vector<int64_t> dims;  // as GGUF lists them: the contiguous dimension first
  uint64_t offset = 0;        // from the start of the data section
  const uint8_t* data = nullptr;  // into the mapped file; valid while the File lives
  size_t nbytes = 0;
  int64_t numel() const;
  // Outermost first, as Hugging Face and numpy write shapes: dims reversed.
  std::vector<int64_t> shape() const;
};

// One GGUF file, mapped and validated on open. Every problem is one zof::Error naming the file,
// the field (a metadata key, a tensor) and the fix.
class File {
 public:
  static File open(const std::string& path);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;
  // The metadata in file order.
  const Metadata& metadata() const;
  const Value* find(const std::string& key) const;  // null when absent
  // A key's value as one kind, refused (naming the key, its type and what was expected) when it
  // is another; the _or forms give `fallback` when the key is absent.
  std::string str(const std::string& key) const;
  std::string str_or(const std::string& key, const std::string& fallback) const;
  uint64_t whole(const std::string& key) const;  // any integer type, not negative
  uint64_t whole_or(const std::string& key, uint64_t fallback) const;
  double real(const std::string& key) const;     // a float or an integer
  double real_or(const std::string& key, double fallback) const;
  bool flag_or(const std::string& key, bool fallback) const;
  // An array whose elements are all of type elem.
  const std::vector<Value>& array(const std::string& key, ValueType elem) const;

  const std::vector<TensorInfo>& tensors() const;  // in file order
  const TensorInfo* tensor(const std::string& name) const;  // null when absent

  // zof::Error "GGUF PATH, FIELD: WHAT".
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;

  struct Impl;  // the mapping and what was parsed from it (gguf.cpp)

 private:
  File();
  std::unique_ptr<Impl> impl_;
};

// Whether a --model path names a file (read as GGUF) rather than a directory (Hugging Face).
bool is_file_path(const std::string& path);

// Drops a tensor's pages of the mapped file from this process's memory (as
// safetensors::release_pages).
void release_pages(const TensorInfo& t);

// ---- writing ----------------------------------------------------------------------------------

struct TensorOut {
  std::string name;
  TensorType type = TensorType::F32;  // F32, F16 or BF16
  std::vector<int64_t> dims;          // the contiguous dimension first
  // Fills out with `rows` rows of dims[0] fp32 values from row `first` on (a row: dims[0]
  // contiguous values; rows counted over all the outer dimensions). Converted to `type` by the
  // writer (round to nearest even).
  std::function<void(int64_t first, int64_t rows, float* out)> rows;
};

// Writes a GGUF version 3 file atomically (PATH.tmp.PID, fsync, rename, fsync of the directory):
// the metadata in the order given (general.alignment, when given, a power of two as UINT32, sets
// the data alignment; else 32), then the tensors. Names must be unique; zof::Error says what is
// wrong before anything is written, and on failure nothing is left at path.
void write(const std::string& path, const Metadata& metadata,
           const std::vector<TensorOut>& tensors);

}  // namespace zof::gguf
