// safetensors reader/writer: round trips, the exact on-disk layout, hand-written files in
// other dtypes, and the corrupt-file cases a checkpoint loader must reject clearly.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_gpt2_config.h"
#include "checkpoint/model_file.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_model.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint::test_safetensors {
namespace {

using nlohmann::json;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/meshtrain_safetensors_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file written by hand: length prefix, header text as given, raw data.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  write_bytes(path, bytes + header + data);
}

template <typename T>
std::string as_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST_F(SafetensorsTest, RoundTripWithMetadata) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 7.0f};
  std::vector<float> b = {42.0f, -0.125f};
  ASSERT_TRUE(write_safetensors(path("m.safetensors"),
                                {{"wte.weight", {2, 3}, a.data()}, {"ln.bias", {2}, b.data()}},
                                {{"format", "pt"}, {"step", "100"}})
                  .is_ok());

  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("m.safetensors"), &file);
  ASSERT_TRUE(s.is_ok()) << s.message();
  ASSERT_EQ(file.tensors().size(), 2u);
  // Sorted by data offset, i.e. in write order.
  EXPECT_EQ(file.tensors()[0].name, "wte.weight");
  EXPECT_EQ(file.tensors()[1].name, "ln.bias");
  const TensorInfo* info = file.find("wte.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, "F32");
  EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(info->begin, 0u);
  EXPECT_EQ(info->end, 24u);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("step"), "100");

  std::vector<float> got_a(6), got_b(2);
  ASSERT_TRUE(file.read_float("wte.weight", got_a.data(), 6).is_ok());
  ASSERT_TRUE(file.read_float("ln.bias", got_b.data(), 2).is_ok());
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(got_b, b);
}

// The in-memory entry (what the fuzz target calls) reads a file's bytes exactly as open()
// reads the file, and keeps its own copy: the object outlives the caller's buffer.
TEST_F(SafetensorsTest, FromBytesMatchesOpen) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(write_safetensors(path("m.safetensors"), {{"w", {3}, a.data()}}, {{"n_head", "2"}}).is_ok());
  SafetensorsFile file;
  {
    std::string bytes = read_all(path("m.safetensors"));
    ASSERT_TRUE(SafetensorsFile::from_bytes(bytes, "in-memory", &file).is_ok());
    bytes.assign(bytes.size(), '\xff');
  }
  EXPECT_EQ(file.path(), "in-memory");
  EXPECT_EQ(file.metadata().at("n_head"), "2");
  std::vector<float> got(3);
  ASSERT_TRUE(file.read_float("w", got.data(), 3).is_ok());
  EXPECT_EQ(got, a);
  Status s = SafetensorsFile::from_bytes(read_all(path("m.safetensors")).substr(0, 30), "cut", &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("safetensors file cut: truncated"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, HeaderLayoutIsByteExact) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(
      write_safetensors(path("x.safetensors"), {{"w", {2, 3}, a.data()}}, {{"k", "v"}}).is_ok());
  std::string bytes = read_all(path("x.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host, as the format
  EXPECT_EQ(n % 8, 0u) << "header is padded to keep the data 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 24);

  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  std::string trimmed = header.substr(0, header.find_last_not_of(' ') + 1);
  EXPECT_EQ(trimmed.back(), '}');
  EXPECT_LT(header.size() - trimmed.size(), 8u);
  json j = json::parse(header);
  EXPECT_EQ(j, json::parse(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                               "__metadata__": {"k": "v"}})"));
  EXPECT_EQ(bytes.substr(8 + n), as_bytes(a));
}

TEST_F(SafetensorsTest, NoMetadataKeyWhenEmptyAndNoTmpLeft) {
  std::vector<float> a = {1};
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"w", {1}, a.data()}}).is_ok());
  std::string bytes = read_all(path("x.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_FALSE(json::parse(bytes.substr(8, n)).contains("__metadata__"));
  EXPECT_FALSE(std::filesystem::exists(path("x.safetensors.tmp")));
}

TEST_F(SafetensorsTest, OverwritesExistingFile) {
  std::vector<float> a = {1}, b = {2, 3};
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"w", {1}, a.data()}}).is_ok());
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"w", {2}, b.data()}}).is_ok());
  SafetensorsFile file;
  ASSERT_TRUE(SafetensorsFile::open(path("x.safetensors"), &file).is_ok());
  std::vector<float> got(2);
  ASSERT_TRUE(file.read_float("w", got.data(), 2).is_ok());
  EXPECT_EQ(got, b);
}

