// KV-cache inference equals the training forward pass; sampling is deterministic and
// respects temperature 0 and top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>

#include "comm/mesh.h"
#include "comm/thread_group.h"
#include "infer/decoder.h"
#include "infer/sampling.h"
#include "infer/shard_weights.h"
#include "infer/streamed_weights.h"
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

// Larger weights than the init, so that attention is far from uniform.
void init_sharp(model::Gpt& gpt) {
  gpt.init_weights(3);
  for (size_t i = 0; i < gpt.num_elements(); i++) gpt.params()[i] *= 5.0f;
}

TEST_P(KvCacheDecoderTest, LogitsMatchFullForwardAtEveryPosition) {
  const auto cfg = small_config(GetParam());
  model::Gpt gpt(cfg);
  init_sharp(gpt);
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

// Sequences decoded together, joining and leaving between steps, against each decoded
// alone: prompts of 5, 1 and 9 tokens prefilled in one step, then one token each per step;
// the second leaves after two steps and a fourth (3 tokens) joins at the third. Each
// sequence's logits equal its own run's bit for bit: the decoder's linear layers sum each
// row in one order whatever rows share them (matmul_forward_rowwise). That is what lets
// generate and serve batch without changing any text.
TEST_P(KvCacheDecoderTest, BatchedSequencesMatchEachAlone) {
  const auto cfg = small_config(GetParam());
  model::Gpt gpt(cfg);
  init_sharp(gpt);
  std::mt19937 rng(2);
  std::vector<std::vector<int>> tokens(4);
  const int prompt[4] = {5, 1, 9, 3};
  for (auto& t : tokens) {
    t.resize(16);
    for (int& x : t) x = rng() % cfg.vocab;
  }
  // Each alone: the logits after its prompt, then after each next token.
  std::vector<std::vector<std::vector<float>>> alone(4);
  for (int s = 0; s < 4; s++) {
    KvCacheDecoder dec(gpt);
    const float* l = dec.append(std::span(tokens[s]).first(prompt[s]));
    alone[s].emplace_back(l, l + cfg.vocab);
    for (int i = prompt[s]; i < 16; i++) {
      l = dec.append(std::span(tokens[s]).subspan(i, 1));
      alone[s].emplace_back(l, l + cfg.vocab);
    }
  }
  BatchDecoder batch(gpt);
  std::vector<int> id(4, -1), fed(4, 0);
  int compared = 0;
  for (int step = 0; step < 6; step++) {
    if (step == 0) id[0] = batch.add(), id[1] = batch.add(), id[2] = batch.add();
    if (step == 2) batch.remove(id[1]), id[1] = -1;
    if (step == 3) id[3] = batch.add();
    std::vector<BatchDecoder::Rows> rows;
    std::vector<int> in_step;
    for (int s = 0; s < 4; s++) {
      if (id[s] < 0 || (s == 1 && step >= 2)) continue;
      const int n = fed[s] == 0 ? prompt[s] : 1, from = fed[s] == 0 ? 0 : prompt[s] + fed[s] - 1;
      rows.push_back({id[s], std::span(tokens[s]).subspan(from, n)});
      in_step.push_back(s);
    }
    batch.step(rows);
    for (int s : in_step) {
      const float* l = batch.logits(id[s]);
      EXPECT_EQ(0, std::memcmp(l, alone[s][fed[s]].data(), cfg.vocab * sizeof(float)))
          << "sequence " << s << " at step " << step;
      fed[s]++;
      compared++;
    }
  }
  EXPECT_EQ(compared, 3 + 3 + 2 + 3 + 3 + 3);
  EXPECT_EQ(batch.position(id[0]), prompt[0] + 5);
}

// The join-and-leave scenario above on a decoder split over `groups`: every step's logits of
// every sequence in it, in order.
std::vector<std::vector<float>> joined_and_left(const model::Gpt& gpt, DecodeGroups groups) {
  const int V = gpt.config().vocab;
  std::mt19937 rng(2);
  std::vector<std::vector<int>> tokens(3, std::vector<int>(12));
  for (auto& t : tokens)
    for (int& x : t) x = rng() % V;
  const int prompt[3] = {5, 1, 9};
  BatchDecoder batch(gpt, groups);
  std::vector<std::vector<float>> out;
  std::vector<int> id(3, -1), fed(3, 0);
  for (int step = 0; step < 4; step++) {
    if (step == 0) id[0] = batch.add(), id[1] = batch.add();
    if (step == 1) id[2] = batch.add();
    if (step == 2) batch.remove(id[0]), id[0] = -1;
    std::vector<BatchDecoder::Rows> rows;
    std::vector<int> in_step;
    for (int s = 0; s < 3; s++) {
      if (id[s] < 0) continue;
      const int n = fed[s] == 0 ? prompt[s] : 1, from = fed[s] == 0 ? 0 : prompt[s] + fed[s] - 1;
      rows.push_back({id[s], std::span(tokens[s]).subspan(from, n)});
      in_step.push_back(s);
      fed[s]++;
    }
    batch.step(rows);
    for (int s : in_step) out.emplace_back(batch.logits(id[s]), batch.logits(id[s]) + V);
  }
  return out;
}

// Tensor- and pipeline-parallel decoding on thread ranks: every rank's logits equal one
// rank's, bit for bit (tp splits each linear layer's output rows, here unevenly for the
// 101-token vocabulary, and the KV heads; pp splits the layers, and the sequences into 2
// micro-batches). Each rank holds only the rows it reads (ShardWeights, which fails on a
// row it does not hold), each less than the model.
TEST_P(KvCacheDecoderTest, TensorAndPipelineParallelLogitsEqualOneRanks) {
  const auto cfg = small_config(GetParam());
  model::Gpt gpt(cfg);
  init_sharp(gpt);
  const auto expected = joined_and_left(gpt, {});
  ASSERT_EQ(expected.size(), 2u + 3u + 2u + 2u);
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    comm::ThreadWorld world(tp * pp);
    comm::MeshShape shape;
    shape.tp = tp, shape.pp = pp;
    std::vector<std::vector<std::vector<float>>> got(tp * pp);
    std::vector<int64_t> held(tp * pp);
    comm::run_ranks(tp * pp, [&](int r) {
      auto group = world.group(r);
      comm::Mesh mesh(*group, shape);
      const DecodeGroups at{tp > 1 ? &mesh.tp() : nullptr, pp > 1 ? &mesh.pp() : nullptr, 2};
      model::Gpt mine(cfg, model::Gpt::LocalState::kNone);
      ShardWeights shard(mine.layout(), weights_read(mine, at));
      const size_t half = gpt.num_elements() / 2 + 3;  // in two uneven pieces, as a checkpoint streams
      ASSERT_TRUE(shard.write(0, half, gpt.params()).is_ok());
      ASSERT_TRUE(shard.write(half, gpt.num_elements() - half, gpt.params() + half).is_ok());
      mine.set_param_store(&shard);
      held[r] = shard.held();
      got[r] = joined_and_left(mine, at);
    });
    for (int r = 0; r < tp * pp; r++) EXPECT_LT(held[r], (int64_t)gpt.num_elements()) << "rank " << r;
    for (int r = 0; r < tp * pp; r++) {
      ASSERT_EQ(got[r].size(), expected.size()) << "rank " << r;
      for (size_t i = 0; i < expected.size(); i++)
        EXPECT_EQ(0, std::memcmp(got[r][i].data(), expected[i].data(), expected[i].size() * sizeof(float)))
            << "rank " << r << ", logits " << i;
    }
  }
}

