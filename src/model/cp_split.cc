#include "model/cp_split.h"

#include <algorithm>

namespace meshtrain::model {

int CpSplit::keys_before(int x, int owner, int T, int b) const {
  const int c = chunk(T);
  int n = 0;
  for (int i = 0; i < per_rank; i++) n += std::clamp(x - owned_chunk(b, owner, i) * c, 0, c);
  return n;
}

std::vector<int> CpSplit::take(const int* full, int B, int T) const {
  const int Tl = local(T);
  std::vector<int> out((size_t)B * Tl);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++) out[(size_t)b * Tl + t] = full[(size_t)b * T + sequence_index(t, T, b)];
  return out;
}

namespace {

// The keys each chunk's rows see in sequence b (causal inside each document).
std::vector<double> chunk_costs(const DocumentRows& whole, int b, int T, int chunks) {
  const int c = T / chunks;
  std::vector<double> cost(chunks, 0.0);
  for (int x = 0; x < T; x++) cost[x / c] += x + 1 - whole.key_begin[(size_t)b * T + x];
  return cost;
}

// The most loaded rank's cost in sequence b under a split.
double max_load(const CpSplit& s, const std::vector<double>& cost, int b) {
  double most = 0;
  for (int r = 0; r < s.size; r++) {
    double load = 0;
    for (int i = 0; i < s.per_rank; i++) load += cost[s.owned_chunk(b, r, i)];
    most = std::max(most, load);
  }
  return most;
}

// Sequence b's chunks dealt by cost (greedy, longest first), each rank's then ascending.
std::vector<int> deal_chunks(const std::vector<double>& cost, int size, int per_rank) {
  std::vector<int> order(cost.size());
  for (size_t q = 0; q < order.size(); q++) order[q] = (int)q;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a] > cost[b]; });
  std::vector<std::vector<int>> ranks(size);
  std::vector<double> load(size, 0.0);
  for (int q : order) {
    int best = -1;
    for (int r = 0; r < size; r++)
      if ((int)ranks[r].size() < per_rank && (best < 0 || load[r] < load[best])) best = r;
    ranks[best].push_back(q), load[best] += cost[q];
  }
  std::vector<int> owned;
  for (auto& mine : ranks) std::sort(mine.begin(), mine.end()), owned.insert(owned.end(), mine.begin(), mine.end());
  return owned;
}

}  // namespace

CpSplit balanced_split(const DocumentRows& whole, int B, int T, int size, int rank) {
  const CpSplit causal{size, rank};
  int per_rank = 8;
  while (per_rank > 2 && T % (size * per_rank) != 0) per_rank /= 2;
  CpSplit out{size, rank, per_rank, {}};
  out.owned.reserve((size_t)B * size * per_rank);
  bool better = false;
  for (int b = 0; b < B; b++) {
    const std::vector<double> cost = chunk_costs(whole, b, T, size * per_rank);
    std::vector<int> dealt = deal_chunks(cost, size, per_rank);
    CpSplit one{size, rank, per_rank, dealt};
    // The causal split's loads, at this granularity: chunk i of the causal split is these
    // chunks [i g, (i+1) g), g = per_rank / 2.
    const int g = per_rank / 2;
    std::vector<double> coarse(2 * size, 0.0);
    for (size_t q = 0; q < cost.size(); q++) coarse[q / g] += cost[q];
    if (max_load(one, cost, 0) < max_load(causal, coarse, 0)) better = true;
    else dealt = {};  // (this sequence keeps the causal split, written out at this granularity)
    if (dealt.empty())
      for (int r = 0; r < size; r++)
        for (int i = 0; i < per_rank; i++) {
          const int half = i < g ? r : 2 * size - 1 - r;  // the causal chunk, then its part
          dealt.push_back(half * g + i % g);
        }
    out.owned.insert(out.owned.end(), dealt.begin(), dealt.end());
  }
  return better ? out : causal;
}

double split_imbalance(const CpSplit& split, const DocumentRows& whole, int B, int T) {
  double worst = 1;
  for (int b = 0; b < B; b++) {
    const std::vector<double> cost = chunk_costs(whole, b, T, split.size * split.per_rank);
    double total = 0;
    for (double x : cost) total += x;
    if (total > 0) worst = std::max(worst, max_load(split, cost, b) / (total / split.size));
  }
  return worst;
}

DocumentRows local_rows(const CpSplit& split, const DocumentRows* whole, int B, int T) {
  const int Tl = split.local(T);
  DocumentRows rows;
  const size_t N = (size_t)B * Tl;
  rows.positions.resize(N), rows.key_begin.resize(N), rows.key_end.resize(N);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++) {
      const size_t i = (size_t)b * Tl + t;
      const int g = split.sequence_index(t, T, b);
      rows.positions[i] = whole ? whole->positions[(size_t)b * T + g] : g;
      rows.key_begin[i] = whole ? whole->key_begin[(size_t)b * T + g] : 0;
      rows.key_end[i] = g + 1;
    }
  return rows;
}

}  // namespace meshtrain::model
