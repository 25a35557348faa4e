// PowerSGD (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient
// Compression for Distributed Optimization"), as torch's powerSGD_hook runs it: one power
// iteration per step, warm-started from the last step's Q, with error feedback.
//
// For each n x m matrix M of the buffer (this rank's gradient plus its error), at rank r:
//   Q  = orthonormalise(Q)        the last step's Q (random the first time, the same on
//                                 every rank)
//   P  = M Q                      n x r, all-reduced (summed; its scale does not matter)
//   P  = orthonormalise(P)        Gram-Schmidt on the columns
//   Q  = Mᵀ P                     m x r, all-reduced and divided by N
//   M' = P Qᵀ                     the group's mean, at rank r, the same on every rank
//   error = M - M'
// A matrix is compressed only when r (n + m) < n m; the other elements (vectors, small
// matrices) are all-reduced exactly, with no error kept. Every matrix's P goes in one
// all-reduce and every Q in one more, so a call is three collectives whatever the count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/group.h"

namespace meshtrain::compress {

// A row-major rows x cols block of a flat buffer.
struct MatrixBlock {
  size_t offset = 0;
  int rows = 0, cols = 0;
};

class PowerSgd {
 public:
  // A buffer of `size` floats whose `matrices` (disjoint blocks) may be compressed at rank
  // `rank`; `seed` draws the first Q (every rank passes the same).
  PowerSgd(comm::Group& group, size_t size, std::vector<MatrixBlock> matrices, int rank, uint64_t seed);

  // buffer: this rank's gradient in, the group's mean out (the compressed blocks at rank r,
  // the rest exact), or with kSum the group's sum (N times the mean: the engine's gradients
  // are sums over ranks; the error and the warm start are the same either way). error: size
  // floats, this rank's, updated on the compressed blocks (zero elsewhere).
  enum class Result { kMean, kSum };
  void reduce(float* buffer, float* error, Result result = Result::kMean);

  // The blocks compressed, and the elements all-reduced exactly.
  const std::vector<MatrixBlock>& compressed() const { return compressed_; }
  size_t exact_elements() const { return exact_count_; }
  // What one reduce() sends from each rank, in bytes, by the comm layer's count of its three
  // all-reduces (P, Q and the exact elements): 2 (N-1)/N x 4 x (sum r(n+m) + exact).
  int64_t wire_bytes() const;
  // The warm start: every compressed block's Q (m x r), in block order (checkpoints).
  std::vector<float>& q_memory() { return q_; }

 private:
  comm::Group& group_;
  size_t size_;
  int rank_;
  std::vector<MatrixBlock> compressed_;
  std::vector<std::pair<size_t, size_t>> exact_;  // [begin, end) ranges all-reduced exactly
  size_t exact_count_ = 0;
  std::vector<size_t> p_at_, q_at_;  // each block's offset in p_ and q_
  std::vector<float> p_, q_, exact_values_;
  std::vector<float> approx_;  // one block's P Qᵀ, reused across calls
};

// Gram-Schmidt on the columns of a row-major rows x cols matrix, in place (as torch's
// _orthogonalize_gram_schmidt with epsilon 0; an all-zero column stays zero).
void orthonormalize_columns(float* a, int rows, int cols);

}  // namespace meshtrain::compress
