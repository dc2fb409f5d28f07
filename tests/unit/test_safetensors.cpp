// safetensors: round trips in each dtype, sharded directories, the real stories260K checkpoint,
// one test per kind of malformed file, the atomic writer's failure modes, and interchange with
// Python's safetensors/torch.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/error.h"
#include "hf/safetensors.h"

namespace {

namespace fs = std::filesystem;
namespace st = zof::safetensors;
using json = nlohmann::json;

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("zof_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from raw parts, for the malformed-input tests.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t n = header_len.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(n >> (8 * i)));
  spit(path, bytes + header + data);
}

std::vector<float> ramp(size_t n, float scale = 1.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.1f);
  return v;
}

std::vector<float> read_f32(const st::TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  st::to_f32(t, v.data());
  return v;
}

// Runs f and expects zof::Error whose one-line message contains every word in words.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> words) {
  try {
    f();
    ADD_FAILURE() << "no zof::Error";
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// Opens path and expects an error naming it and the problem.
void expect_open_error(const std::string& path, std::initializer_list<std::string> words) {
  try {
    st::Archive::open_file(path);
    ADD_FAILURE() << "no zof::Error for " << path;
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(dir)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

void round_trip(zof::DType dtype) {
  TempDir d;
  const auto a = ramp(6 * 5, 3.f), b = ramp(7, 1000.f);
  const float scalar = 0.3f;
  const std::string path = d / "x.safetensors";
  st::write(path,
            {{"layer.a", dtype, {6, 5}, a.data()},
             {"b", dtype, {7}, b.data()},
             {"empty", dtype, {0, 4}, nullptr},
             {"scalar", dtype, {}, &scalar}},
            {{"format", "pt"}, {"note", "zof test"}});
  // The header is padded with spaces to a multiple of 8, as the Rust writer does.
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{"x.safetensors"});  // no temp file left

  auto ar = st::Archive::open_file(path);
  EXPECT_EQ(ar.source(), path);
  EXPECT_EQ(ar.names(), (std::vector<std::string>{"b", "empty", "layer.a", "scalar"}));
  EXPECT_EQ(ar.metadata().at("format"), "pt");
  EXPECT_EQ(ar.metadata().at("note"), "zof test");
  auto convert = [dtype](float x) {
    switch (dtype) {
      case zof::DType::F16: return zof::f16_to_f32(zof::f32_to_f16(x));
      case zof::DType::BF16: return zof::bf16_to_f32(zof::f32_to_bf16(x));
      default: return x;
    }
  };
  const auto& ta = ar.require("layer.a", {6, 5});
  EXPECT_EQ(ta.dtype, dtype);
  EXPECT_EQ(ta.nbytes, 30 * zof::dtype_size(dtype));
  EXPECT_EQ(ta.file, path);
  const auto va = read_f32(ta);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(va[i], convert(a[i])) << i;
  const auto vb = read_f32(ar.require("b", {7}));
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(vb[i], convert(b[i])) << i;
  EXPECT_EQ(ar.require("empty", {0, 4}).nbytes, 0u);
  EXPECT_EQ(read_f32(ar.require("scalar", {}))[0], convert(scalar));
  EXPECT_EQ(ar.find("nope"), nullptr);
}

TEST(Safetensors, RoundTripF32) { round_trip(zof::DType::F32); }
TEST(Safetensors, RoundTripF16) { round_trip(zof::DType::F16); }
TEST(Safetensors, RoundTripBF16) { round_trip(zof::DType::BF16); }

TEST(Safetensors, LargeTensorConversion) {  // big enough for the parallel to_f32 path
  TempDir d;
  const auto a = ramp(300000, 50.f);
  st::write(d / "x.safetensors", {{"h", zof::DType::F16, {300000}, a.data()}, {"b", zof::DType::BF16, {300000}, a.data()}});
  auto ar = st::Archive::open_file(d / "x.safetensors");
  const auto h = read_f32(ar.require("h", {300000})), b = read_f32(ar.require("b", {300000}));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(h[i], zof::f16_to_f32(zof::f32_to_f16(a[i])));
    ASSERT_EQ(b[i], zof::bf16_to_f32(zof::f32_to_bf16(a[i])));
  }
}

// A loader drops a tensor's pages once read (release_pages): the data read again are the same
// (the pages come back from the file), and the resident set shrinks by about the tensor.
TEST(Safetensors, ReleasedPagesReadBackTheSame) {
  TempDir d;
  const auto a = ramp(4 << 20, 3.f);  // 16 MB
  std::vector<uint16_t> bits(a.size());
  for (size_t i = 0; i < a.size(); ++i) bits[i] = zof::f32_to_bf16(a[i]);
  st::TensorOut t{"w", zof::DType::BF16, {(int64_t)a.size()}, nullptr};
  t.bf16 = bits.data();  // written from bf16 as is
  st::write(d / "x.safetensors", {t});
  auto ar = st::Archive::open_file(d / "x.safetensors");
  const st::TensorInfo& w = ar.require("w", {(int64_t)a.size()});
  auto resident_kb = [] {
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    return 0L;
  };
  const auto first = read_f32(w);
  const long before = resident_kb();
  st::release_pages(w);
  const long after = resident_kb();
  EXPECT_LT(after, before - 4000) << "about 8 MB of pages should have left the resident set";
  const auto again = read_f32(w);
  ASSERT_EQ(first, again);
  for (size_t i = 0; i < a.size(); i += 4099) ASSERT_EQ(first[i], zof::bf16_to_f32(bits[i]));
}

TEST(Safetensors, OverwritesExistingFile) {
  TempDir d;
  const auto a = ramp(4), b = ramp(8);
  st::write(d / "x.safetensors", {{"a", zof::DType::F32, {4}, a.data()}});
  st::write(d / "x.safetensors", {{"b", zof::DType::F32, {2, 4}, b.data()}});
  auto ar = st::Archive::open_file(d / "x.safetensors");
  EXPECT_EQ(ar.names(), std::vector<std::string>{"b"});
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{"x.safetensors"});
}

