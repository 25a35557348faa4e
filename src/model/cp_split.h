// Which rows of each sequence a context-parallel rank holds (--cp N, docs/long_context.md):
// the causal split (Megatron-Core's load balance, 2N chunks) and, under a document mask,
// one balanced on the keys its rows attend to. Pure functions of the sequences' documents,
// so every rank computes the same split; header of its own so that the activation sets can
// keep a micro-batch's.
#pragma once
#include <cstddef>
#include <vector>

#include "model/document_rows.h"

namespace meshtrain::model {

// Which rows of each T-token sequence cp rank `rank` of `size` holds: the sequence cut into
// size x per_rank equal chunks, each rank holding per_rank of them in ascending order, its
// local rows. The causal split (`owned` empty): 2 per rank, rank r chunks r and 2size-1-r,
// for every sequence. Balanced (balanced_split, under a document mask): each sequence's own
// chunks per rank, `owned` [B][size][per_rank].
struct CpSplit {
  int size = 1, rank = 0;
  int per_rank = 2;
  std::vector<int> owned = {};
  int chunk(int T) const { return T / (size * per_rank); }
  int local(int T) const { return T / size; }
  // Rank owner's i-th chunk of sequence b.
  int owned_chunk(int b, int owner, int i) const {
    return owned.empty() ? (i == 0 ? owner : 2 * size - 1 - owner) : owned[((size_t)b * size + owner) * per_rank + i];
  }
  // The index in sequence b of rank owner's local row t (0 <= t < T/size); of this rank's.
  int sequence_index_of(int owner, int t, int T, int b) const {
    const int c = chunk(T);
    return owned_chunk(b, owner, t / c) * c + t % c;
  }
  int sequence_index(int t, int T, int b = 0) const { return sequence_index_of(rank, t, T, b); }
  // Keys of rank `owner` (its local rows, in order) whose index in sequence b is below x.
  int keys_before(int x, int owner, int T, int b = 0) const;
  // The rank's rows of B sequences of T values each, in local order.
  std::vector<int> take(const int* full, int B, int T) const;
};

// The split whose ranks attend to about the same number of keys under a document mask
// (`whole`: the whole sequences' rows): each sequence cut into size x per_rank chunks, each
// chunk's cost the keys its rows see, and the chunks dealt, most costly first, to the rank
// with the least cost so far among those still short of per_rank; kept only where it beats
// the causal split's most loaded rank (per_rank: 8, 4 or 2, the most that divides T).
CpSplit balanced_split(const DocumentRows& whole, int B, int T, int size, int rank);
// The keys the most loaded rank's rows see, over the mean, for each sequence of a split.
double split_imbalance(const CpSplit& split, const DocumentRows& whole, int B, int T);

// Each local row's position and visible keys (in sequence indices) under cp: from the
// document rows of the whole sequences (a document mask) or causal ones.
DocumentRows local_rows(const CpSplit& split, const DocumentRows* whole, int B, int T);

}  // namespace meshtrain::model
