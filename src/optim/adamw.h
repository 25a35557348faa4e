// AdamW with torch.optim.AdamW semantics over a flat parameter buffer, the learning-rate
// schedule, and global gradient-norm clipping (torch clip_grad_norm_ semantics).
#pragma once
#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "model/param_layout.h"

namespace meshtrain::optim {

struct AdamWConfig {
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int warmup_steps = 0;
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // <= 0 disables clipping
};

// lr * (s+1)/W during warmup, then cosine from lr down to min_lr at step N.
float learning_rate(const AdamWConfig& c, int step, int total_steps);

// L2 norm of the whole gradient, accumulated in double in a fixed order (the same result
// for any thread count, which bitwise-exact resume relies on).
double grad_norm(const float* grads, size_t n);
// Scales grads by max/(norm + 1e-6) when norm > max; returns the scale applied (1 if none).
float clip_grads(float* grads, size_t n, double norm, float max_norm);

class AdamW {
 public:
  // Moments cover [0, n) of the layout's flat buffer; decay follows each tensor's flag.
  AdamW(const AdamWConfig& config, const model::ParamLayout& layout);
  // One update with step number t (1-based, for bias correction) at learning rate lr.
  void step(float* params, const float* grads, float lr, int t);

  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  size_t size() const { return m_.size(); }

 private:
  struct Range {
    size_t begin, end;
    bool decay;
  };
  AdamWConfig config_;
  std::vector<Range> ranges_;
  Buffer<float> m_, v_;
};

}  // namespace meshtrain::optim