// ZeRO-Inference: the decoder on weights streamed from a file (reading 0, 1 and 2 layers
// ahead) gives the logits of the model in memory, bit for bit. In memory: the embedding and
// final-norm units and read_ahead + 1 layer buffers, nothing else; each step reads each
// layer once (and the read-ahead a few more at the end).
TEST_P(KvCacheDecoderTest, StreamedWeightsGiveTheSameLogits) {
  auto cfg = small_config(GetParam());
  cfg.layers = 3;
  model::Gpt gpt(cfg);
  init_sharp(gpt);
  const auto expected = joined_and_left(gpt, {});
  for (int read_ahead : {0, 1, 2}) {
    SCOPED_TRACE("read ahead " + std::to_string(read_ahead));
    model::Gpt streamed_model(cfg, model::Gpt::LocalState::kNone);
    const int64_t before = MemoryTracker::instance().stats().total_current;
    std::unique_ptr<StreamedWeights> weights;
    ASSERT_TRUE(StreamedWeights::create(streamed_model.layout(), std::filesystem::temp_directory_path().string(),
                                        read_ahead, &weights).is_ok());
    EXPECT_EQ(MemoryTracker::instance().stats().total_current - before,
              StreamedWeights::resident_bytes(gpt.layout()) + StreamedWeights::buffer_bytes(gpt.layout(), read_ahead));
    EXPECT_LT(StreamedWeights::resident_bytes(gpt.layout()), (int64_t)(gpt.num_elements() * sizeof(float)));
    // In two uneven pieces, as a checkpoint reader hands them over.
    const size_t half = gpt.num_elements() / 2 + 3;
    ASSERT_TRUE(weights->write(0, half, gpt.params()).is_ok());
    ASSERT_TRUE(weights->write(half, gpt.num_elements() - half, gpt.params() + half).is_ok());
    ASSERT_TRUE(weights->finish_writes().is_ok());
    streamed_model.set_param_store(weights.get());
    const auto got = joined_and_left(streamed_model, {});
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < expected.size(); i++)
      EXPECT_EQ(0, std::memcmp(got[i].data(), expected[i].data(), expected[i].size() * sizeof(float))) << "logits " << i;
    const auto stats = weights->stats();
    EXPECT_GE(stats.layers_read, 4 * cfg.layers);  // 4 steps
    EXPECT_LE(stats.layers_read, 4 * cfg.layers + read_ahead);
  }
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

