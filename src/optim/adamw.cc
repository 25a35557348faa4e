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

double grad_norm(const float* grads, size_t n) { return std::sqrt(sum_of_squares(grads, n)); }

double sum_of_squares(const float* grads, size_t n) {
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
  return sum;
}

float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale) {
  float clip = max_norm > 0 ? (float)(max_norm / (norm / loss_scale + 1e-6)) : 1.0f;
  if (clip >= 1.0f) clip = 1.0f;
  const float coef = (float)(clip / loss_scale);
  if (coef == 1.0f) return 1.0f;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) grads[i] *= coef;
  return coef;
}

std::vector<AdamSegment> full_segments(const model::ParamLayout& layout) {
  std::vector<AdamSegment> out;
  for (const auto& t : layout.tensors())
    out.push_back({t.offset, t.offset, t.offset, t.numel, t.decay,
                   t.split == model::TpSplit::kReplicated, layout.unit_of(t)});
  return out;
}

AdamW::AdamW(const AdamWConfig& config, const model::ParamLayout& layout)
    : AdamW(config, full_segments(layout), layout.total()) {}

AdamW::AdamW(const AdamWConfig& config, std::vector<AdamSegment> segments, size_t state_size)
    : config_(config),
      segments_(std::move(segments)),
      size_(state_size),
      m_(MemCategory::kOptim, state_size),
      v_(MemCategory::kOptim, state_size) {}

void AdamW::step(float* params, const float* grads, float lr, int t) {
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  // Same operation order as torch's single-tensor AdamW.
  const float bias1 = 1.0f - std::pow(b1, (float)t);
  const float bias2 = 1.0f - std::pow(b2, (float)t);
  const float step_size = lr / bias1;
  const float bias2_sqrt = std::sqrt(bias2);
  // Updates the segment's elements [from, to) (offsets into the segment); m and v point at
  // the moments of element `from`.
  auto update = [&](const AdamSegment& s, size_t from, size_t to, float* m, float* v) {
    const float decay = s.decay ? 1.0f - lr * config_.weight_decay : 1.0f;
    float* p = params + s.param_offset + from;
    const float* g = grads + s.grad_offset + from;
    const size_t n = to - from;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
      float pi = p[i] * decay;
      m[i] = m[i] + (g[i] - m[i]) * (1.0f - b1);
      v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
      float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      p[i] = pi - step_size * m[i] / denom;
    }
  };
  if (!offloaded_) {
    for (const AdamSegment& s : segments_)
      update(s, 0, s.count, m_.data() + s.state_offset, v_.data() + s.state_offset);
    return;
  }
  // Chunk by chunk of the state: the segments' parts that fall into it.
  offloaded_->for_each_chunk([&](size_t begin, size_t end, float* m, float* v) {
    for (const AdamSegment& s : segments_) {
      const size_t a = std::max(begin, s.state_offset), b = std::min(end, s.state_offset + s.count);
      if (a < b) update(s, a - s.state_offset, b - s.state_offset, m + (a - begin), v + (a - begin));
    }
  });
}

Status AdamW::offload(const std::string& dir, int rank, size_t chunk) {
  RETURN_IF_ERROR(OffloadedMoments::create(dir, rank, size_, chunk, &offloaded_));
  m_.release();
  v_.release();
  return Status::ok();
}

void AdamW::read_moments(int kind, float* dst) {
  if (offloaded_) return offloaded_->read(kind, dst);
  const Buffer<float>& src = kind == 0 ? m_ : v_;
  std::copy(src.data(), src.data() + size_, dst);
}

void AdamW::write_moments(int kind, const float* src) {
  if (offloaded_) return offloaded_->write(kind, src);
  std::copy(src, src + size_, (kind == 0 ? m_ : v_).data());
}

}  // namespace meshtrain::optim