// Writes a two-shard model directory holding a, b (shard 1) and c (shard 2).
void write_sharded(const TempDir& d, const std::vector<float>& v) {
  st::write(d / "model-00001-of-00002.safetensors",
            {{"a", zof::DType::F32, {2, 3}, v.data()}, {"b", zof::DType::BF16, {4}, v.data()}}, {{"format", "pt"}});
  st::write(d / "model-00002-of-00002.safetensors", {{"c", zof::DType::F16, {5}, v.data()}}, {{"format", "pt2"}});
  json idx = {{"metadata", {{"total_size", 42}}},
              {"weight_map",
               {{"a", "model-00001-of-00002.safetensors"},
                {"b", "model-00001-of-00002.safetensors"},
                {"c", "model-00002-of-00002.safetensors"}}}};
  spit(d / "model.safetensors.index.json", idx.dump(2));
}

TEST(Safetensors, ShardedRoundTrip) {
  TempDir d;
  const auto v = ramp(6);
  write_sharded(d, v);
  auto ar = st::Archive::open_dir(d.path.string());
  EXPECT_EQ(ar.source(), d.path.string());
  EXPECT_EQ(ar.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ar.metadata().at("format"), "pt");  // of the first shard
  EXPECT_EQ(read_f32(ar.require("a", {2, 3})), v);
  EXPECT_EQ(ar.require("c", {5}).file, d / "model-00002-of-00002.safetensors");
  EXPECT_EQ(read_f32(ar.require("c", {5}))[4], zof::f16_to_f32(zof::f32_to_f16(v[4])));
  // A missing tensor names the index.
  expect_error([&] { ar.require("zzz", {1}); }, {"missing tensor zzz", d / "model.safetensors.index.json"});
}

TEST(Safetensors, OpenDirPrefersSingleFile) {
  TempDir d;
  const auto v = ramp(6);
  write_sharded(d, v);
  st::write(d / "model.safetensors", {{"only", zof::DType::F32, {6}, v.data()}});
  auto ar = st::Archive::open_dir(d.path.string());
  EXPECT_EQ(ar.names(), std::vector<std::string>{"only"});
  expect_error([&] { ar.require("model.layers.0.self_attn.q_proj.weight", {64, 64}); },
               {"missing tensor model.layers.0.self_attn.q_proj.weight in " + (d / "model.safetensors")});
}

