#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::optim {

float learning_rate(const AdamWConfig& c, int step, int total_steps) {
  if (step < c.warmup_steps) return c.lr * (float)(step + 1) / (float)c.warmup_steps;
  double span = std::max(1, total_steps - c.warmup_steps);
  double progress = (double)(step - c.warmup_steps) / span;
  return (float)(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

double grad_norm(const float* grads, size_t n) {
  constexpr size_t kChunks = 64;
  double partial[kChunks] = {};
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < kChunks; c++) {
    double s = 0;
    for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) s += (double)grads[i] * grads[i];
    partial[c] = s;
  }
  double sum = 0;
  for (double p : partial) sum += p;
  return std::sqrt(sum);
}

float clip_grads(float* grads, size_t n, double norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  float coef = (float)(max_norm / (norm + 1e-6));
  if (coef >= 1.0f) return 1.0f;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) grads[i] *= coef;
  return coef;
}

AdamW::AdamW(const AdamWConfig& config, const model::ParamLayout& layout)
    : config_(config),
      m_(MemCategory::kOptim, layout.total()),
      v_(MemCategory::kOptim, layout.total()) {
  for (const auto& t : layout.tensors()) ranges_.push_back({t.offset, t.offset + t.numel, t.decay});
}

void AdamW::step(float* params, const float* grads, float lr, int t) {
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  // Same operation order as torch's single-tensor AdamW.
  const float bias1 = 1.0f - std::pow(b1, (float)t);
  const float bias2 = 1.0f - std::pow(b2, (float)t);
  const float step_size = lr / bias1;
  const float bias2_sqrt = std::sqrt(bias2);
  float* m = m_.data();
  float* v = v_.data();
  for (const Range& r : ranges_) {
    const float decay = r.decay ? 1.0f - lr * config_.weight_decay : 1.0f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = r.begin; i < r.end; i++) {
      float g = grads[i];
      float p = params[i] * decay;
      m[i] = m[i] + (g - m[i]) * (1.0f - b1);
      v[i] = v[i] * b2 + (1.0f - b2) * g * g;
      float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      params[i] = p - step_size * m[i] / denom;
    }
  }
}

}  // namespace meshtrain::optim
