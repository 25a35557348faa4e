#include "compress/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/check.h"
#include "comm/self_group.h"
#include "kernels/ops.h"

namespace meshtrain::compress {

void orthonormalize_columns(float* a, int rows, int cols) {
  for (int i = 0; i < cols; i++) {
    double norm = 0;
    for (int r = 0; r < rows; r++) norm += (double)a[(size_t)r * cols + i] * a[(size_t)r * cols + i];
    const float inv = norm > 0 ? (float)(1.0 / std::sqrt(norm)) : 0.f;
    for (int r = 0; r < rows; r++) a[(size_t)r * cols + i] *= inv;
    // Remove column i from the columns after it.
    for (int j = i + 1; j < cols; j++) {
      double dot = 0;
      for (int r = 0; r < rows; r++) dot += (double)a[(size_t)r * cols + i] * a[(size_t)r * cols + j];
      for (int r = 0; r < rows; r++) a[(size_t)r * cols + j] -= (float)dot * a[(size_t)r * cols + i];
    }
  }
}

PowerSgd::PowerSgd(comm::Group& group, size_t size, std::vector<MatrixBlock> matrices, int rank, uint64_t seed)
    : group_(group), size_(size), rank_(rank) {
  CHECK(rank >= 1);
  std::sort(matrices.begin(), matrices.end(), [](const MatrixBlock& a, const MatrixBlock& b) { return a.offset < b.offset; });
  size_t p = 0, q = 0, covered = 0;
  for (const MatrixBlock& m : matrices) {
    const size_t n = (size_t)m.rows * m.cols;
    CHECK_MSG(m.offset >= covered && m.offset + n <= size, "PowerSGD blocks must be disjoint and inside the buffer");
    const int r = std::min({rank, m.rows, m.cols});
    if ((size_t)r * (m.rows + m.cols) >= n) continue;  // no saving: sent exactly
    if (m.offset > covered) exact_.push_back({covered, m.offset});
    covered = m.offset + n;
    compressed_.push_back(m);
    p_at_.push_back(p), q_at_.push_back(q);
    p += (size_t)m.rows * r, q += (size_t)m.cols * r;
  }
  if (covered < size) exact_.push_back({covered, size});
  for (const auto& [b, e] : exact_) exact_count_ += e - b;
  p_.resize(p), q_.resize(q), exact_values_.resize(exact_count_);
  // The first Q: standard normal values, the same on every rank.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : q_) x = normal(rng);
}

void PowerSgd::reduce(float* buffer, float* error, Result result) {
  const int N = group_.size();
  const float out_scale = result == Result::kSum ? (float)N : 1.0f;
  // The exact part: one plain all-reduce, then the mean.
  size_t at = 0;
  for (const auto& [b, e] : exact_) {
    std::memcpy(exact_values_.data() + at, buffer + b, (e - b) * sizeof(float));
    at += e - b;
  }
  if (exact_count_ > 0) group_.all_reduce(exact_values_.data(), exact_count_);
  // M = gradient + error, then P = M Q with the last step's Q orthonormalised.
  for (size_t i = 0; i < compressed_.size(); i++) {
    const MatrixBlock& m = compressed_[i];
    const int r = std::min({rank_, m.rows, m.cols});
    float* M = buffer + m.offset;
    const float* e = error + m.offset;
    const size_t n = (size_t)m.rows * m.cols;
    for (size_t k = 0; k < n; k++) M[k] += e[k];
    orthonormalize_columns(q_.data() + q_at_[i], m.cols, r);
    kernels::gemm(false, false, m.rows, r, m.cols, 1.f, M, m.cols, q_.data() + q_at_[i], r, 0.f, p_.data() + p_at_[i], r);
  }
  if (!p_.empty()) group_.all_reduce(p_.data(), p_.size());
  // Q = Mᵀ P with P orthonormalised, averaged over the group.
  for (size_t i = 0; i < compressed_.size(); i++) {
    const MatrixBlock& m = compressed_[i];
    const int r = std::min({rank_, m.rows, m.cols});
    orthonormalize_columns(p_.data() + p_at_[i], m.rows, r);
    kernels::gemm(true, false, m.cols, r, m.rows, 1.f, buffer + m.offset, m.cols, p_.data() + p_at_[i], r, 0.f,
                  q_.data() + q_at_[i], r);
  }
  if (!q_.empty()) group_.all_reduce(q_.data(), q_.size());
  const float inv = 1.0f / (float)N;
  for (float& x : q_) x *= inv;
  // M' = P Qᵀ, the mean at rank r; the error keeps what it leaves out of this rank's M.
  for (size_t i = 0; i < compressed_.size(); i++) {
    const MatrixBlock& m = compressed_[i];
    const int r = std::min({rank_, m.rows, m.cols});
    const size_t n = (size_t)m.rows * m.cols;
    approx_.resize(std::max(approx_.size(), n));
    kernels::gemm(false, true, m.rows, m.cols, r, 1.f, p_.data() + p_at_[i], r, q_.data() + q_at_[i], r, 0.f,
                  approx_.data(), m.cols);
    float* M = buffer + m.offset;
    float* e = error + m.offset;
    for (size_t k = 0; k < n; k++) e[k] = M[k] - approx_[k], M[k] = out_scale * approx_[k];
  }
  at = 0;
  const float exact_scale = result == Result::kSum ? 1.0f : inv;
  for (const auto& [b, e] : exact_) {
    for (size_t k = b; k < e; k++) buffer[k] = exact_values_[at + k - b] * exact_scale;
    at += e - b;
  }
}

int64_t PowerSgd::wire_bytes() const {
  const int N = group_.size();
  auto all_reduce = [&](size_t n) { return n == 0 ? 0 : comm::comm_bytes(comm::CommOp::kAllReduce, n, N, sizeof(float)); };
  return all_reduce(p_.size()) + all_reduce(q_.size()) + all_reduce(exact_count_);
}

}  // namespace meshtrain::compress