TEST(Safetensors, OpenDirWithNeither) {
  TempDir d;
  expect_error([&] { st::Archive::open_dir(d.path.string()); },
               {"no model.safetensors or model.safetensors.index.json in " + d.path.string()});
}

TEST(Safetensors, Stories260K) {
  const std::string dir = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  auto ar = st::Archive::open_dir(dir);
  const auto names = ar.names();
  EXPECT_EQ(names.size(), 2u + 5u * 9u);
  EXPECT_EQ(ar.metadata().at("format"), "pt");
  const auto& emb = ar.require("model.embed_tokens.weight", {512, 64});
  EXPECT_EQ(emb.dtype, zof::DType::F32);
  EXPECT_EQ(emb.file, dir + "/model.safetensors");
  int64_t total = 0;
  for (const auto& n : names) total += ar.find(n)->numel();
  EXPECT_EQ(total, 260032);
  for (int l = 0; l < 5; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ar.require(p + "self_attn.q_proj.weight", {64, 64});
    ar.require(p + "self_attn.k_proj.weight", {32, 64});
    ar.require(p + "self_attn.v_proj.weight", {32, 64});
    ar.require(p + "self_attn.o_proj.weight", {64, 64});
    ar.require(p + "mlp.gate_proj.weight", {172, 64});
    ar.require(p + "mlp.up_proj.weight", {172, 64});
    ar.require(p + "mlp.down_proj.weight", {64, 172});
    ar.require(p + "input_layernorm.weight", {64});
    ar.require(p + "post_attention_layernorm.weight", {64});
  }
  const auto norm = read_f32(ar.require("model.norm.weight", {64}));
  for (float x : norm) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(ar.find("lm_head.weight"), nullptr);  // tied
  expect_error([&] { ar.require("model.embed_tokens.weight", {512, 65}); },
               {dir + "/model.safetensors", "model.embed_tokens.weight", "[512, 64]", "[512, 65]"});
}

TEST(Safetensors, RequireWrongShape) {
  TempDir d;
  const auto v = ramp(6);
  st::write(d / "m.safetensors", {{"w", zof::DType::F32, {2, 3}, v.data()}});
  auto ar = st::Archive::open_file(d / "m.safetensors");
  expect_error([&] { ar.require("w", {3, 2}); }, {d / "m.safetensors", "tensor w", "shape [2, 3]", "expected [3, 2]"});
  expect_error([&] { ar.require("v", {3, 2}); }, {"missing tensor v in " + (d / "m.safetensors")});
}

// ---- malformed files ----------------------------------------------------------------------------

TEST(SafetensorsBad, MissingFile) {
  TempDir d;
  expect_open_error(d / "absent.safetensors", {"cannot open"});
}

TEST(SafetensorsBad, ShorterThanEightBytes) {
  TempDir d;
  spit(d / "x.safetensors", "abc");
  expect_open_error(d / "x.safetensors", {"truncated", "3 bytes"});
  spit(d / "x.safetensors", "");
  expect_open_error(d / "x.safetensors", {"truncated"});
}

TEST(SafetensorsBad, DataCutShort) {
  TempDir d;
  const auto v = ramp(64);
  st::write(d / "x.safetensors", {{"w", zof::DType::F32, {64}, v.data()}});
  const std::string full = slurp(d / "x.safetensors");
  spit(d / "x.safetensors", full.substr(0, full.size() - 10));
  expect_open_error(d / "x.safetensors", {"tensor w", "truncated", "re-download"});
}

TEST(SafetensorsBad, HeaderLengthPastEnd) {
  TempDir d;
  write_raw(d / "x.safetensors", "{}", "", 1000);
  expect_open_error(d / "x.safetensors", {"truncated", "header says 1000", "file has 2"});
  write_raw(d / "x.safetensors", "{}", "", std::numeric_limits<uint64_t>::max());
  expect_open_error(d / "x.safetensors", {"100 MB"});
  write_raw(d / "x.safetensors", "{}", "", 200'000'000);
  expect_open_error(d / "x.safetensors", {"100 MB"});
}

