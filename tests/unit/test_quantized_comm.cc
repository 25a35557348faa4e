// ZeRO++'s quantized communication (compress/int8_blocks.h, parallel/dp/quantized_comm.h):
//   Int8Blocks       the codes against a plain restatement (scale max|x|/127, round half
//                    away from zero), every decoded value within half a scale, a block's peak
//                    exact, zeros and a non-finite value's block, accumulation;
//   QuantizedComm    on thread ranks: the int8 all-gather gives every rank the same decoded
//                    shards, its own included (fp32 and bf16 words); the all-to-all
//                    reduce-scatter sums in rank order, its own chunk exact; both send the
//                    formula's bytes;
//   DataParallelThreads.Zero3QuantizedTrainsNearExact  ZeRO-3 at dp 2 with both: every rank
//                    reports the same losses, near the exact run's (bound below), on about a
//                    quarter of its bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/thread_group.h"
#include "compress/int8_blocks.h"
#include "data/loader.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/dp/quantized_comm.h"
#include "thread_ranks_test_util.h"
#include "train/trainer.h"

namespace meshtrain::test_quantized_comm {
namespace {

using compress::int8_bytes;

// Values whose magnitude changes from block to block (a norm's gains beside a matrix).
std::vector<float> varied_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = d(rng) * std::pow(10.f, (float)((i / 37) % 5) - 2.f);
  return v;
}

// The restatement: block b's largest magnitude, whose 127th is its scale.
float naive_peak(const std::vector<float>& x, size_t b, size_t block) {
  float peak = 0;
  for (size_t i = b * block; i < std::min(x.size(), (b + 1) * block); i++) peak = std::max(peak, std::fabs(x[i]));
  return peak;
}

std::vector<float> round_trip(const std::vector<float>& x, size_t block) {
  std::vector<uint8_t> bytes(int8_bytes(x.size(), block));
  compress::quantize_int8(x.data(), x.size(), block, bytes.data());
  std::vector<float> out(x.size());
  compress::dequantize_int8(bytes.data(), x.size(), block, out.data());
  return out;
}

TEST(Int8Blocks, CodesAreTheRestatementsAndWithinHalfAScale) {
  for (size_t block : {1u, 7u, 64u, 256u}) {
    for (size_t n : {1u, 100u, 1000u, 70001u}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " block " << block);
      const std::vector<float> x = varied_values(n, (unsigned)(n + block));
      std::vector<uint8_t> bytes(int8_bytes(n, block));
      ASSERT_EQ(bytes.size(), (n + block - 1) / block * 4 + n);
      compress::quantize_int8(x.data(), n, block, bytes.data());
      std::vector<float> out(n);
      compress::dequantize_int8(bytes.data(), n, block, out.data());
      const size_t blocks = (n + block - 1) / block;
      int bad = 0;
      for (size_t b = 0; b < blocks; b++) {
        const float peak = naive_peak(x, b, block), scale = peak / 127.f;
        float stored;
        std::memcpy(&stored, bytes.data() + 4 * b, 4);
        // (A division by 127 may be compiled as a multiplication by its reciprocal: an ulp.)
        EXPECT_NEAR(stored, scale, 2e-7f * scale) << "block " << b;
        for (size_t i = b * block; i < std::min(n, (b + 1) * block); i++) {
          const int code = (int8_t)bytes[blocks * 4 + i];
          const int expect = peak == 0 ? 0 : (int)std::clamp(std::round(x[i] * (127.f / peak)), -127.f, 127.f);
          bad += code != expect;
          bad += !(std::fabs(out[i] - x[i]) <= 0.5f * scale * (1 + 1e-5f));
          // The block's peak comes back to within a rounding of its scale's product.
          bad += std::fabs(x[i]) == peak && std::fabs(out[i] - x[i]) > 1e-6f * peak;
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Int8Blocks, ZerosNonFiniteAndAccumulation) {
  std::vector<float> x(20, 0.f);
  EXPECT_EQ(round_trip(x, 8), x) << "zeros decode to zeros";
  x[3] = NAN;
  x[12] = 1.f;
  const std::vector<float> out = round_trip(x, 8);
  for (size_t i = 0; i < 8; i++) EXPECT_TRUE(std::isnan(out[i])) << "the NaN's block is NaN, " << i;
  for (size_t i = 8; i < 20; i++) EXPECT_EQ(out[i], x[i]) << i;
  x[3] = INFINITY;
  EXPECT_TRUE(std::isnan(round_trip(x, 8)[0])) << "an infinity's block too";
  const std::vector<float> y = varied_values(300, 5);
  std::vector<uint8_t> bytes(int8_bytes(300, 32));
  compress::quantize_int8(y.data(), 300, 32, bytes.data());
  std::vector<float> decoded(300), acc(300, 2.f);
  compress::dequantize_int8(bytes.data(), 300, 32, decoded.data());
  compress::dequantize_int8(bytes.data(), 300, 32, acc.data(), /*accumulate=*/true);
  // (The accumulation may be compiled as a fused multiply-add: within a rounding.)
  for (size_t i = 0; i < 300; i++) EXPECT_NEAR(acc[i], 2.f + decoded[i], 2.4e-7f * (2.f + std::fabs(decoded[i]))) << i;
}

TEST(QuantizedComm, GatherDecodesEveryShardAlikeOnEveryRank) {
  constexpr int N = 3;
  constexpr size_t n = 1000, block = 64;
  comm::ThreadWorld world(N);
  std::vector<std::vector<float>> out(N, std::vector<float>(N * n));
  std::vector<std::vector<uint16_t>> out_half(N, std::vector<uint16_t>(N * n));
  std::vector<int64_t> bytes(N);
  comm::run_ranks(N, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    const std::vector<float> shard = varied_values(n, 10 + r);
    parallel::iall_gather_int8(*g, shard.data(), n, block, out[r].data())->wait();
    std::vector<uint16_t> words(n);
    kernels::to_half(kernels::Precision::kBf16, shard.data(), words.data(), n);
    parallel::iall_gather_int8(*g, kernels::Precision::kBf16, words.data(), n, block, out_half[r].data())->wait();
    bytes[r] = g->stats().bytes;
  });
  for (int src = 0; src < N; src++) {
    const std::vector<float> expect = round_trip(varied_values(n, 10 + src), block);
    std::vector<float> widened(n), expect_bf16(n);
    std::vector<uint16_t> words(n);
    kernels::to_half(kernels::Precision::kBf16, varied_values(n, 10 + src).data(), words.data(), n);
    kernels::from_half(kernels::Precision::kBf16, words.data(), widened.data(), n);
    const std::vector<float> decoded_bf16 = round_trip(widened, block);
    std::vector<uint16_t> expect_words(n);
    kernels::to_half(kernels::Precision::kBf16, decoded_bf16.data(), expect_words.data(), n);
    for (int r = 0; r < N; r++) {
      EXPECT_EQ(std::vector<float>(out[r].begin() + src * n, out[r].begin() + (src + 1) * n), expect)
          << "rank " << r << ", shard of " << src;
      EXPECT_EQ(std::vector<uint16_t>(out_half[r].begin() + src * n, out_half[r].begin() + (src + 1) * n),
                expect_words)
          << "bf16: rank " << r << ", shard of " << src;
    }
  }
  for (int r = 0; r < N; r++) EXPECT_EQ(bytes[r], 2 * parallel::int8_collective_bytes(N, n, block)) << r;
  EXPECT_EQ(parallel::int8_collective_bytes(N, n, block), (N - 1) * (int64_t)(16 * 4 + n));
}

TEST(QuantizedComm, ReduceScatterSumsInRankOrderWithItsOwnChunkExact) {
  constexpr int N = 4;
  constexpr size_t n = 777, block = 256;
  comm::ThreadWorld world(N);
  std::vector<std::vector<float>> out(N, std::vector<float>(n));
  std::vector<int64_t> bytes(N);
  auto send_of = [](int r) { return varied_values(N * n, 100 + r); };
  comm::run_ranks(N, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    const std::vector<float> send = send_of(r);
    parallel::ireduce_scatter_int8(*g, send.data(), n, block, out[r].data())->wait();
    bytes[r] = g->stats().bytes;
  });
  for (int r = 0; r < N; r++) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The restatement: chunk r of every rank's send, decoded but for rank r's own, summed
    // in rank order.
    std::vector<float> expect(n, 0.f), magnitude(n, 0.f);
    for (int j = 0; j < N; j++) {
      const std::vector<float> all = send_of(j);
      std::vector<float> chunk(all.begin() + r * n, all.begin() + (r + 1) * n);
      if (j != r) chunk = round_trip(chunk, block);
      for (size_t i = 0; i < n; i++) expect[i] = j == 0 ? chunk[i] : expect[i] + chunk[i];
      for (size_t i = 0; i < n; i++) magnitude[i] += std::fabs(chunk[i]);
    }
    // Within a rounding per term (the decoding may fuse its multiply into the sum).
    for (size_t i = 0; i < n; i++) EXPECT_NEAR(out[r][i], expect[i], 2.4e-7f * N * magnitude[i]) << i;
    EXPECT_EQ(bytes[r], parallel::int8_collective_bytes(N, n, block));
  }
}

// ZeRO-3 at dp 2 over thread ranks, both quantized: the losses of 5 steps against the exact
// run, and the bytes on dp.
TEST(DataParallelThreads, Zero3QuantizedTrainsNearExact) {
  constexpr int kSteps = 5;
  const model::GptConfig c = testing_util::small_gpt(2);
  model::Gpt full(c);
  full.init_weights(11);
  const data::TokenLoader data = testing_util::random_tokens(2000);
  const optim::AdamWConfig adamw = testing_util::test_adamw(1.0f);
  auto run = [&](bool quantized, std::vector<float>* losses, int64_t* bytes) {
    comm::ThreadWorld world(2);
    std::vector<std::vector<float>> per_rank(2);
    comm::run_ranks(2, [&](int r) {
      std::unique_ptr<comm::Group> g = world.group(r, "dp");
      model::Gpt gpt(c, parallel::model_state_for_stage(3));
      parallel::DpConfig config{3, 25, true};
      config.quantized.weights = config.quantized.grads = quantized;
      parallel::DataParallel dp(gpt, *g, config, adamw, full.params());
      for (int k = 0; k < kSteps; k++)
        per_rank[r].push_back(train::train_step(gpt, dp, *g, adamw, data, {2, 1, 16, 2, r}, k, kSteps).loss);
      if (r == 0) *bytes = g->stats().bytes;
    });
    EXPECT_EQ(per_rank[0], per_rank[1]) << "every rank reports the global loss";
    *losses = per_rank[0];
  };
  std::vector<float> exact, quantized;
  int64_t exact_bytes = 0, quantized_bytes = 0;
  run(false, &exact, &exact_bytes);
  run(true, &quantized, &quantized_bytes);
  double worst = 0;
  for (int k = 0; k < kSteps; k++) worst = std::max(worst, std::fabs((double)quantized[k] - exact[k]));
  EXPECT_GT(worst, 0.0) << "the quantized run computes with decoded weights";
  // Each weight moves by up to 1/254 of its block's peak: the worst step measured 0.0083
  // apart (4.6462 against 4.6545) when this was written; the bound is three times that.
  EXPECT_LT(worst, 0.025);
  // Every gather and reduce-scatter sends int8 blocks: a quarter of fp32 and a scale per 256.
  const double ratio = (double)quantized_bytes / (double)exact_bytes;
  EXPECT_GT(ratio, 0.25);
  EXPECT_LT(ratio, 0.27);
}

}  // namespace
}  // namespace meshtrain::test_quantized_comm
