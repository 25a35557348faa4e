// Communication compression (src/compress/): the 1-bit block against a hand-worked example
// and its invariants, error feedback's telescoping sum, and the two-stage compressed
// all-reduce of 1-bit Adam on thread ranks against a plain re-statement of the algorithm,
// with its wire bytes against the formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/thread_group.h"
#include "compress/onebit.h"

namespace meshtrain {
namespace {

using compress::onebit_block_bytes;

std::vector<float> random_values(size_t n, unsigned seed, float shift = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(shift, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float block_scale(const std::vector<uint8_t>& block) {
  float s;
  std::memcpy(&s, block.data(), sizeof s);
  return s;
}

TEST(OneBit, BlockIsSignsAndTheRms) {
  const std::vector<float> x = {1, -2, 0, 3, -0.5f, 4, -1, 2, 5};  // 9 values: 2 bytes of signs
  std::vector<float> error(x.size(), 0.f);
  std::vector<uint8_t> block(onebit_block_bytes(x.size()));
  ASSERT_EQ(block.size(), 4u + 2u);
  compress::compress_onebit(x.data(), error.data(), x.size(), block.data());
  double ss = 0;
  for (float v : x) ss += (double)v * v;
  const float rms = (float)std::sqrt(ss / x.size());
  EXPECT_FLOAT_EQ(block_scale(block), rms);
  // Signs, LSB first: + - + + - + - + | +  (0 counts as +).
  EXPECT_EQ(block[4], 0b10101101);
  EXPECT_EQ(block[5], 0b00000001);
  std::vector<float> out(x.size());
  compress::decompress_onebit(block.data(), x.size(), out.data());
  for (size_t i = 0; i < x.size(); i++) {
    EXPECT_EQ(out[i], x[i] >= 0 ? rms : -rms) << i;
    EXPECT_FLOAT_EQ(error[i], x[i] - out[i]) << "the error is what the block left out, " << i;
  }
  // The block keeps the L2 norm.
  double out_ss = 0;
  for (float v : out) out_ss += (double)v * v;
  EXPECT_NEAR(std::sqrt(out_ss), std::sqrt(ss), 1e-5);
}

// Error feedback loses nothing over time: the decompressed blocks of T rounds sum to the
// inputs' sum plus the initial error minus the final one (up to float rounding).
TEST(OneBit, ErrorFeedbackTelescopes) {
  const size_t n = 300;
  std::vector<float> error(n, 0.f), sum_in(n, 0.f), sum_out(n, 0.f), out(n);
  std::vector<uint8_t> block(onebit_block_bytes(n));
  for (int t = 0; t < 50; t++) {
    const std::vector<float> x = random_values(n, 100 + t, 0.3f);
    compress::compress_onebit(x.data(), error.data(), n, block.data());
    compress::decompress_onebit(block.data(), n, out.data());
    for (size_t i = 0; i < n; i++) sum_in[i] += x[i], sum_out[i] += out[i];
  }
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(sum_out[i], sum_in[i] - error[i], 1e-3) << i;
  // And the error stays bounded, of the order of one round's values, not T of them.
  double max_error = 0;
  for (float e : error) max_error = std::max(max_error, (double)std::fabs(e));
  EXPECT_LT(max_error, 6.0);
}

// The two stages written out plainly on all ranks' data at once, for comparison.
struct Reference {
  int N;
  size_t c;
  std::vector<std::vector<float>> worker_error, server_error;
  Reference(int ranks, size_t chunk)
      : N(ranks), c(chunk), worker_error(ranks, std::vector<float>(ranks * chunk, 0.f)),
        server_error(ranks, std::vector<float>(chunk, 0.f)) {}
  std::vector<float> run(const std::vector<std::vector<float>>& x) {
    const size_t B = onebit_block_bytes(c);
    std::vector<std::vector<uint8_t>> sent(N, std::vector<uint8_t>(N * B));  // [worker][server chunk]
    for (int w = 0; w < N; w++)
      for (int j = 0; j < N; j++)
        compress::compress_onebit(x[w].data() + j * c, worker_error[w].data() + j * c, c, sent[w].data() + j * B);
    std::vector<float> out(N * c);
    for (int j = 0; j < N; j++) {
      std::vector<float> mean(c, 0.f), part(c);
      for (int w = 0; w < N; w++) {
        compress::decompress_onebit(sent[w].data() + j * B, c, part.data());
        for (size_t i = 0; i < c; i++) mean[i] = w == 0 ? part[i] : mean[i] + part[i];
      }
      for (auto& m : mean) m *= 1.0f / N;
      std::vector<uint8_t> block(B);
      compress::compress_onebit(mean.data(), server_error[j].data(), c, block.data());
      compress::decompress_onebit(block.data(), c, out.data() + j * c);
    }
    return out;
  }
};

TEST(OneBitAllReduce, MatchesTheTwoStagesAndCountsItsBytes) {
  const int N = 4;
  const size_t chunk = 1000;  // not a multiple of 8: the last sign byte is partial
  comm::ThreadWorld world(N);
  Reference ref(N, chunk);
  std::vector<std::vector<float>> worker(N, std::vector<float>(N * chunk, 0.f)), server(N, std::vector<float>(chunk, 0.f));
  std::vector<std::vector<float>> out(N, std::vector<float>(N * chunk));
  std::vector<int64_t> bytes(N);
  for (int round = 0; round < 3; round++) {
    std::vector<std::vector<float>> x(N);
    for (int r = 0; r < N; r++) x[r] = random_values(N * chunk, 10 * round + r, 0.1f * r);
    comm::run_ranks(N, [&](int r) {
      std::unique_ptr<comm::Group> g = world.group(r, "dp");
      compress::OneBitAllReduce reduce(*g, chunk);
      reduce.run(x[r].data(), worker[r].data(), server[r].data(), out[r].data());
      bytes[r] = g->stats().bytes;
    });
    const std::vector<float> want = ref.run(x);
    for (int r = 0; r < N; r++) {
      SCOPED_TRACE("round " + std::to_string(round) + " rank " + std::to_string(r));
      EXPECT_EQ(out[r], want) << "every rank ends with the reference's buffer";
      EXPECT_EQ(worker[r], ref.worker_error[r]);
      EXPECT_EQ(server[r], ref.server_error[r]);
      EXPECT_EQ(bytes[r], compress::OneBitAllReduce::wire_bytes(N, chunk));
    }
  }
  // The formula: 2 (N-1) blocks of c/8 + 4 bytes, against an fp32 all-reduce's 2 (N-1) c x 4.
  EXPECT_EQ(compress::OneBitAllReduce::wire_bytes(N, chunk), 2 * (N - 1) * (4 + 125));
  const double fp32 = 2.0 * (N - 1) * chunk * 4;
  // 1/32, plus each block's 4-byte scale: 4 / (4 c) more.
  EXPECT_DOUBLE_EQ(compress::OneBitAllReduce::wire_bytes(N, chunk) / fp32, 1.0 / 32 + 1.0 / chunk);
}

// With error feedback the compressed mean is right on average: over T rounds of the same
// inputs, the mean of the outputs approaches the true mean as 1/T.
TEST(OneBitAllReduce, ErrorFeedbackConvergesToTheMean) {
  const int N = 2;
  const size_t chunk = 64;
  comm::ThreadWorld world(N);
  std::vector<std::vector<float>> x = {random_values(N * chunk, 1, 0.5f), random_values(N * chunk, 2, -0.2f)};
  std::vector<double> sums(N * chunk, 0.0);
  const int T = 200;
  comm::run_ranks(N, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    compress::OneBitAllReduce reduce(*g, chunk);
    std::vector<float> worker(N * chunk, 0.f), server(chunk, 0.f), out(N * chunk);
    for (int t = 0; t < T; t++) {
      reduce.run(x[r].data(), worker.data(), server.data(), out.data());
      if (r == 0)
        for (size_t i = 0; i < out.size(); i++) sums[i] += out[i];
    }
  });
  double worst = 0;
  for (size_t i = 0; i < sums.size(); i++)
    worst = std::max(worst, std::fabs(sums[i] / T - 0.5 * (x[0][i] + x[1][i])));
  EXPECT_LT(worst, 0.1) << "one round's error is ~1; averaged over 200 rounds it shrinks";
}

// Bytes travel bit for bit through the byte collectives (all-to-all and all-gather).
TEST(OneBitAllReduce, ByteCollectivesCopyExactly) {
  const int N = 3;
  comm::ThreadWorld world(N);
  std::vector<std::vector<uint8_t>> a2a(N, std::vector<uint8_t>(N * 5)), ag(N, std::vector<uint8_t>(N * 5));
  comm::run_ranks(N, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "x");
    std::vector<uint8_t> send(N * 5);
    for (size_t i = 0; i < send.size(); i++) send[i] = (uint8_t)(r * 50 + i);
    g->all_to_all(send.data(), a2a[r].data(), 5);
    g->all_gather(send.data(), ag[r].data(), 5);
  });
  for (int r = 0; r < N; r++)
    for (int s = 0; s < N; s++)
      for (int i = 0; i < 5; i++) {
        EXPECT_EQ(a2a[r][s * 5 + i], (uint8_t)(s * 50 + r * 5 + i));
        EXPECT_EQ(ag[r][s * 5 + i], (uint8_t)(s * 50 + i));
      }
}

}  // namespace
}  // namespace meshtrain