TEST(SafetensorsBad, MalformedHeaderJson) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [1], )", "abcd");
  expect_open_error(d / "x.safetensors", {"malformed header JSON"});
  write_raw(d / "x.safetensors", std::string("{\"\xff\": 1}"), "");  // invalid UTF-8
  expect_open_error(d / "x.safetensors", {"malformed header JSON"});
}

TEST(SafetensorsBad, HeaderNotAnObject) {
  TempDir d;
  write_raw(d / "x.safetensors", "[1, 2, 3]", "");
  expect_open_error(d / "x.safetensors", {"not an object"});
  write_raw(d / "x.safetensors", R"({"w": [1, 2]})", "");
  expect_open_error(d / "x.safetensors", {"tensor w", "not an object"});
}

TEST(SafetensorsBad, EntryFieldsMissing) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "dtype"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "shape"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "data_offsets"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "data_offsets"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "dtype"});
}

TEST(SafetensorsBad, UnknownOrUnsupportedDtype) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", "abcdefgh");
  expect_open_error(d / "x.safetensors", {"tensor ids", "I64", "not supported", "F32, F16 and BF16"});
  write_raw(d / "x.safetensors", R"({"q": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 8]}})", "abcdefgh");
  expect_open_error(d / "x.safetensors", {"tensor q", "unknown dtype", "Q4_K"});
}

TEST(SafetensorsBad, ShapeByteRangeMismatch) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
            std::string(24, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "needs 24 bytes", "span 20"});
  // A shape whose byte count overflows 64 bits.
  write_raw(d / "x.safetensors",
            R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", "abcd");
  expect_open_error(d / "x.safetensors", {"tensor w", "needs more bytes"});
}

TEST(SafetensorsBad, OffsetsOutOfRange) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "past the end"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "end before"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "data_offsets"});
}

TEST(SafetensorsBad, OverlappingOffsets) {
  TempDir d;
  write_raw(d / "x.safetensors",
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(12, 'x'));
  expect_open_error(d / "x.safetensors", {"overlap", "tensor b", "a ["});
}

TEST(SafetensorsBad, NegativeOrNonIntegerShape) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "negative"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "non-integer"});
  write_raw(d / "x.safetensors", R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})",
            std::string(8, 'x'));
  expect_open_error(d / "x.safetensors", {"tensor w", "shape"});
}

TEST(SafetensorsBad, MetadataNotStringMap) {
  TempDir d;
  write_raw(d / "x.safetensors", R"({"__metadata__": {"total": 3}})", "");
  expect_open_error(d / "x.safetensors", {"__metadata__", "total"});
  write_raw(d / "x.safetensors", R"({"__metadata__": "pt"})", "");
  expect_open_error(d / "x.safetensors", {"__metadata__"});
}

TEST(SafetensorsBad, IndexNamesMissingShard) {
  TempDir d;
  const auto v = ramp(6);
  write_sharded(d, v);
  fs::remove(d / "model-00002-of-00002.safetensors");
  expect_error([&] { st::Archive::open_dir(d.path.string()); },
               {d / "model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"});
}