TEST_F(SafetensorsTest, ScalarAndEmptyTensors) {
  float s = 9.5f;
  ASSERT_TRUE(
      write_safetensors(path("x.safetensors"), {{"s", {}, &s}, {"e", {0, 4}, nullptr}}).is_ok());
  SafetensorsFile file;
  ASSERT_TRUE(SafetensorsFile::open(path("x.safetensors"), &file).is_ok());
  float got = 0;
  ASSERT_TRUE(file.read_float("s", &got, 1).is_ok());
  EXPECT_EQ(got, 9.5f);
  EXPECT_TRUE(file.read_float("e", nullptr, 0).is_ok());
}

TEST_F(SafetensorsTest, WriteRejectsDuplicateNames) {
  std::vector<float> a = {1};
  Status s = write_safetensors(path("x.safetensors"), {{"w", {1}, a.data()}, {"w", {1}, a.data()}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("duplicate"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(path("x.safetensors")));
}

TEST_F(SafetensorsTest, TruncatedFilesAreReported) {
  std::vector<float> a(100, 1.0f);
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"w", {100}, a.data()}}).is_ok());
  std::string bytes = read_all(path("x.safetensors"));
  // Cut in the data, in the header, and inside the length prefix.
  for (size_t keep : {bytes.size() - 4, size_t{20}, size_t{5}, size_t{0}}) {
    write_bytes(path("cut.safetensors"), bytes.substr(0, keep));
    SafetensorsFile file;
    Status s = SafetensorsFile::open(path("cut.safetensors"), &file);
    ASSERT_FALSE(s.is_ok()) << "kept " << keep;
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("cut.safetensors"), std::string::npos) << s.message();
  }
}

TEST_F(SafetensorsTest, MissingFileIsAnError) {
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("nope.safetensors"), &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("nope.safetensors"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeAreRejected) {
  write_raw(path("x.safetensors"), R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})",
            std::string(16, '\0'));
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("x.safetensors"), &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, OffsetsInconsistentWithShapeAreRejected) {
  write_raw(path("x.safetensors"), R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            std::string(16, '\0'));
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("x.safetensors"), &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("do not match"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRejected) {
  write_raw(path("x.safetensors"),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(16, '\0'));
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("x.safetensors"), &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, MalformedHeadersAreRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "JSON"},
      {"[1, 2]", "not an object"},
      {R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "unsupported dtype"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "data_offsets"},
      {R"({"__metadata__":{"k":1}})", "__metadata__"},
  };
  for (const auto& [header, expected] : cases) {
    write_raw(path("x.safetensors"), header, std::string(8, '\0'));
    SafetensorsFile file;
    Status s = SafetensorsFile::open(path("x.safetensors"), &file);
    ASSERT_FALSE(s.is_ok()) << header;
    EXPECT_NE(s.message().find(expected), std::string::npos) << header << " -> " << s.message();
  }
}

