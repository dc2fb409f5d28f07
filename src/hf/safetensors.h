// safetensors: memory-mapped, fully validated reader (single file or sharded with
// model.safetensors.index.json) and an atomic writer (temporary file, fsync, rename).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zof/dtype.h"

namespace zof::safetensors {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file; valid while the Archive lives
  size_t nbytes = 0;
  std::string file;  // path of the file that holds it, for error messages
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// A set of tensors backed by one or more memory-mapped files. Every offset, size, dtype and shape
// is validated when the file is opened, before any tensor is read; problems throw zof::Error
// naming the file and the tensor.
class Archive {
 public:
  // A model directory: model.safetensors, or model.safetensors.index.json and its shards.
  static Archive open_dir(const std::string& dir);
  // One .safetensors file.
  static Archive open_file(const std::string& path);

  Archive(Archive&&) noexcept;
  Archive& operator=(Archive&&) noexcept;
  ~Archive();

  const TensorInfo* find(const std::string& name) const;  // null when absent
  // The tensor, which must exist with exactly this shape; otherwise zof::Error naming the file,
  // the tensor, the expected and the found shape.
  const TensorInfo& require(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;  // sorted
  const std::map<std::string, std::string>& metadata() const;  // __metadata__ of the first file
  std::string source() const;  // the path given to open_*

 private:
  Archive();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Drops the tensor's pages of the mapped file from this process's memory (they are read from
// the file again if touched): a loader done with a tensor keeps the resident set to what it
// holds itself (a 13 GB model read into bf16 would otherwise also count 13 GB of mapped file).
void release_pages(const TensorInfo& t);
// The same for elements [first, first + n) of the tensor (a loader going a piece at a time).
void release_pages(const TensorInfo& t, int64_t first, int64_t n);

// Converts any stored dtype to fp32: out must hold t.numel() floats.
void to_f32(const TensorInfo& t, float* out);
// Elements [first, first + n) of the tensor into out[0, n).
void to_f32(const TensorInfo& t, float* out, int64_t first, int64_t n);

struct TensorOut {
  std::string name;
  DType dtype;  // stored dtype; data is converted from fp32 (round to nearest even)
  std::vector<int64_t> shape;
  const float* data;
  // The data as bf16 instead (data null): written as is in bf16, widened for fp32, through
  // fp32 for f16 (a bf16 master's weights, never widened whole in memory).
  const uint16_t* bf16 = nullptr;
};

// Writes one safetensors file atomically: path.tmp.<pid>, fsync, rename, fsync of the directory.
// Tensors are laid out in the order given; names must be unique. On failure nothing is left at
// path (an existing file there is untouched) and zof::Error says why.
// With `open`, tensor i's data may be given as it is reached: open(i, t) is called on a copy
// of tensors[i] just before its bytes are written and points t.data (or t.bf16) at them, valid
// until the next call (a model held block by block through a disk tier).
using OpenTensor = std::function<void(size_t, TensorOut&)>;
void write(const std::string& path, const std::vector<TensorOut>& tensors,
           const std::map<std::string, std::string>& metadata = {},
           const OpenTensor& open = nullptr);

}  // namespace zof::safetensors
