#include "parallel/dp/onebit_adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "trace/trace.h"

namespace meshtrain::parallel {

float OneBitAdam::update_bound(float beta1, float beta2) {
  const float root = std::sqrt(beta2);
  if (!(beta1 < root)) return std::numeric_limits<float>::infinity();
  return (1.0f - beta1) / std::sqrt(1.0f - beta2) / (1.0f - beta1 / root);
}

OneBitAdam::OneBitAdam(comm::Group& group, const model::ParamLayout& layout, float beta1, size_t scale_block,
                       float bound)
    : group_(group),
      perm_(layout, group.size(), group.rank()),
      chunk_(perm_.local_total()),
      beta1_(beta1),
      bound_(bound),
      worker_error_(MemCategory::kOptim, chunk_ * group.size()),
      server_error_(MemCategory::kOptim, chunk_),
      allreduce_(group, chunk_, scale_block) {
  std::memset(worker_error_.data(), 0, worker_error_.bytes());
  std::memset(server_error_.data(), 0, server_error_.bytes());
}

template <typename F>
void OneBitAdam::for_each_piece(F f) const {
  const int N = group_.size();
  for (int j = 0; j < N; j++)
    for (const UnitShard& u : perm_.units()) {
      const size_t begin = std::min(u.numel, (size_t)j * u.shard), end = std::min(u.numel, (size_t)(j + 1) * u.shard);
      if (end > begin) f(u.global_offset + begin, end - begin, (size_t)j * chunk_ + u.local_offset);
    }
}

void OneBitAdam::apply_mask(float* x) const {
  const uint8_t* live = live_.data();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < live_.size(); i++) x[i] = live[i] ? x[i] : 0.0f;
}

void OneBitAdam::start_from(const float* m, const float* v, bool full, float bias2_sqrt, float eps, bool m_is_u) {
  const int N = group_.size();
  const size_t n = chunk_ * N;
  start_.allocate(MemCategory::kComm, n);
  inv_den_.allocate(MemCategory::kOptim, n);
  live_.allocate(MemCategory::kOptim, n);
  std::memset(start_.data(), 0, start_.bytes());
  std::memset(inv_den_.data(), 0, inv_den_.bytes());
  // Adam's denominator at the freeze, as AdamW's update computes it (padding and masked: 0).
  auto inverse = [&](float vi) { return vi > 0 ? 1.0f / (std::sqrt(vi) / bias2_sqrt + eps) : 0.0f; };
  if (full) {
    for_each_piece([&](size_t global, size_t count, size_t at) {
      std::memcpy(start_.data() + at, m + global, count * sizeof(float));
      for (size_t i = 0; i < count; i++) inv_den_[at + i] = inverse(v[global + i]);
    });
  } else {
    Buffer<float> mine(MemCategory::kComm, chunk_);
    for (size_t i = 0; i < chunk_; i++) mine[i] = inverse(v[i]);  // the shard's padding has v = 0
    group_.all_gather(mine.data(), inv_den_.data(), chunk_);
    group_.all_gather(m, start_.data(), chunk_);
  }
  size_t live = 0;
  for (size_t i = 0; i < n; i++) live += (live_[i] = inv_den_[i] > 0);
  masked_ = n - live;
  if (!m_is_u)
    for (size_t i = 0; i < n; i++) start_[i] *= inv_den_[i];
  apply_mask(start_.data());
  started_ = true;
}

void OneBitAdam::exchange(const float* grads, float grad_scale, float* m, bool full) {
  CHECK_MSG(started_, "1-bit Adam: exchange before start_from");
  const int N = group_.size();
  // The last averaged u: start_from's, or the kept blocks decompressed (into the buffer the
  // steps reuse: a fresh 4 bytes per parameter each step cost more than the exchange).
  Buffer<float>& x = work_;
  if (!start_.empty()) {
    x = std::move(start_);
  } else {
    if (x.empty()) x.allocate(MemCategory::kComm, chunk_ * N);
    for (int j = 0; j < N; j++)
      compress::decompress_onebit_chunk(allreduce_.gathered(j), chunk_, allreduce_.scale_block(),
                                        x.data() + (size_t)j * chunk_);
    apply_mask(x.data());  // a sign's ±scale where the momentum is masked
  }
  // u_i = β1 u + (1 - β1) N g_i / d, within ±bound; masked and padding elements stay zero
  // (1/d is 0 there), adding nothing to a block's scale.
  const float b1 = beta1_, coef = (1.0f - beta1_) * (float)N * grad_scale, hi = bound_;
  float* w = x.data();
  const float* inv = inv_den_.data();
  for_each_piece([&](size_t global, size_t n, size_t at) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
      w[at + i] = std::clamp(w[at + i] * b1 + coef * grads[global + i] * inv[at + i], -hi, hi);
  });
  {
    trace::Tracer::Span span(trace::Lane::kComm, "onebit_adam", trace::category::kCollective);
    allreduce_.run(w, worker_error_.data(), server_error_.data(), w);
  }
  // A sign says ±scale where the momentum is masked: back to zero, errors included, so
  // the blocks decompress to what the optimizer's m holds.
  apply_mask(w);
  apply_mask(worker_error_.data());
  const uint8_t* live = live_.data() + (size_t)group_.rank() * chunk_;
  for (size_t i = 0; i < chunk_; i++) server_error_[i] = live[i] ? server_error_[i] : 0.0f;
  if (full)
    for_each_piece([&](size_t global, size_t n, size_t at) { std::memcpy(m + global, w + at, n * sizeof(float)); });
  else
    std::memcpy(m, w + (size_t)group_.rank() * chunk_, chunk_ * sizeof(float));
}

}  // namespace meshtrain::parallel