TEST_F(SafetensorsTest, ImplausibleHeaderLengthIsRejected) {
  uint64_t n = 1ull << 40;
  write_bytes(path("x.safetensors"), std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("x.safetensors"), &file);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("header length"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, ReadErrorsNameTheTensor) {
  std::vector<float> a = {1, 2, 3};
  ASSERT_TRUE(write_safetensors(path("x.safetensors"), {{"h.0.attn", {3}, a.data()}}).is_ok());
  SafetensorsFile file;
  ASSERT_TRUE(SafetensorsFile::open(path("x.safetensors"), &file).is_ok());
  std::vector<float> got(4);
  Status s = file.read_float("h.0.mlp", got.data(), 3);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("h.0.mlp"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not found"), std::string::npos) << s.message();

  s = file.read_float("h.0.attn", got.data(), 4);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("h.0.attn"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected 4"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, ReadsF16Bf16AndF64) {
  // F16: 1, -2, 0.5, 65504 (max), 2^-24 (smallest subnormal), -0, +inf.
  std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000, 0x7C00};
  // BF16: 1, -3.5, 0.15625, 2^-133 (subnormal).
  std::vector<uint16_t> bf16 = {0x3F80, 0xC060, 0x3E20, 0x0001};
  std::vector<double> f64 = {3.25, -1e10};
  std::string data = as_bytes(f16) + as_bytes(bf16) + as_bytes(f64);
  write_raw(path("x.safetensors"),
            R"({"h":{"dtype":"F16","shape":[7],"data_offsets":[0,14]},
                "b":{"dtype":"BF16","shape":[2,2],"data_offsets":[14,22]},
                "d":{"dtype":"F64","shape":[2],"data_offsets":[22,38]},
                "i":{"dtype":"I32","shape":[1],"data_offsets":[38,42]}})",
            data + std::string(4, '\0'));
  SafetensorsFile file;
  Status s = SafetensorsFile::open(path("x.safetensors"), &file);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(file.find("b")->dtype, "BF16");

  std::vector<float> h(7), b(4), d(2);
  ASSERT_TRUE(file.read_float("h", h.data(), 7).is_ok());
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[5], 0.0f);
  EXPECT_TRUE(std::signbit(h[5]));
  EXPECT_TRUE(std::isinf(h[6]) && h[6] > 0);

  ASSERT_TRUE(file.read_float("b", b.data(), 4).is_ok());
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -3.5f);
  EXPECT_EQ(b[2], 0.15625f);
  EXPECT_EQ(b[3], std::ldexp(1.0f, -133));

  ASSERT_TRUE(file.read_float("d", d.data(), 2).is_ok());
  EXPECT_EQ(d[0], 3.25f);
  EXPECT_EQ(d[1], -1e10f);

  float i = 0;
  s = file.read_float("i", &i, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("I32"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, F16SubnormalsAndLargeTensorsConvertExactly) {
  // Every finite F16 value converts exactly; checks the subnormal path and chunking
  // (more elements than one staging chunk) at once.
  const size_t n = (1u << 20) + 4096;
  std::vector<uint16_t> bits(n);
  for (size_t k = 0; k < n; ++k) bits[k] = static_cast<uint16_t>(k % 0x7C00);
  write_raw(path("x.safetensors"),
            R"({"h":{"dtype":"F16","shape":[)" + std::to_string(n) + R"(],"data_offsets":[0,)" +
                std::to_string(2 * n) + "]}}",
            as_bytes(bits));
  SafetensorsFile file;
  ASSERT_TRUE(SafetensorsFile::open(path("x.safetensors"), &file).is_ok());
  std::vector<float> got(n);
  ASSERT_TRUE(file.read_float("h", got.data(), n).is_ok());
  for (size_t k = 0; k < n; ++k) {
    uint16_t v = bits[k];
    int exp = v >> 10, mant = v & 0x3ff;
    float expected = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                              : std::ldexp(1.0f + mant / 1024.0f, exp - 15);
    ASSERT_EQ(got[k], expected) << "bits 0x" << std::hex << v;
  }
}

}  // namespace
}  // namespace meshtrain::checkpoint::test_safetensors

// ---- Sharded models: model-0000N-of-0000M.safetensors + model.safetensors.index.json ----

namespace meshtrain::checkpoint::test_safetensors {
namespace {

model::Gpt llama_tiny() {
  model::GptConfig c;
  EXPECT_TRUE(model::preset_config("llama-tiny", &c).is_ok());
  model::Gpt gpt(c);
  gpt.init_weights(7);
  return gpt;
}

// A Llama folder past the shard size: shards named as Hugging Face names them, an index
// whose weight map covers every tensor and whose total is the tensors' bytes, and a model
// read back from the folder bit for bit. Exported again in one piece, the shards go.
TEST_F(SafetensorsTest, ShardedFolderRoundTripsAndReplacesAnEarlierExport) {
  const model::Gpt gpt = llama_tiny();
  const std::string dir = path("llama");
  ASSERT_TRUE(export_hf_folder(gpt, dir, 100e3).is_ok());  // 100 kB shards
  namespace fs = std::filesystem;
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  const json index = json::parse(read_all(dir + "/" + kHfIndexFile));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GT(files.size(), 2u);
  const std::string last = "model-0000" + std::to_string(files.size()) + "-of-0000" + std::to_string(files.size()) +
                           ".safetensors";
  EXPECT_TRUE(files.count("model-00001-of-0000" + std::to_string(files.size()) + ".safetensors"));
  EXPECT_TRUE(files.count(last));
  EXPECT_EQ(index["weight_map"].size(), gpt.layout().tensors().size());
  uint64_t bytes = 0;  // fp32, HF's shapes (the vocabulary unpadded)
  for (const auto& t : gpt.layout().tensors()) {
    uint64_t n = 4;
    for (int64_t d : hf_shape(t, gpt.config().vocab)) n *= (uint64_t)d;
    bytes += n;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), bytes);
  SafetensorsModel m;
  ASSERT_TRUE(SafetensorsModel::open(dir + "/" + kHfIndexFile, &m).is_ok());
  EXPECT_EQ(m.shard_count(), files.size());
  std::unique_ptr<model::Gpt> back;
  ASSERT_TRUE(open_model_file(dir, 0, &back).is_ok());
  ASSERT_EQ(back->config().kv_head_count(), gpt.config().kv_head_count());
  ASSERT_EQ(back->layout().total(), gpt.layout().total());
  EXPECT_EQ(std::memcmp(back->params(), gpt.params(), sizeof(float) * gpt.layout().total()), 0);

