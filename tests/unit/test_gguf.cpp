// GGUF (hf/gguf.h): the dequantization of every type zof reads against gguf-py's, bit for bit
// (tests/golden/gguf/quants.gguf, written by tests/reference/make_gguf_golden.py); the reader on
// a valid file, on every truncation of it and on one hostile edit per field; the writer's round
// trip (every metadata type, F32/F16/BF16 tensors) and its refusals.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common.h"
#include "hf/gguf.h"
#include "hf/gguf_llama.h"
#include "zof/dtype.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace {

namespace fs = std::filesystem;
namespace gg = zof::gguf;

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("zof_gguf_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

// ---- dequantization against gguf-py --------------------------------------------------------

// Every element of every type bit for bit; ZOF_GGUF_QUANTS names a larger file of the same
// layout (make_gguf_golden.py --elements N --out FILE).
TEST(GgufDequantize, MatchesGgufPyBitForBit) {
  const char* env = std::getenv("ZOF_GGUF_QUANTS");
  const std::string path =
      env ? env : zof::test::source_dir() + "/tests/golden/gguf/quants.gguf";
  ZOF_REQUIRE_PATH(path);
  const gg::File f = gg::File::open(path);
  int types = 0;
  for (const char* name : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}) {
    SCOPED_TRACE(name);
    const gg::TensorInfo* q = f.tensor(name);
    const gg::TensorInfo* want = f.tensor(std::string(name) + ".expected");
    ASSERT_TRUE(q && want);
    EXPECT_STREQ(gg::type_traits(static_cast<uint32_t>(q->type))->name, name);
    ASSERT_EQ(want->type, gg::TensorType::F32);
    ASSERT_EQ(q->numel(), want->numel());
    const int64_t n = q->numel();
    std::vector<float> got(n);
    gg::dequantize(q->type, q->data, n, got.data());
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&got[i], want->data + 4 * i, 4) != 0) differ += 1, first = first < 0 ? i : first;
    EXPECT_EQ(differ, 0) << differ << " of " << n << " elements differ from gguf-py's, first at "
                         << first;
    std::printf("[ gguf     ] %-5s %lld elements bit-identical to gguf-py\n", name,
                (long long)(n - differ));
    ++types;
  }
  EXPECT_EQ(types, 8);
}

// ---- a GGUF file built field by field, for the reader's refusals ------------------------------

struct Bytes {
  std::string b;
  template <class T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
};

struct Kv {
  std::string key;
  uint32_t type;
  std::string value;  // the value's bytes
};
struct Ti {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

// A small valid file: four metadata entries (a string, a u32, an array of strings, the
// alignment) and two tensors, "a" (F32 [8]) and "b" (Q8_0 [32, 2]), then their data.
struct Doc {
  uint32_t magic = 0x46554747u, version = 3;
  std::optional<uint64_t> n_tensors, n_kv;
  std::vector<Kv> kvs;
  std::vector<Ti> tis;
  uint64_t alignment = 32;
  std::string data;

