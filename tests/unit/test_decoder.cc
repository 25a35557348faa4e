// KV-cache inference equals the training forward pass; sampling is deterministic and
// respects temperature 0 and top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>

#include "infer/decoder.h"
#include "model/gpt.h"

namespace meshtrain::infer::test_decoder {
namespace {

// GPT-2; Llama with grouped-query attention (2 key/value heads) and an untied head; that
// Llama with MoE layers (4 experts, top-2, one shared, every other layer), and GPT-2's
// parts with sigmoid-scored experts in every layer.
model::GptConfig small_config(const std::string& arch) {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 32, c.max_seq_len = 40, c.vocab = 101;
  if (arch.starts_with("llama")) {
    EXPECT_TRUE(model::apply_arch("llama", &c).is_ok());
    c.kv_heads = 2;
  }
  if (arch == "llama_moe") c.moe = {4, 2, 2, 1, 24, model::MoeScore::kSoftmax, true};
  if (arch == "gpt2_moe") c.moe = {3, 2, 1, 0, 0, model::MoeScore::kSigmoid, false};
  return c;
}

class KvCacheDecoderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheDecoderTest, LogitsMatchFullForwardAtEveryPosition) {
  const auto cfg = small_config(GetParam());
  model::Gpt gpt(cfg);
  gpt.init_weights(3);
  // Larger weights than the init so that attention is far from uniform.
  for (size_t i = 0; i < gpt.num_elements(); i++) gpt.params()[i] *= 5.0f;
  std::mt19937 rng(1);
  const int T = 33;
  std::vector<int> tokens(T);
  for (auto& t : tokens) t = rng() % cfg.vocab;
  const float* full = gpt.forward_logits(tokens.data(), 1, T);
  std::vector<float> expected(full, full + (size_t)T * cfg.padded_vocab());

  KvCacheDecoder dec(gpt);
  const int prefill = 12;  // a prompt in one call, then one token at a time
  const float* logits = dec.append(std::span(tokens).first(prefill));
  for (int t = prefill - 1; t < T; t++) {
    if (t >= prefill) logits = dec.append(std::span(tokens).subspan(t, 1));
    double diff = 0, mag = 0;
    for (int v = 0; v < cfg.vocab; v++) {
      float e = expected[(size_t)t * cfg.padded_vocab() + v];
      diff = std::max(diff, (double)std::abs(logits[v] - e));
      mag = std::max(mag, (double)std::abs(e));
    }
    EXPECT_LT(diff / mag, 1e-5) << "position " << t;
  }
  EXPECT_EQ(dec.position(), T);
}

INSTANTIATE_TEST_SUITE_P(KvCacheDecoder, KvCacheDecoderTest, ::testing::Values("gpt2", "llama", "llama_moe", "gpt2_moe"));

TEST(Sampling, GreedyTopKAndDeterminism) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f, 1.8f};
  std::mt19937_64 rng(7);
  EXPECT_EQ(sample_token(logits.data(), 6, {0.0f, 0}, rng), 1);
  EXPECT_EQ(sample_token(logits.data(), 6, {1.0f, 1}, rng), 1);
  std::set<int> seen;
  for (int i = 0; i < 2000; i++) seen.insert(sample_token(logits.data(), 6, {1.0f, 3}, rng));
  EXPECT_EQ(seen, (std::set<int>{1, 3, 5}));  // only the three largest logits
  seen.clear();
  for (int i = 0; i < 2000; i++) seen.insert(sample_token(logits.data(), 6, {1.0f, 0}, rng));
  EXPECT_EQ(seen.size(), 6u);
  std::mt19937_64 a(99), b(99);
  for (int i = 0; i < 50; i++)
    ASSERT_EQ(sample_token(logits.data(), 6, {0.8f, 0}, a), sample_token(logits.data(), 6, {0.8f, 0}, b));
}

TEST(Sampling, LowTemperatureConcentratesOnTheArgmax) {
  std::vector<float> logits = {1.0f, 1.2f, 0.9f};
  std::mt19937_64 rng(3);
  int hits = 0;
  for (int i = 0; i < 1000; i++) hits += sample_token(logits.data(), 3, {0.05f, 0}, rng) == 1;
  EXPECT_GT(hits, 960);  // p(argmax) = 1/(1 + e^-4 + e^-6) ≈ 0.980 at T = 0.05; ~4 sigma below
}

}  // namespace
}  // namespace meshtrain::infer::test_decoder