  ASSERT_TRUE(export_hf_folder(gpt, dir).is_ok());  // the default 5 GB: one file
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/" + kHfIndexFile));
  for (const std::string& f : files) EXPECT_FALSE(fs::exists(dir + "/" + f)) << f;
  ASSERT_TRUE(open_model_file(dir, 0, &back).is_ok());
  EXPECT_EQ(std::memcmp(back->params(), gpt.params(), sizeof(float) * gpt.layout().total()), 0);
}

// An index that does not describe its shards is refused before any weight is read, naming
// the index and what is wrong.
TEST_F(SafetensorsTest, BadIndexesAreNamed) {
  const model::Gpt gpt = llama_tiny();
  const std::string dir = path("llama");
  ASSERT_TRUE(export_hf_folder(gpt, dir, 100e3).is_ok());
  const std::string index_path = dir + "/" + kHfIndexFile;
  const json good = json::parse(read_all(index_path));
  auto refused_with = [&](const json& index) {
    std::ofstream(index_path) << index.dump();
    SafetensorsModel m;
    const Status s = SafetensorsModel::open(index_path, &m);
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find(index_path), std::string::npos) << s.message();
    std::unique_ptr<model::Gpt> never;
    EXPECT_FALSE(open_model_file(dir, 0, &never).is_ok());
    return s.message();
  };
  // A tensor that shares its shard with others, and one alone in its shard (the head).
  std::map<std::string, int> per_file;
  for (const auto& [name, file] : good["weight_map"].items()) per_file[file.get<std::string>()]++;
  std::string first, first_file;
  for (const auto& [name, file] : good["weight_map"].items())
    if (per_file[file.get<std::string>()] > 1 && first.empty()) first = name, first_file = file.get<std::string>();
  const std::string lone_file = good["weight_map"]["lm_head.weight"];
  ASSERT_EQ(per_file[lone_file], 1);
  json j = good;
  j.erase("weight_map");
  EXPECT_NE(refused_with(j).find("no \"weight_map\""), std::string::npos);
  j = good;
  j["weight_map"][first] = "../elsewhere.safetensors";
  EXPECT_NE(refused_with(j).find("not a file name in the index's folder"), std::string::npos);
  j = good;
  j["weight_map"].erase(first);
  std::string msg = refused_with(j);
  EXPECT_NE(msg.find("holds tensor '" + first + "', which the weight_map does not list"), std::string::npos) << msg;
  j = good;
  j["weight_map"].erase("lm_head.weight");
  msg = refused_with(j);
  EXPECT_NE(msg.find(lone_file + " is in the folder, but the weight_map names no tensor in it"), std::string::npos)
      << msg;
  j = good;
  j["weight_map"]["model.layers.99.mlp.up_proj.weight"] = first_file;
  EXPECT_NE(refused_with(j).find("'model.layers.99.mlp.up_proj.weight'"), std::string::npos);
  j = good;
  j["metadata"]["total_size"] = 12;
  EXPECT_NE(refused_with(j).find("total_size is 12"), std::string::npos);
  j = good;
  std::string other;
  for (const auto& [name, file] : good["weight_map"].items())
    if (file != first_file) other = file;
  j["weight_map"][first] = other;
  msg = refused_with(j);
  EXPECT_NE(msg.find("weight_map puts '" + first + "' in " + other), std::string::npos) << msg;
  std::ofstream(index_path) << good.dump();
  std::filesystem::remove(dir + "/" + other);
  SafetensorsModel m;
  const Status missing = SafetensorsModel::open(index_path, &m);
  EXPECT_NE(missing.message().find(other), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace meshtrain::checkpoint::test_safetensors