  Doc() {
    kvs.push_back({"general.architecture", 8, Bytes().str("llama").b});
    kvs.push_back({"llama.block_count", 4, Bytes().put<uint32_t>(2).b});
    kvs.push_back({"general.languages", 9, Bytes().put<uint32_t>(8).put<uint64_t>(2).str("en").str("fr").b});
    kvs.push_back({"general.alignment", 4, Bytes().put<uint32_t>(32).b});
    tis.push_back({"a", {8}, 0, 0});
    tis.push_back({"b", {32, 2}, 8, 32});
    Bytes d;
    for (int i = 0; i < 8; ++i) d.put<float>(float(i) - 3.5f);
    for (int blk = 0; blk < 2; ++blk) {
      d.put<uint16_t>(zof::f32_to_f16(0.5f * float(blk + 1)));
      for (int j = 0; j < 32; ++j) d.put<int8_t>(int8_t(j - 16));
    }
    data = d.b;
  }
  std::string bytes() const {
    Bytes o;
    o.put(magic).put(version).put<uint64_t>(n_tensors.value_or(tis.size()))
        .put<uint64_t>(n_kv.value_or(kvs.size()));
    for (const Kv& k : kvs) {
      o.str(k.key).put(k.type);
      o.b += k.value;
    }
    for (const Ti& t : tis) {
      o.str(t.name).put<uint32_t>(uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) o.put(d);
      o.put(t.type).put(t.offset);
    }
    o.b.append((alignment - o.b.size() % alignment) % alignment, '\0');
    return o.b + data;
  }
};

TEST(GgufReader, ReadsAValidFile) {
  TempDir dir;
  const fs::path p = dir.path / "ok.gguf";
  write_file(p, Doc().bytes());
  const gg::File f = gg::File::open(p.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.str("general.architecture"), "llama");
  EXPECT_EQ(f.whole("llama.block_count"), 2u);
  EXPECT_EQ(f.real("llama.block_count"), 2.0);
  const auto& langs = f.array("general.languages", gg::ValueType::String);
  ASSERT_EQ(langs.size(), 2u);
  EXPECT_EQ(langs[1].s, "fr");
  EXPECT_EQ(f.whole_or("absent", 7), 7u);
  ASSERT_EQ(f.tensors().size(), 2u);
  const gg::TensorInfo* b = f.tensor("b");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->shape(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(b->nbytes, 68u);
  std::vector<float> v(64);
  gg::dequantize(b->type, b->data, 64, v.data());
  EXPECT_EQ(v[0], -16 * 0.5f);
  EXPECT_EQ(v[63], 15 * 1.0f);
  // Asking a value as another kind names the key and both types.
  try {
    f.whole("general.architecture");
    FAIL();
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture: is STRING, expected a whole number"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(f.str("missing.key"), zof::Error);
  // A --model file is a GGUF file, or named as what it is not.
  EXPECT_NO_THROW(zof::check_model_dir("--model", p.string()));
  write_file(dir.path / "text.txt", "hello");
  try {
    zof::check_model_dir("--model", (dir.path / "text.txt").string());
    FAIL();
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory nor a GGUF file"), std::string::npos);
  }
}

// Every prefix of a valid file is refused with zof::Error (never a crash or a read past the end).
TEST(GgufReader, EveryTruncationIsRefused) {
  TempDir dir;
  const std::string whole = Doc().bytes();
  const fs::path p = dir.path / "cut.gguf";
  for (size_t n = 0; n < whole.size(); ++n) {
    write_file(p, whole.substr(0, n));
    EXPECT_THROW(gg::File::open(p.string()), zof::Error) << "prefix of " << n << " bytes";
  }
}

// One hostile edit per field, each refused with a message that names it.
TEST(GgufReader, HostileFieldsAreRefusedByName) {
  struct Case {
    const char* name;
    std::function<void(Doc&)> edit;
    const char* says;
  };
  const Case cases[] = {
      {"magic", [](Doc& d) { d.magic = 0x46554746u; }, "not a GGUF file"},
      {"version 1", [](Doc& d) { d.version = 1; }, "GGUF version 1"},
      {"big-endian", [](Doc& d) { d.version = 0x03000000u; }, "big-endian"},
      {"version 9", [](Doc& d) { d.version = 9; }, "version 9 is not a GGUF version"},
      {"kv count", [](Doc& d) { d.n_kv = uint64_t(1) << 60; }, "metadata_kv_count"},
      {"tensor count", [](Doc& d) { d.n_tensors = uint64_t(1) << 60; }, "tensor_count"},
      {"value type", [](Doc& d) { d.kvs[1].type = 13; }, "value type 13 is not a GGUF type"},
      {"key empty", [](Doc& d) { d.kvs[0].key = ""; }, "the key is empty"},
      {"key twice", [](Doc& d) { d.kvs[1].key = "general.architecture"; }, "appears twice"},
      {"string length",
       [](Doc& d) { d.kvs[0].value = Bytes().put<uint64_t>(uint64_t(1) << 62).b; }, "bytes long, more than"},
      {"array count",
       [](Doc& d) { d.kvs[2].value = Bytes().put<uint32_t>(4).put<uint64_t>(uint64_t(1) << 20).b; },
       "cannot fit"},
      // Values beyond 2^24 (each read into a ~100-byte Value) are refused by count, before
      // anything is allocated: here in one array.
      {"array too long",
       [](Doc& d) { d.kvs[2].value = Bytes().put<uint32_t>(0).put<uint64_t>((uint64_t(1) << 24) + 1).b; },
       "general.languages: an array of 16777217 values, more than the 16777216 zof reads"},
      {"array element type",
       [](Doc& d) { d.kvs[2].value = Bytes().put<uint32_t>(77).put<uint64_t>(0).b; },
       "array element type 77"},
      {"array depth",
       [](Doc& d) {
         Bytes v;
         for (int i = 0; i < 6; ++i) v.put<uint32_t>(9).put<uint64_t>(1);
         v.put<uint32_t>(4).put<uint64_t>(0);
         d.kvs[2].value = v.b;
       },
       "nest deeper"},
      // A key of the file is shown short and on one line, however long and whatever it holds.
      {"long key twice",
       [](Doc& d) { d.kvs[0].key = d.kvs[1].key = std::string(300, 'k') + "\nzof: error: x"; },
       "kkkk...: the key appears twice"},
      {"bool", [](Doc& d) { d.kvs[1] = {"x.flag", 7, std::string(1, '\2')}; }, "BOOL holds 2"},
      {"alignment type", [](Doc& d) { d.kvs[3] = {"general.alignment", 10, Bytes().put<uint64_t>(32).b}; },
       "general.alignment: is UINT64"},
      {"alignment value", [](Doc& d) { d.kvs[3].value = Bytes().put<uint32_t>(48).b; },
       "48 is not a power of two"},
      {"alignment zero", [](Doc& d) { d.kvs[3].value = Bytes().put<uint32_t>(0).b; },
       "0 is not a power of two"},
      {"name empty", [](Doc& d) { d.tis[0].name = ""; }, "the tensor's name is empty"},
      {"name long", [](Doc& d) { d.tis[0].name = std::string(64, 'x'); }, "longer than ggml's 63"},
      {"name twice", [](Doc& d) { d.tis[1].name = "a"; }, "listed twice"},
      {"no dims", [](Doc& d) { d.tis[0].dims = {}; }, "0 dimensions"},
      {"five dims", [](Doc& d) { d.tis[0].dims = {1, 1, 1, 1, 8}; }, "5 dimensions"},
      {"dims overflow", [](Doc& d) { d.tis[0].dims = {uint64_t(1) << 40, uint64_t(1) << 40}; },
       "more elements than an int64"},
      {"dim sign", [](Doc& d) { d.tis[0].dims = {~uint64_t(0)}; }, "more elements than an int64"},
      {"type", [](Doc& d) { d.tis[0].type = 5; }, "type 5 is not a ggml type"},
      {"block", [](Doc& d) { d.tis[1].dims = {16, 4}; }, "not a multiple of Q8_0's block of 32"},
      {"offset alignment", [](Doc& d) { d.tis[1].offset = 36; }, "not a multiple of the alignment"},
      {"past the end", [](Doc& d) { d.tis[1].offset = 64; }, "runs past the end of the data"},
      {"huge", [](Doc& d) { d.tis[0].dims = {uint64_t(1) << 50}; }, "need more bytes than the file holds"},
      // Found by fuzz_gguf: (2^62 + 32) * 4 bytes wraps to 128, the bytes the data hold.
      {"bytes wrap", [](Doc& d) { d.tis[0].dims = {(uint64_t(1) << 62) + 32}; },
       "need more bytes than the file holds"},
      {"overlap", [](Doc& d) { d.tis[1].offset = 0; }, "overlap those of"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Doc d;
    c.edit(d);
    const fs::path p = dir.path / "bad.gguf";
    write_file(p, d.bytes());
    try {
      gg::File::open(p.string());
      ADD_FAILURE() << "accepted";
    } catch (const zof::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(c.says), std::string::npos) << m;
      EXPECT_EQ(m.rfind("GGUF " + p.string(), 0), 0u) << m;  // names the file first
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_LT(m.size(), 600u) << m;
    }
  }
}

// Strings of the file that an error quotes (the architecture, the tokenizer's model and
// pre-tokenizer) are cut to 40 bytes, their control bytes escaped: one short line.
TEST(GgufReader, QuotedStringsAreShownShortOnOneLine) {
  const std::string hostile = std::string(40, 'x') + std::string(5000, 'y') + "\nzof: error: z";
  const std::pair<const char*, const char*> cases[] = {
      {"general.architecture", "general.architecture: is 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"},
      {"tokenizer.ggml.model", "tokenizer.ggml.model: is 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"},
      {"tokenizer.ggml.pre", "tokenizer.ggml.pre: is 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"},
  };
  TempDir dir;
  for (const auto& [key, says] : cases) {
    SCOPED_TRACE(key);
    Doc d;
    if (std::string(key) == "tokenizer.ggml.pre")
      d.kvs.push_back({"tokenizer.ggml.model", 8, Bytes().str("gpt2").b});
    if (std::string(key) == "general.architecture") d.kvs[0].value = Bytes().str(hostile).b;
    else d.kvs.push_back({key, 8, Bytes().str(hostile).b});
    const fs::path p = dir.path / "strings.gguf";
    write_file(p, d.bytes());
    const gg::File f = gg::File::open(p.string());
    try {
      if (std::string(key) == "general.architecture") gg::llama_config(f);
      else gg::llama_tokenizer(f, nlohmann::json::object());
      ADD_FAILURE() << "accepted";
    } catch (const zof::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(says), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_LT(m.size(), 700u) << m;
    }
  }
  EXPECT_EQ(gg::shown("a\nb\x7f"), "a\\x0ab\\x7f");
}

// ---- the writer -------------------------------------------------------------------------------

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensorType) {
  TempDir dir;
  const fs::path p = dir.path / "out.gguf";
  gg::Metadata md;
  auto v = [](gg::ValueType t) {
    gg::Value x;
    x.type = t;
    return x;
  };
  gg::Value u8 = v(gg::ValueType::U8), i8 = v(gg::ValueType::I8), u16 = v(gg::ValueType::U16),
            i16 = v(gg::ValueType::I16), u64 = v(gg::ValueType::U64), i64 = v(gg::ValueType::I64),
            f64 = v(gg::ValueType::F64);
  u8.u = 200, i8.i = -100, u16.u = 60000, i16.i = -30000, u64.u = uint64_t(1) << 63,
  i64.i = INT64_MIN, f64.f = 0.1;
  md = {{"general.alignment", gg::Value::of_u32(64)},
        {"a.u8", u8}, {"a.i8", i8}, {"a.u16", u16}, {"a.i16", i16},
        {"a.u32", gg::Value::of_u32(4000000000u)}, {"a.i32", gg::Value::of_i32(-7)},
        {"a.u64", u64}, {"a.i64", i64}, {"a.f32", gg::Value::of_f32(1e-5f)}, {"a.f64", f64},
        {"a.bool", gg::Value::of_bool(true)}, {"a.str", gg::Value::of_string("h\xc3\xa9")},
        {"a.arr", gg::Value::of_array(gg::ValueType::Array,
                                      {gg::Value::of_array(gg::ValueType::I32, {gg::Value::of_i32(1)}),
                                       gg::Value::of_array(gg::ValueType::I32, {})})}};
  std::vector<float> w(3 * 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.37f * float(i) - 2.1f;
  std::vector<gg::TensorOut> ts;
  for (auto [name, type] : {std::pair{"f32", gg::TensorType::F32}, std::pair{"f16", gg::TensorType::F16},
                            std::pair{"bf16", gg::TensorType::BF16}}) {
    gg::TensorOut t;
    t.name = name;
    t.type = type;
    t.dims = {5, 3};
    t.rows = [&w](int64_t first, int64_t n, float* out) {
      std::memcpy(out, w.data() + first * 5, size_t(n * 5) * 4);
    };
    ts.push_back(t);
  }
  gg::write(p.string(), md, ts);
  const gg::File f = gg::File::open(p.string());
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.metadata().size(), md.size());
  for (size_t k = 0; k < md.size(); ++k) {
    const auto& [key, want] = md[k];
    const auto& [gkey, got] = f.metadata()[k];
    EXPECT_EQ(gkey, key);
    EXPECT_EQ(got.type, want.type) << key;
    EXPECT_EQ(got.u, want.u) << key;
    EXPECT_EQ(got.i, want.i) << key;
    EXPECT_EQ(got.s, want.s) << key;
    EXPECT_EQ(got.items.size(), want.items.size()) << key;
  }
  EXPECT_EQ(f.real("a.f32"), double(1e-5f));
  EXPECT_EQ(f.find("a.arr")->items[0].items[0].i, 1);
  for (const gg::TensorInfo& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 5}));
    std::vector<float> back(15);
    gg::dequantize(t.type, t.data, 15, back.data());
    for (size_t i = 0; i < w.size(); ++i) {
      const float want = t.type == gg::TensorType::F32    ? w[i]
                         : t.type == gg::TensorType::F16 ? zof::f16_to_f32(zof::f32_to_f16(w[i]))
                                                          : zof::bf16_round(w[i]);
      EXPECT_EQ(back[i], want) << i;
    }
  }
  // Every tensor padded to the alignment, the last too.
  EXPECT_EQ(fs::file_size(p) % 64, 0u);
}

TEST(GgufWriter, RefusesBeforeWritingAnything) {
  TempDir dir;
  const fs::path p = dir.path / "x.gguf";
  gg::TensorOut t;
  t.name = "t";
  t.dims = {2};
  t.rows = [](int64_t, int64_t, float* o) { o[0] = o[1] = 0; };
  EXPECT_THROW(gg::write(p.string(), {{"k", gg::Value::of_u32(1)}, {"k", gg::Value::of_u32(2)}}, {t}),
               zof::Error);
  EXPECT_THROW(gg::write(p.string(), {{"general.alignment", gg::Value::of_u32(3)}}, {t}), zof::Error);
  EXPECT_THROW(gg::write(p.string(), {}, {t, t}), zof::Error);
  gg::TensorOut q = t;
  q.type = gg::TensorType::Q4_K;
  EXPECT_THROW(gg::write(p.string(), {}, {q}), zof::Error);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir.path));
  // Into a directory that does not exist: refused, nothing left.
  EXPECT_THROW(gg::write((dir.path / "no" / "x.gguf").string(), {}, {t}), zof::Error);
}

}  // namespace