TEST(SafetensorsBad, MalformedIndex) {
  TempDir d;
  spit(d / "model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {d / "model.safetensors.index.json", "malformed"});
  spit(d / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {d / "model.safetensors.index.json", "weight_map"});
  spit(d / "model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {d / "model.safetensors.index.json", "tensor a"});
  spit(d / "model.safetensors.index.json", R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {d / "model.safetensors.index.json", "outside"});
}

TEST(SafetensorsBad, IndexDisagreesWithShards) {
  TempDir d;
  const auto v = ramp(6);
  write_sharded(d, v);
  const std::string idx = d / "model.safetensors.index.json";
  // A tensor the index lists but no shard holds.
  spit(idx, json{{"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"zz", "model-00002-of-00002.safetensors"}}}}.dump());
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {idx, "tensor zz", "does not hold"});
  // A tensor mapped to the wrong shard.
  spit(idx, json{{"weight_map", {{"a", "model-00002-of-00002.safetensors"}, {"c", "model-00001-of-00002.safetensors"}}}}.dump());
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {idx, "tensor"});
  // The same tensor in two shards.
  st::write(d / "model-00002-of-00002.safetensors", {{"a", zof::DType::F32, {2, 3}, v.data()}});
  spit(idx, json{{"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}}.dump());
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {idx, "tensor a", "two shards"});
  // A malformed shard names the shard.
  spit(d / "model-00002-of-00002.safetensors", "xx");
  expect_error([&] { st::Archive::open_dir(d.path.string()); }, {d / "model-00002-of-00002.safetensors", "truncated"});
}

// ---- atomic writer ------------------------------------------------------------------------------

// A name given twice in a header (JSON keeps the last copy silently) is refused by name; so is
// a key repeated inside an entry, and a tensor named twice in an index's weight_map.
TEST(SafetensorsBad, DuplicateNames) {
  TempDir d;
  const std::string path = d / "dup.safetensors";
  const std::string data(16, '\0');
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            data);
  expect_open_error(path, {"tensor a", "twice"});
  write_raw(path, R"({"a":{"dtype":"F32","shape":[2],"shape":[4],"data_offsets":[0,16]}})", data);
  expect_open_error(path, {"tensor a", "\"shape\" twice"});
  const auto v = ramp(8);
  write_sharded(d, v);
  spit(d / "model.safetensors.index.json",
       R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",)"
       R"( "c": "model-00002-of-00002.safetensors", "a": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { st::Archive::open_dir(d.path.string()); },
               {"model.safetensors.index.json", "weight_map names tensor a twice"});
}

TEST(SafetensorsWrite, MissingDirectory) {
  TempDir d;
  const auto v = ramp(4);
  const std::string path = d / "no/such/dir/x.safetensors";
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {4}, v.data()}}); }, {path, "directory"});
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{});
}

TEST(SafetensorsWrite, NonWritableDirectory) {
  TempDir d;
  const auto v = ramp(4);
  fs::create_directories(d.path / "ro");
  fs::permissions(d.path / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  std::string path = d / "ro/x.safetensors";
  if (::access((d.path / "ro").c_str(), W_OK) == 0) path = "/proc/zof_test_x.safetensors";  // root ignores modes
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {4}, v.data()}}); }, {path});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir_entries(d.path / "ro").empty());
}

TEST(SafetensorsWrite, InvalidTensorsLeaveExistingFile) {
  TempDir d;
  const std::string path = d / "x.safetensors";
  spit(path, "precious");
  const auto v = ramp(4);
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {4}, v.data()}, {"a", zof::DType::F32, {4}, v.data()}}); },
               {path, "tensor a", "twice"});
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {-4}, v.data()}}); }, {path, "negative"});
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {4}, nullptr}}); }, {path, "no data"});
  expect_error([&] { st::write(path, {{"__metadata__", zof::DType::F32, {4}, v.data()}}); }, {path, "__metadata__"});
  EXPECT_EQ(slurp(path), "precious");
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{"x.safetensors"});
}

// A write that fails half way (the file size limit makes write() return EFBIG) removes its
// temporary file and leaves the existing file untouched.
TEST(SafetensorsWrite, FailureMidWriteLeavesExistingFile) {
  TempDir d;
  const std::string path = d / "x.safetensors";
  spit(path, "precious");
  const auto v = ramp(1 << 16);
  struct rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  bool threw = false;
  std::string msg;
  try {
    st::write(path, {{"a", zof::DType::F32, {1 << 16}, v.data()}});
  } catch (const zof::Error& e) {
    threw = true;
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(slurp(path), "precious");
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{"x.safetensors"});
}

TEST(SafetensorsWrite, RenameFailureLeavesNothing) {
  TempDir d;
  const std::string path = d / "x.safetensors";
  fs::create_directories(path);  // a directory where the file should go: rename fails
  const auto v = ramp(4);
  expect_error([&] { st::write(path, {{"a", zof::DType::F32, {4}, v.data()}}); }, {path, "rename"});
  EXPECT_EQ(dir_entries(d.path), std::vector<std::string>{"x.safetensors"});
  EXPECT_TRUE(fs::is_directory(path));
}

