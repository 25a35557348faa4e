// Which rows of each sequence a context-parallel rank holds (model/cp_split.h).
//
//   CausalSplitIsTwoChunksPerRank  rank r holds chunks r and 2N-1-r, and keys_before counts
//                                  its rows below any index.
//   BalancedSplitPartitionsEachSequence  under documents: every index of every sequence on
//                                  exactly one rank, each rank's rows ascending and as many
//                                  as the others', local_rows at those indices, and its most
//                                  loaded rank below the causal split's.
//   WithoutDocumentsTheCausalSplitStays  one document per row: the causal split is already
//                                  balanced, and is kept.
//   PackedBrownDocuments           the Brown corpus's documents packed into rows of 8192
//                                  tokens: the most loaded rank's attending keys over the
//                                  mean, causal against balanced, at cp 4, 8 and 16 (printed;
//                                  docs/long_context.md quotes them).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "cli_test_util.h"
#include "model/cp_split.h"

namespace meshtrain::model::test_cp_split {
namespace {

// Rows of B sequences of T tokens whose documents start at `starts` (sequence indices; 0 is
// always a start).
DocumentRows rows_with_documents(const std::vector<std::vector<int>>& starts, int T) {
  DocumentRows d;
  for (const auto& s : starts) {
    int begin = 0;
    for (int x = 0; x < T; x++) {
      for (int start : s)
        if (start == x) begin = x;
      d.positions.push_back(x - begin), d.key_begin.push_back(begin), d.key_end.push_back(x + 1);
    }
  }
  return d;
}

TEST(CpSplit, CausalSplitIsTwoChunksPerRank) {
  const int N = 4, T = 64, c = T / (2 * N);
  for (int r = 0; r < N; r++) {
    const CpSplit s{N, r};
    for (int t = 0; t < T / N; t++)
      EXPECT_EQ(s.sequence_index(t, T), t < c ? r * c + t : (2 * N - 1 - r) * c + t - c);
    for (int x = 0; x <= T; x++) {
      int below = 0;
      for (int t = 0; t < T / N; t++) below += s.sequence_index(t, T) < x;
      EXPECT_EQ(s.keys_before(x, r, T), below) << "rank " << r << " x " << x;
    }
  }
}

TEST(CpSplit, BalancedSplitPartitionsEachSequence) {
  const int N = 4, T = 256, B = 3;
  // A long document then short ones; short ones then a long one; many of one length.
  const std::vector<std::vector<int>> starts = {{0, 200, 210, 230}, {0, 10, 20, 40, 60}, {0, 32, 64, 96, 128, 160, 192, 224}};
  const DocumentRows whole = rows_with_documents(starts, T);
  std::vector<int> tokens(B * T);
  for (int i = 0; i < B * T; i++) tokens[i] = 1000 + i;
  std::vector<int> seen(B * T, 0);
  double balanced_imbalance = 0;
  for (int r = 0; r < N; r++) {
    const CpSplit s = balanced_split(whole, B, T, N, r);
    ASSERT_FALSE(s.owned.empty()) << "documents this uneven gain from balancing";
    EXPECT_EQ(s.per_rank, 8);
    balanced_imbalance = split_imbalance(s, whole, B, T);
    const std::vector<int> mine = s.take(tokens.data(), B, T);
    ASSERT_EQ((int)mine.size(), B * T / N);
    const DocumentRows local = local_rows(s, &whole, B, T);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T / N; t++) {
        const int x = s.sequence_index(t, T, b), i = b * (T / N) + t;
        if (t > 0) EXPECT_LT(s.sequence_index(t - 1, T, b), x) << "rows ascend";
        seen[b * T + x]++;
        EXPECT_EQ(mine[i], tokens[b * T + x]);
        EXPECT_EQ(local.positions[i], whole.positions[b * T + x]);
        EXPECT_EQ(local.key_begin[i], whole.key_begin[b * T + x]);
        EXPECT_EQ(local.key_end[i], x + 1);
      }
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  const double causal = split_imbalance(CpSplit{N, 0}, whole, B, T);
  EXPECT_LT(balanced_imbalance, causal);
  EXPECT_LT(balanced_imbalance, 1.1);
}

TEST(CpSplit, WithoutDocumentsTheCausalSplitStays) {
  const DocumentRows whole = rows_with_documents({{0}, {0}}, 128);
  for (int N : {2, 4}) {
    const CpSplit s = balanced_split(whole, 2, 128, N, 1);
    EXPECT_TRUE(s.owned.empty());
    EXPECT_NEAR(split_imbalance(s, whole, 2, 128), 1.0, 1e-12);
  }
}

// train.docs of the Brown corpus as `meshtrain prep --brown` writes it (the tests' shared
// copy): the offsets of the documents in train.bin (uint64). Rows of T tokens cut from the
// stream as the loader packs them.
std::vector<std::vector<int>> brown_rows(const std::string& corpus, int T, int rows) {
  std::ifstream in(corpus + "/train.docs", std::ios::binary);
  std::vector<uint64_t> offsets;
  for (uint64_t x; in.read(reinterpret_cast<char*>(&x), sizeof x);) offsets.push_back(x);
  std::vector<std::vector<int>> out;
  size_t next = 0;
  for (int w = 0; w < rows && !offsets.empty() && (uint64_t)(w + 1) * T <= offsets.back(); w++) {
    std::vector<int> starts = {0};
    while (next < offsets.size() && offsets[next] < (uint64_t)(w + 1) * T) {
      if (offsets[next] > (uint64_t)w * T) starts.push_back((int)(offsets[next] - (uint64_t)w * T));
      next++;
    }
    out.push_back(starts);
  }
  return out;
}

TEST(CpSplit, PackedBrownDocuments) {
  const int T = 8192;
  std::string error;
  const std::string corpus = cli_test::shared_brown_corpus(&error);
  ASSERT_FALSE(corpus.empty()) << error;
  const std::vector<std::vector<int>> rows = brown_rows(corpus, T, 120);
  ASSERT_GE(rows.size(), 100u) << corpus << "/train.docs";
  const int B = (int)rows.size();
  for (int N : {4, 8, 16}) {
    double causal_mean = 0, balanced_mean = 0, causal_worst = 0, balanced_worst = 0;
    for (int b = 0; b < B; b++) {
      const DocumentRows one = rows_with_documents({rows[b]}, T);
      const double c = split_imbalance(CpSplit{N, 0}, one, 1, T);
      const double s = split_imbalance(balanced_split(one, 1, T, N, 0), one, 1, T);
      EXPECT_LE(s, c * (1 + 1e-12)) << "row " << b;
      causal_mean += c / B, balanced_mean += s / B;
      causal_worst = std::max(causal_worst, c), balanced_worst = std::max(balanced_worst, s);
    }
    std::printf("[ cp split ] Brown, %d rows of %d tokens, cp %2d: most loaded rank / mean: causal %.3f (worst %.3f), "
                "balanced %.3f (worst %.3f)\n",
                B, T, N, causal_mean, causal_worst, balanced_mean, balanced_worst);
    EXPECT_LT(balanced_mean, causal_mean);
  }
}

}  // namespace
}  // namespace meshtrain::model::test_cp_split
