// llm.c model files: bit-exact round trips, the written bytes against llm.c's documented
// layout (offsets computed here from the layout description, not from the implementation),
// the errors a loader must give, other vocabulary paddings, and agreement with the
// Hugging Face safetensors path through the model's logits.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/llmc.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint::test_llmc {
namespace {

// The small model of every test: Vp = 128 (97 rounded up to a multiple of 128).
model::GptConfig small_config() {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 32, c.vocab = 97, c.max_seq_len = 16;
  return c;
}

// GPT-2 init leaves biases zero and LayerNorm weights one, which would make a misplaced
// bias invisible; give every 1-D tensor distinct values.
void init_model(model::Gpt* gpt, uint64_t seed) {
  gpt->init_weights(seed);
  std::mt19937 rng((uint32_t)seed + 1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const auto& t : gpt->layout().tensors())
    if (t.shape.size() == 1)
      for (size_t i = 0; i < t.numel; i++) gpt->params()[t.offset + i] = dist(rng);
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

int32_t int_at(const std::string& bytes, size_t index) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * index, 4);
  return v;
}

void set_int(std::string* bytes, size_t index, int32_t v) {
  std::memcpy(bytes->data() + 4 * index, &v, 4);
}

// True when `count` floats at byte `offset` of the file equal the named tensor's first
// `count` elements, bit for bit.
bool file_matches(const std::string& bytes, size_t offset, const model::Gpt& gpt,
                  const std::string& name, size_t count) {
  const model::ParamTensor* t = gpt.layout().find(name);
  if (!t || offset + 4 * count > bytes.size()) return false;
  return std::memcmp(bytes.data() + offset, gpt.params() + t->offset, 4 * count) == 0;
}

class LlmcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/meshtrain_llmc_test_" + std::to_string(::getpid()) + "_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Exports the small model and returns the file's bytes.
  std::string export_small(const model::Gpt& gpt, const std::string& name) {
    Status s = export_llmc_model(gpt, path(name));
    EXPECT_TRUE(s.is_ok()) << s.message();
    return read_all(path(name));
  }

  // Writes `bytes` as a file and returns the error that infer and load both give.
  std::string load_error(const std::string& bytes, const model::GptConfig& into) {
    write_all(path("bad.bin"), bytes);
    model::GptConfig c;
    Status infer = infer_llmc_config(path("bad.bin"), &c);
    model::Gpt gpt(into);
    Status load = load_llmc_model(path("bad.bin"), &gpt);
    EXPECT_FALSE(load.is_ok());
    return infer.is_ok() ? load.message() : infer.message();
  }

  std::string dir_;
};

TEST_F(LlmcTest, RoundTripIsBitExact) {
  model::Gpt a(small_config());
  init_model(&a, 7);
  export_small(a, "m.bin");
  EXPECT_FALSE(std::filesystem::exists(path("m.bin.tmp")));

  model::GptConfig c;
  Status s = infer_llmc_config(path("m.bin"), &c);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.dim, 32);
  EXPECT_EQ(c.vocab, 97);
  EXPECT_EQ(c.max_seq_len, 16);

  model::Gpt b(c);
  init_model(&b, 99);  // different weights, so every element must be overwritten
  s = load_llmc_model(path("m.bin"), &b);
  ASSERT_TRUE(s.is_ok()) << s.message();
  ASSERT_EQ(a.num_elements(), b.num_elements());
  EXPECT_EQ(std::memcmp(a.params(), b.params(), 4 * a.num_elements()), 0);
}

