#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace meshtrain::optim {

float learning_rate(const AdamWConfig& c, int step, int total_steps) {
  if (step < c.warmup_steps) return c.lr * (float)(step + 1) / (float)c.warmup_steps;
  double span = std::max(1, total_steps - c.warmup_steps);
  double progress = (double)(step - c.warmup_steps) / span;
  return (float)(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

float learning_rate_by_tokens(const AdamWConfig& c, double before, double now, double warmup, double total) {
  if (before < warmup) return (float)(c.lr * std::min(1.0, (before + now) / warmup));
  const double span = std::max(now, total - warmup);
  const double progress = std::min(1.0, (before - warmup) / span);
  return (float)(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

double grad_norm(const float* grads, size_t n) { return std::sqrt(sum_of_squares(grads, n)); }

namespace {

// Sum of squares over [0, n) in 64 fixed chunks, each in double, added in chunk order: the
// same result for any thread count (bitwise-exact resume relies on it). Within a chunk,
// element i goes to lane i % 8 and the lanes are added in order: one vector of doubles,
// not a chain of dependent additions. `values(b, e, out)` writes elements [b, e) as
// floats (at most 1024 at a time).
template <typename Values>
double fixed_order_sum_of_squares(size_t n, Values values) {
  constexpr size_t kChunks = 64, kBlock = 1024, kLanes = 8;
  double partial[kChunks] = {};
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static) if (n >= 64 * kBlock)
  for (size_t c = 0; c < kChunks; c++) {
    double lane[kLanes] = {};
    float block[kBlock];
    const size_t end = std::min(n, (c + 1) * chunk);
    for (size_t b = c * chunk; b < end; b += kBlock) {
      const size_t e = std::min(end, b + kBlock);
      const float* x = values(b, e, block);
      size_t i = 0;
      for (; i + kLanes <= e - b; i += kLanes)
        for (size_t j = 0; j < kLanes; j++) lane[j] += (double)x[i + j] * x[i + j];
      for (size_t j = 0; i < e - b; i++, j++) lane[j] += (double)x[i] * x[i];
    }
    for (double v : lane) partial[c] += v;
  }
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

double sum_of_squares(const float* grads, size_t n) {
  return fixed_order_sum_of_squares(n, [&](size_t b, size_t, float*) { return grads + b; });
}

double sum_of_squares(kernels::Precision p, const uint16_t* grads, size_t n) {
  return fixed_order_sum_of_squares(n, [&](size_t b, size_t e, float* block) {
    kernels::from_half(p, grads + b, block, e - b);
    return (const float*)block;
  });
}

SumOfSquaresStream::SumOfSquaresStream(size_t n) : n_(n), chunk_((n + kChunks - 1) / kChunks) {}

void SumOfSquaresStream::add(const float* x, size_t count) {
  CHECK(seen_ + count <= n_);
  while (count > 0) {
    // Within fixed_order_sum_of_squares' chunk c, element i goes to lane (i - c * chunk) % 8
    // (its 1024-element blocks start at multiples of 8), lanes fold into partial[c] in order.
    const size_t c = seen_ / chunk_, start = c * chunk_, end = std::min(n_, start + chunk_);
    const size_t m = std::min(count, end - seen_), lane0 = (seen_ - start) % kLanes;
    size_t k = 0;
    for (; k < m && (lane0 + k) % kLanes != 0; k++) lane_[(lane0 + k) % kLanes] += (double)x[k] * x[k];
    for (; k + kLanes <= m; k += kLanes)  // whole vectors from lane 0, as the one-shot sum does
      for (size_t j = 0; j < kLanes; j++) lane_[j] += (double)x[k + j] * x[k + j];
    for (; k < m; k++) lane_[(lane0 + k) % kLanes] += (double)x[k] * x[k];
    x += m, count -= m, seen_ += m;
    if (seen_ == end) {
      for (double& v : lane_) partial_[c] += v, v = 0;
    }
  }
}

double SumOfSquaresStream::total() const {
  CHECK(seen_ == n_);
  double sum = 0;
  for (double p : partial_) sum += p;
  return sum;
}

float clip_coefficient(double norm, float max_norm, double loss_scale) {
  float clip = max_norm > 0 ? (float)(max_norm / (norm / loss_scale + 1e-6)) : 1.0f;
  if (clip >= 1.0f) clip = 1.0f;
  return (float)(clip / loss_scale);
}

float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale) {
  const float coef = clip_coefficient(norm, max_norm, loss_scale);
  if (coef == 1.0f) return 1.0f;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) grads[i] *= coef;
  return coef;
}

std::vector<AdamSegment> full_segments(const model::ParamLayout& layout) {
  std::vector<AdamSegment> out;
  for (const auto& t : layout.tensors())
    out.push_back({t.offset, t.offset, t.offset, t.numel, t.decay,
                   t.tp_copy, layout.unit_of(t)});
  return out;
}

void init_master(ShardStore& store, const std::vector<AdamSegment>& segments, const float* params) {
  CHECK_MSG(store.has(kMasterWeights) && !store.in_file(kMasterWeights), "init_master: no in-memory master weights");
  for (const AdamSegment& s : segments)
    std::copy(params + s.param_offset, params + s.param_offset + s.count,
              store.data(kMasterWeights) + s.state_offset);
}

void params_from_master(ShardStore& store, const std::vector<AdamSegment>& segments, kernels::Precision p,
                        uint16_t* params) {
  CHECK(store.has(kMasterWeights));
  if (!params) {  // the store's shard, streamed where it is in a file
    CHECK(store.has(kShardParams) && store.width(kShardParams) == kWord);
    store.for_each_run(segments, bit(kMasterWeights) | bit(kShardParams), bit(kShardParams),
                       [&](const AdamSegment&, size_t from, size_t to, const ChunkPointers& st) {
                         kernels::to_half(p, st.f(kMasterWeights), st.h(kShardParams), to - from);
                       });
    return;
  }
  store.for_each_run(segments, bit(kMasterWeights), 0, [&](const AdamSegment& s, size_t from, size_t to, const ChunkPointers& st) {
    kernels::to_half(p, st.f(kMasterWeights), params + s.param_offset + from, to - from);
  });
}

AdamW::AdamW(const AdamWConfig& config, float lr, int t, const Rule& rule)
    : rule_(rule), c_(coefficients(config, lr, t)) {}

AdamW::Coefficients AdamW::coefficients(const AdamWConfig& config, float lr, int t) {
  const float b1 = config.beta1, b2 = config.beta2;
  // Same operation order as torch's single-tensor AdamW.
  const float bias1 = 1.0f - std::pow(b1, (float)t);
  const float bias2 = 1.0f - std::pow(b2, (float)t);
  return {b1, b2, config.eps, lr / bias1, std::sqrt(bias2), 1.0f - lr * config.weight_decay};
}

namespace {

// The update op's scalars for a run whose tensors decay by `decay` (1: no weight decay).
kernels::AdamWScalars scalars(const AdamW::Coefficients& c, float decay) {
  return {c.b1, c.b2, c.eps, c.step_size, c.bias2_sqrt, decay};
}

}  // namespace

void AdamW::update(const AdamRun& run) const {
  const Coefficients& c = c_;
  const float decay = run.decay ? c.decay : 1.0f, grad_coef = rule_.grad_coef;
  if (rule_.preconditioned) {
    kernels::adamw_preconditioned_update(static_cast<float*>(run.params), run.m, run.count, decay, c.step_size);
    return;
  }
  if (rule_.format != kernels::Precision::kFp32) {
    kernels::adamw_update_half(rule_.format, static_cast<const uint16_t*>(run.grads), grad_coef, run.master, run.m,
                               run.v, static_cast<uint16_t*>(run.params), run.count, scalars(c, decay));
    return;
  }
  float* g = static_cast<float*>(run.grads);
  if (grad_coef != 1.0f) kernels::scale_inplace(g, run.count, grad_coef);  // clip_grads' multiplication
  kernels::adamw_update(static_cast<float*>(run.params), g, run.m, run.v, run.count, scalars(c, decay));
}

}  // namespace meshtrain::optim
