// Communication compression (src/compress/): the 1-bit block against a hand-worked example
// and its invariants, error feedback's telescoping sum, and the two-stage compressed
// all-reduce of 1-bit Adam on thread ranks against a plain re-statement of the algorithm,
// with its wire bytes against the formula; PowerSGD's orthonormalisation, its exactness on
// gradients of rank r, a plain restatement of one step, and its bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/self_group.h"
#include "comm/thread_group.h"
#include "compress/onebit.h"
#include "compress/powersgd.h"

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

// A chunk in scale blocks: each block of b values decompresses to ±(its own RMS), as a
// block compressed alone would; the bytes are the blocks' back to back.
TEST(OneBitAllReduce, ScaleBlocksFollowTheMagnitudeOfEachBlock) {
  const size_t n = 1000, b = 256;  // 3 full blocks and one of 232
  std::vector<float> x = random_values(n, 3);
  for (size_t i = 0; i < 256; i++) x[i] *= 100.0f;  // the first block 100x the others
  std::vector<float> error(n, 0.f), alone_error(n, 0.f), out(n), alone(n);
  std::vector<uint8_t> chunk(compress::onebit_chunk_bytes(n, b));
  EXPECT_EQ(chunk.size(), 3 * (4 + 32) + (4 + 29));
  EXPECT_EQ(compress::OneBitAllReduce::wire_bytes(2, n, b), 2 * (int64_t)chunk.size());
  compress::compress_onebit_chunk(x.data(), error.data(), n, b, chunk.data());
  compress::decompress_onebit_chunk(chunk.data(), n, b, out.data());
  for (size_t at = 0; at < n; at += b) {
    const size_t k = std::min(b, n - at);
    std::vector<uint8_t> block(compress::onebit_block_bytes(k));
    compress::compress_onebit(x.data() + at, alone_error.data() + at, k, block.data());
    compress::decompress_onebit(block.data(), k, alone.data() + at);
  }
  EXPECT_EQ(out, alone);
  EXPECT_EQ(error, alone_error);
  EXPECT_GT(std::fabs(out[0]), 50 * std::fabs(out[n - 1]));  // each block keeps its own scale
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

// ---- PowerSGD --------------------------------------------------------------------------

TEST(PowerSgd, OrthonormalizeKeepsTheColumnSpan) {
  const int rows = 7, cols = 3;
  std::vector<float> a = random_values(rows * cols, 5), q = a;
  compress::orthonormalize_columns(q.data(), rows, cols);
  for (int i = 0; i < cols; i++)
    for (int j = 0; j < cols; j++) {
      double dot = 0;
      for (int r = 0; r < rows; r++) dot += (double)q[r * cols + i] * q[r * cols + j];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
  // Gram-Schmidt: column j of A lies in the span of Q's first j + 1 columns (Qᵀ A is upper
  // triangular), so the span of every leading set of columns is kept.
  for (int i = 0; i < cols; i++)
    for (int j = 0; j < i; j++) {
      double dot = 0;
      for (int r = 0; r < rows; r++) dot += (double)q[r * cols + i] * a[r * cols + j];
      EXPECT_NEAR(dot, 0.0, 1e-4) << "Q column " << i << " against A column " << j;
    }
}

// Per-rank gradients sharing one column space of dimension r: one power iteration finds it,
// so the compressed mean is the exact mean, and the errors (M_i - mean) sum to zero.
TEST(PowerSgd, GradientsOfRankRAreAveragedExactly) {
  const int N = 3, n = 24, m = 16, r = 2;
  const std::vector<float> U = random_values(n * r, 40);
  std::vector<std::vector<float>> grads(N, std::vector<float>(n * m + 5)), errors(N, std::vector<float>(n * m + 5, 0.f));
  for (int w = 0; w < N; w++) {
    const std::vector<float> V = random_values(m * r, 50 + w);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < m; j++) {
        float x = 0;
        for (int k = 0; k < r; k++) x += U[i * r + k] * V[j * r + k];
        grads[w][i * m + j] = x;
      }
    for (int k = 0; k < 5; k++) grads[w][n * m + k] = (float)(w * 10 + k);  // a vector: sent exactly
  }
  std::vector<float> mean(n * m + 5, 0.f);
  for (int w = 0; w < N; w++)
    for (size_t i = 0; i < mean.size(); i++) mean[i] += grads[w][i] / N;
  comm::ThreadWorld world(N);
  std::vector<int64_t> bytes(N), predicted(N);
  // The same inputs summed (the engine's convention): N times the mean, the same errors.
  std::vector<std::vector<float>> sums = grads, sum_errors = errors;
  comm::run_ranks(N, [&](int w) {
    std::unique_ptr<comm::Group> g = world.group(w, "dp");
    compress::PowerSgd psgd(*g, grads[w].size(), {{0, n, m}}, r, 7);
    EXPECT_EQ(psgd.compressed().size(), 1u);
    EXPECT_EQ(psgd.exact_elements(), 5u);
    psgd.reduce(grads[w].data(), errors[w].data());
    bytes[w] = g->stats().bytes, predicted[w] = psgd.wire_bytes();
    compress::PowerSgd summing(*g, sums[w].size(), {{0, n, m}}, r, 7);
    summing.reduce(sums[w].data(), sum_errors[w].data(), compress::PowerSgd::Result::kSum);
  });
  for (int w = 0; w < N; w++) {
    for (size_t i = 0; i < mean.size(); i++) ASSERT_NEAR(grads[w][i], mean[i], 1e-4) << "rank " << w << " element " << i;
    EXPECT_EQ(bytes[w], predicted[w]);
    for (size_t i = 0; i < mean.size(); i++) {
      ASSERT_NEAR(sums[w][i], N * grads[w][i], 1e-5 * (1 + std::fabs(N * grads[w][i]))) << "rank " << w << " element " << i;
      ASSERT_EQ(sum_errors[w][i], errors[w][i]) << "rank " << w << " element " << i;
    }
  }
  for (size_t i = 0; i < mean.size(); i++) {
    double sum = 0;
    for (int w = 0; w < N; w++) sum += errors[w][i];
    EXPECT_NEAR(sum, 0.0, 1e-4) << i;
  }
  // The bytes: all-reduces of n r (P), m r (Q) and 5 (the vector) floats, each 2 (N-1)/N.
  auto ar = [&](int64_t k) { return (int64_t)std::llround(2.0 * (N - 1) * k / N) * 4; };
  EXPECT_EQ(predicted[0], ar(n * r) + ar(m * r) + ar(5));
}

// One step written out plainly (naive loops, the same Gram-Schmidt), on random gradients with
// a non-zero error: the engine's result and errors agree to float rounding. A matrix too
// small to save anything (r (n + m) >= n m) is sent exactly.
TEST(PowerSgd, MatchesAPlainRestatementOfOneStep) {
  const int N = 2, r = 3;
  const std::vector<compress::MatrixBlock> blocks = {{0, 12, 10}, {120, 4, 2}, {128, 9, 20}};
  const size_t size = 128 + 180 + 3;
  std::vector<std::vector<float>> grads(N), errors(N);
  for (int w = 0; w < N; w++) grads[w] = random_values(size, 60 + w), errors[w] = random_values(size, 70 + w);
  for (int w = 0; w < N; w++)  // elements sent exactly keep no error
    for (size_t i = 0; i < size; i++)
      if ((i >= 120 && i < 128) || i >= 308) errors[w][i] = 0;
  // The reference, with the engine's first Q (read from a PowerSgd made with the same seed).
  comm::SelfGroup self("x");
  compress::PowerSgd probe(self, size, blocks, r, 11);
  ASSERT_EQ(probe.compressed().size(), 2u) << "the 4 x 2 block is sent exactly";
  std::vector<float> q0 = probe.q_memory();
  auto matmul = [](const std::vector<double>& A, int n, int k, const std::vector<double>& B, int m, bool ta) {
    // ta: A is k x n, used transposed. Result n x m.
    std::vector<double> C((size_t)n * m, 0.0);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < m; j++)
        for (int l = 0; l < k; l++) C[i * m + j] += (ta ? A[l * n + i] : A[i * k + l]) * B[l * m + j];
    return C;
  };
  auto gram_schmidt = [](std::vector<double>& a, int rows, int cols) {
    for (int i = 0; i < cols; i++) {
      double norm = 0;
      for (int x = 0; x < rows; x++) norm += a[x * cols + i] * a[x * cols + i];
      for (int x = 0; x < rows; x++) a[x * cols + i] /= std::sqrt(norm);
      for (int j = i + 1; j < cols; j++) {
        double dot = 0;
        for (int x = 0; x < rows; x++) dot += a[x * cols + i] * a[x * cols + j];
        for (int x = 0; x < rows; x++) a[x * cols + j] -= dot * a[x * cols + i];
      }
    }
  };
  std::vector<std::vector<double>> want(N, std::vector<double>(size)), want_error(N, std::vector<double>(size, 0.0));
  size_t q_at = 0;
  for (const compress::MatrixBlock& b : {blocks[0], blocks[2]}) {
    const int n = b.rows, m = b.cols;
    std::vector<std::vector<double>> M(N, std::vector<double>((size_t)n * m));
    for (int w = 0; w < N; w++)
      for (int k = 0; k < n * m; k++) M[w][k] = (double)grads[w][b.offset + k] + errors[w][b.offset + k];
    std::vector<double> Q(q0.begin() + q_at, q0.begin() + q_at + (size_t)m * r);
    q_at += (size_t)m * r;
    gram_schmidt(Q, m, r);
    std::vector<double> P((size_t)n * r, 0.0);
    for (int w = 0; w < N; w++) {
      const std::vector<double> Pw = matmul(M[w], n, m, Q, r, false);
      for (size_t k = 0; k < P.size(); k++) P[k] += Pw[k];
    }
    gram_schmidt(P, n, r);
    std::vector<double> Qm((size_t)m * r, 0.0);
    for (int w = 0; w < N; w++) {
      const std::vector<double> Qw = matmul(M[w], m, n, P, r, true);
      for (size_t k = 0; k < Qm.size(); k++) Qm[k] += Qw[k] / N;
    }
    for (int i = 0; i < n; i++)
      for (int j = 0; j < m; j++) {
        double x = 0;
        for (int k = 0; k < r; k++) x += P[i * r + k] * Qm[j * r + k];
        for (int w = 0; w < N; w++) {
          want[w][b.offset + i * m + j] = x;
          want_error[w][b.offset + i * m + j] = M[w][i * m + j] - x;
        }
      }
  }
  for (size_t i = 0; i < size; i++) {
    if ((i >= blocks[0].offset && i < 120) || (i >= 128 && i < 308)) continue;
    double mean = 0;
    for (int w = 0; w < N; w++) mean += (double)grads[w][i] / N;
    for (int w = 0; w < N; w++) want[w][i] = mean;
  }
  comm::ThreadWorld world(N);
  comm::run_ranks(N, [&](int w) {
    std::unique_ptr<comm::Group> g = world.group(w, "dp");
    compress::PowerSgd psgd(*g, size, blocks, r, 11);
    psgd.reduce(grads[w].data(), errors[w].data());
  });
  for (int w = 0; w < N; w++)
    for (size_t i = 0; i < size; i++) {
      ASSERT_NEAR(grads[w][i], want[w][i], 1e-4 * (1 + std::fabs(want[w][i]))) << "rank " << w << " element " << i;
      ASSERT_NEAR(errors[w][i], want_error[w][i], 1e-4 * (1 + std::fabs(want_error[w][i]))) << "error, rank " << w << " element " << i;
    }
}

}  // namespace
}  // namespace meshtrain