TEST_F(LlmcTest, FileFollowsDocumentedLayout) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 3);
  const std::string bytes = export_small(gpt, "m.bin");
  const size_t L = 2, C = 32, V = 97, Vp = 128, T = 16;

  // Header.
  EXPECT_EQ(int_at(bytes, 0), 20240326);
  EXPECT_EQ(int_at(bytes, 1), 3);
  EXPECT_EQ(int_at(bytes, 2), 16);
  EXPECT_EQ(int_at(bytes, 3), 97);
  EXPECT_EQ(int_at(bytes, 4), 2);
  EXPECT_EQ(int_at(bytes, 5), 4);
  EXPECT_EQ(int_at(bytes, 6), 32);
  EXPECT_EQ(int_at(bytes, 7), 128);
  for (size_t i = 8; i < 256; i++) EXPECT_EQ(int_at(bytes, i), 0) << "header slot " << i;

  // Sizes worked out by hand: 1024 + 4 * (128*32 + 16*32 + 2*(12*32*32 + 13*32) + 2*32).
  ASSERT_EQ(bytes.size(), 121344u);
  // Layer 1's qkvb: after wte, wpe, ln1w, ln1b, qkvw (all layers) and layer 0's qkvb.
  EXPECT_EQ(1024 + 4 * (4096 + 512 + 64 + 64 + 6144 + 96), 44928);
  EXPECT_TRUE(file_matches(bytes, 44928, gpt, "h.1.attn.c_attn.bias", 3 * C));
  // lnfw and lnfb close the file.
  EXPECT_TRUE(file_matches(bytes, bytes.size() - 8 * C, gpt, "ln_f.weight", C));
  EXPECT_TRUE(file_matches(bytes, bytes.size() - 4 * C, gpt, "ln_f.bias", C));

  // Walk every section in llm.c's order: wte, wpe, each kind for all layers, lnf.
  size_t off = 1024;
  EXPECT_TRUE(file_matches(bytes, off, gpt, "wte.weight", V * C));
  for (size_t i = V * C; i < Vp * C; i++) {
    float v;
    std::memcpy(&v, bytes.data() + off + 4 * i, 4);
    ASSERT_EQ(v, 0.0f) << "padded wte element " << i;
  }
  off += 4 * Vp * C;
  EXPECT_TRUE(file_matches(bytes, off, gpt, "wpe.weight", T * C));
  off += 4 * T * C;
  const struct {
    const char* hf_suffix;  // llm.c's name in the comment
    size_t numel;
  } kinds[] = {
      {"ln_1.weight", C},                // ln1w
      {"ln_1.bias", C},                  // ln1b
      {"attn.c_attn.weight", 3 * C * C}, // qkvw [3C, C]
      {"attn.c_attn.bias", 3 * C},       // qkvb
      {"attn.c_proj.weight", C * C},     // attprojw [C, C]
      {"attn.c_proj.bias", C},           // attprojb
      {"ln_2.weight", C},                // ln2w
      {"ln_2.bias", C},                  // ln2b
      {"mlp.c_fc.weight", 4 * C * C},    // fcw [4C, C]
      {"mlp.c_fc.bias", 4 * C},          // fcb
      {"mlp.c_proj.weight", C * 4 * C},  // fcprojw [C, 4C]
      {"mlp.c_proj.bias", C},            // fcprojb
  };
  for (const auto& k : kinds) {
    for (size_t l = 0; l < L; l++) {
      const std::string name = "h." + std::to_string(l) + "." + k.hf_suffix;
      EXPECT_TRUE(file_matches(bytes, off, gpt, name, k.numel)) << name << " at " << off;
      off += 4 * k.numel;
    }
  }
  EXPECT_TRUE(file_matches(bytes, off, gpt, "ln_f.weight", C));
  EXPECT_TRUE(file_matches(bytes, off + 4 * C, gpt, "ln_f.bias", C));
  EXPECT_EQ(off + 8 * C, bytes.size());
}

TEST_F(LlmcTest, RecognisesFilesByContent) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  export_small(gpt, "weights.safetensors");  // the name must not matter
  ASSERT_TRUE(export_hf_safetensors(gpt, path("hf.bin")).is_ok());
  EXPECT_TRUE(is_llmc_model_file(path("weights.safetensors")));
  EXPECT_FALSE(is_llmc_model_file(path("hf.bin")));
  EXPECT_FALSE(is_llmc_model_file(path("missing.bin")));
  write_all(path("short.bin"), "ab");
  EXPECT_FALSE(is_llmc_model_file(path("short.bin")));
}

TEST_F(LlmcTest, RejectsBadMagic) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  std::string bytes = export_small(gpt, "m.bin");
  set_int(&bytes, 0, 20240327);
  std::string err = load_error(bytes, small_config());
  EXPECT_NE(err.find("magic"), std::string::npos) << err;
  EXPECT_NE(err.find("bad.bin"), std::string::npos) << err;
}

TEST_F(LlmcTest, RejectsBf16VersionClearly) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  std::string bytes = export_small(gpt, "m.bin");
  set_int(&bytes, 1, 5);
  std::string err = load_error(bytes, small_config());
  EXPECT_NE(err.find("bf16"), std::string::npos) << err;
  EXPECT_NE(err.find("not supported"), std::string::npos) << err;

  set_int(&bytes, 1, 2);
  err = load_error(bytes, small_config());
  EXPECT_NE(err.find("version 2"), std::string::npos) << err;
}

TEST_F(LlmcTest, RejectsTruncatedFile) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  const std::string bytes = export_small(gpt, "m.bin");
  std::string err = load_error(bytes.substr(0, bytes.size() - 4), small_config());
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  // Cut inside the header too.
  err = load_error(bytes.substr(0, 100), small_config());
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(LlmcTest, RejectsTrailingData) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  const std::string bytes = export_small(gpt, "m.bin");
  std::string err = load_error(bytes + std::string(4, '\0'), small_config());
  EXPECT_NE(err.find("trailing data"), std::string::npos) << err;
}