// Untruncated, the tokens are walked in id order (no sort) and truncated, likeliest first:
// either way each token is drawn with its softmax probability.
TEST(Sampling, DrawsFollowTheSoftmaxWithOrWithoutTruncation) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f, 1.8f};
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (SampleOptions o : {SampleOptions{1.0f, 0, 1.0f}, SampleOptions{1.0f, 0, 0.99999f}, SampleOptions{1.0f, 6, 1.0f}}) {
    std::mt19937_64 rng(17);
    std::vector<int> count(6);
    const int draws = 20000;
    for (int i = 0; i < draws; i++) count[sample_token(logits.data(), 6, o, rng)]++;
    for (int t = 0; t < 6; t++) {
      const double p = std::exp(logits[t]) / z, sigma = std::sqrt(p * (1 - p) / draws);
      EXPECT_NEAR(count[t] / (double)draws, p, 4 * sigma) << "token " << t << " top_k " << o.top_k << " top_p " << o.top_p;
    }
  }
}

TEST(Sampling, LowTemperatureConcentratesOnTheArgmax) {
  std::vector<float> logits = {1.0f, 1.2f, 0.9f};
  std::mt19937_64 rng(3);
  int hits = 0;
  for (int i = 0; i < 1000; i++) hits += sample_token(logits.data(), 3, {0.05f, 0}, rng) == 1;
  EXPECT_GT(hits, 960);  // p(argmax) = 1/(1 + e^-4 + e^-6) ≈ 0.980 at T = 0.05; ~4 sigma below
}

// Probabilities 0.5, 0.3, 0.15, 0.05: the nucleus of top_p is the first tokens whose mass
// reaches it, the one that crosses included; top_k cuts first.
TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto drawn = [&](SampleOptions o) {
    std::mt19937_64 rng(11);
    std::set<int> seen;
    for (int i = 0; i < 3000; i++) seen.insert(sample_token(logits.data(), 4, o, rng));
    return seen;
  };
  EXPECT_EQ(drawn({1.0f, 0, 0.45f}), (std::set<int>{0}));
  EXPECT_EQ(drawn({1.0f, 0, 0.75f}), (std::set<int>{0, 1}));
  EXPECT_EQ(drawn({1.0f, 0, 0.9f}), (std::set<int>{0, 1, 2}));
  EXPECT_EQ(drawn({1.0f, 0, 1.0f}), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(drawn({1.0f, 2, 0.99f}), (std::set<int>{0, 1}));
  // Within the nucleus the draw keeps the tokens' ratio: 0.5 : 0.3.
  std::mt19937_64 rng(5);
  int zeros = 0;
  for (int i = 0; i < 4000; i++) zeros += sample_token(logits.data(), 4, {1.0f, 0, 0.75f}, rng) == 0;
  EXPECT_NEAR(zeros / 4000.0, 0.625, 0.03);  // 5/8; 0.03 is about 4 standard deviations
}

TEST(Sampling, LogprobsAreTheModelsLogSoftmax) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f, 2.0f};
  double sum = 0;
  for (float l : logits) sum += std::exp((double)l);
  for (int t = 0; t < 6; t++) EXPECT_NEAR(token_logprob(logits.data(), 6, t), logits[t] - std::log(sum), 1e-12) << t;
  const std::vector<TokenLogprob> top = top_logprobs(logits.data(), 6, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);  // a tie with 5, broken by id
  EXPECT_EQ(top[1].token, 5);
  EXPECT_EQ(top[2].token, 3);
  for (const TokenLogprob& t : top) EXPECT_DOUBLE_EQ(t.logprob, token_logprob(logits.data(), 6, t.token));
  EXPECT_TRUE(top_logprobs(logits.data(), 6, 0).empty());
  EXPECT_EQ(top_logprobs(logits.data(), 6, 99).size(), 6u);
}

// Text streamed in pieces: what feed() returns, joined, is the text up to the first stop
// string, and nothing that may start one is shown before it is known not to.
TEST(Sampling, StopStringsEndTheTextAndHoldBackTheirStarts) {
  auto run = [](std::vector<std::string> stops, std::vector<std::string> pieces, bool* stopped) {
    StopStrings s(std::move(stops));
    std::string out;
    for (const std::string& p : pieces) out += s.feed(p);
    out += s.finish();
    *stopped = s.stopped();
    return out;
  };
  bool stopped = false;
  EXPECT_EQ(run({"\n\n", "END"}, {"ab", "c\n", "\nxyz"}, &stopped), "abc");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run({"END"}, {"fooENDbar", "more"}, &stopped), "foo");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run({"END"}, {"E", "N", "x"}, &stopped), "ENx");  // held, then shown
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run({"END"}, {"xE", "N"}, &stopped), "xEN");  // the held tail comes out at the end
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run({"o w", "lo"}, {"Hel", "lo w", "orld"}, &stopped), "Hel");  // the earliest stop wins
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run({}, {"a", "b"}, &stopped), "ab");
  StopStrings s({"END"});
  EXPECT_EQ(s.feed("aE"), "a");  // "E" may start "END": held back
}

}  // namespace
}  // namespace meshtrain::infer::test_decoder