// ---- interchange with Python --------------------------------------------------------------------

// Our file loads in Python's safetensors (the reference implementation) bit for bit, with numpy's
// fp32 -> fp16 conversion as the reference, and torch's fp32 -> bf16 when torch is installed
// (numpy has no bf16); a file Python writes loads here. CI installs safetensors and numpy.
TEST(SafetensorsPython, InterchangeWithReferenceImplementation) {
  const char* env = std::getenv("ZOF_PYTHON");
  const std::string py = env && *env ? env : "python3";
  const std::string probe = "'" + py + "' -c 'import safetensors.numpy, numpy' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    if (zof::test::in_ci()) FAIL() << py << " with safetensors and numpy is required under CI (set ZOF_PYTHON)";
    GTEST_SKIP() << py << " with safetensors and numpy not available";
  }
  TempDir d;
  std::vector<float> x = ramp(40, 70000.f);
  const float edge[] = {0.f, -0.f, 65504.f, 65520.f, -65536.f, 1e-8f, 5.9604645e-08f, 2.9802322e-08f,
                        1.f + 1.f / 2048, 1.00390625f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), std::begin(edge), std::end(edge));
  const int64_t n = int64_t(x.size());
  st::write(d / "ours.safetensors",
            {{"x32", zof::DType::F32, {n}, x.data()},
             {"x16", zof::DType::F16, {n}, x.data()},
             {"m", zof::DType::F32, {5, 8}, x.data()}},
            {{"format", "pt"}});
  st::write(d / "ours_bf16.safetensors", {{"xbf", zof::DType::BF16, {n}, x.data()}}, {{"format", "pt"}});
  const std::string script = d / "check.py";
  spit(script, R"PY(
import sys, warnings
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
warnings.filterwarnings("ignore")
d = sys.argv[1]
t = load_file(d + "/ours.safetensors")
with safe_open(d + "/ours.safetensors", "np") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
x = t["x32"]
assert x.dtype == np.float32 and t["x16"].dtype == np.float16
# Bit for bit, but NaN payloads may differ: only NaN-ness counts.
ok = ~np.isnan(x)
assert np.array_equal(x.astype(np.float16).view(np.int16)[ok], t["x16"].view(np.int16)[ok]), "x16 differs"
assert np.isnan(t["x16"][~ok].astype(np.float32)).all(), "x16 lost a NaN"
assert t["m"].shape == (5, 8) and np.array_equal(t["m"].flatten(), x[:40])
save_file({"y16": x.astype(np.float16), "y32": x[:40].reshape(8, 5).copy()},
          d + "/theirs.safetensors", metadata={"format": "pt"})
try:
    import torch
    from safetensors.torch import load_file as load_pt
    tb = load_pt(d + "/ours_bf16.safetensors")["xbf"]
    xt = torch.from_numpy(x)
    okt = ~torch.isnan(xt)
    assert tb.dtype == torch.bfloat16
    assert torch.equal(xt.to(torch.bfloat16).view(torch.int16)[okt], tb.view(torch.int16)[okt]), "xbf differs"
    print("bf16 checked against torch")
except ImportError:
    pass
print("python ok")
)PY");
  const std::string cmd = "'" + py + "' '" + script + "' '" + d.path.string() + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t k = fread(buf, 1, sizeof buf, p)) out.append(buf, k);
  const int rc = pclose(p);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("python ok"), std::string::npos) << out;

  auto ar = st::Archive::open_file(d / "theirs.safetensors");
  EXPECT_EQ(ar.metadata().at("format"), "pt");
  const auto y16 = read_f32(ar.require("y16", {n}));
  for (int64_t i = 0; i < n; ++i) {
    const float a = zof::f16_to_f32(zof::f32_to_f16(x[size_t(i)]));
    if (std::isnan(x[size_t(i)])) {
      EXPECT_TRUE(std::isnan(y16[size_t(i)]));
      continue;
    }
    EXPECT_EQ(y16[size_t(i)], a) << i;
  }
  const auto y32 = read_f32(ar.require("y32", {8, 5}));
  EXPECT_TRUE(std::equal(y32.begin(), y32.end(), x.begin()));
}

}  // namespace