TEST_F(LlmcTest, RejectsBadHeaderSizes) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  std::string bytes = export_small(gpt, "m.bin");
  std::string padded_too_small = bytes;
  set_int(&padded_too_small, 7, 96);
  std::string err = load_error(padded_too_small, small_config());
  EXPECT_NE(err.find("padded_vocab_size"), std::string::npos) << err;

  std::string bad_heads = bytes;
  set_int(&bad_heads, 5, 5);  // does not divide 32
  err = load_error(bad_heads, small_config());
  EXPECT_NE(err.find("heads"), std::string::npos) << err;

  // Huge sizes must give an error, not an overflow that happens to match the file size.
  std::string huge = bytes;
  set_int(&huge, 4, 2000000000);
  set_int(&huge, 6, 2000000000);
  set_int(&huge, 5, 1);
  err = load_error(huge, small_config());
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(LlmcTest, RejectsConfigMismatchNamingBothShapes) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 1);
  const std::string bytes = export_small(gpt, "m.bin");
  model::GptConfig other = small_config();
  other.layers = 3;
  std::string err = load_error(bytes, other);
  EXPECT_NE(err.find("layers=2"), std::string::npos) << err;
  EXPECT_NE(err.find("layers=3"), std::string::npos) << err;
}

// llm.c pads 50257 to 50304; other writers may pad differently or not at all. The first
// `vocab` rows are what count.
TEST_F(LlmcTest, ReadsOtherVocabularyPaddings) {
  model::Gpt gpt(small_config());
  init_model(&gpt, 5);
  const std::string bytes = export_small(gpt, "m.bin");
  const size_t C = 32, V = 97, Vp = 128, wte_end = 1024 + 4 * Vp * C;
  const std::string head = bytes.substr(0, 1024 + 4 * V * C);
  const std::string tail = bytes.substr(wte_end);
  for (int file_vp : {97, 100, 256}) {
    std::string b = head + std::string(4 * (file_vp - V) * C, '\0') + tail;
    set_int(&b, 7, file_vp);
    write_all(path("p.bin"), b);
    model::Gpt loaded(small_config());
    init_model(&loaded, 11);
    Status s = load_llmc_model(path("p.bin"), &loaded);
    ASSERT_TRUE(s.is_ok()) << "padded_vocab " << file_vp << ": " << s.message();
    EXPECT_EQ(std::memcmp(gpt.params(), loaded.params(), 4 * gpt.num_elements()), 0)
        << "padded_vocab " << file_vp;
  }
}

// The two export formats hold the same model: loading each back gives the same logits.
TEST_F(LlmcTest, SameLogitsAsHfSafetensors) {
  const model::GptConfig cfg = small_config();
  model::Gpt original(cfg);
  init_model(&original, 21);
  ASSERT_TRUE(export_llmc_model(original, path("m.bin")).is_ok());
  ASSERT_TRUE(export_hf_safetensors(original, path("m.safetensors")).is_ok());

  model::GptConfig llmc_cfg, hf_cfg;
  ASSERT_TRUE(infer_llmc_config(path("m.bin"), &llmc_cfg).is_ok());
  ASSERT_TRUE(infer_hf_config(path("m.safetensors"), 0, &hf_cfg).is_ok());
  model::Gpt from_llmc(llmc_cfg), from_hf(hf_cfg);
  Status s = load_llmc_model(path("m.bin"), &from_llmc);
  ASSERT_TRUE(s.is_ok()) << s.message();
  s = load_hf_safetensors(path("m.safetensors"), &from_hf);
  ASSERT_TRUE(s.is_ok()) << s.message();

  const int B = 2, T = cfg.max_seq_len, V = cfg.vocab, Vp = cfg.padded_vocab();
  std::vector<int> inputs(B * T);
  std::mt19937 rng(4);
  for (int& x : inputs) x = (int)(rng() % (uint32_t)V);
  // Only the first V columns of each row exist; padded columns are never computed.
  auto logits = [&](model::Gpt& gpt) {
    const float* out = gpt.forward_logits(inputs.data(), B, T);
    std::vector<float> kept;
    for (int r = 0; r < B * T; r++) {
      const float* row = out + (size_t)r * Vp;
      kept.insert(kept.end(), row, row + V);
    }
    return kept;
  };
  const std::vector<float> want = logits(original);
  const std::vector<float> got_llmc = logits(from_llmc);
  const std::vector<float> got_hf = logits(from_hf);
  ASSERT_EQ(want.size(), got_llmc.size());
  EXPECT_EQ(std::memcmp(got_llmc.data(), got_hf.data(), 4 * want.size()), 0);
  EXPECT_EQ(std::memcmp(got_llmc.data(), want.data(), 4 * want.size()), 0);
}

}  // namespace
}  // namespace meshtrain::checkpoint::test_llmc
