// AdamW with torch.optim.AdamW semantics over a flat parameter buffer, the learning-rate
// schedule, and global gradient-norm clipping (torch clip_grad_norm_ semantics).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/param_layout.h"
#include "optim/offload.h"

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
double sum_of_squares(const float* x, size_t n);  // the same fixed-order sum
// Scales grads by max/(norm + 1e-6) when norm > max; returns the scale applied (1 if none).
// With a loss scale S the gradients hold S times their value and `norm` is theirs: they
// are divided by S and clipped on norm/S in the same pass.
float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale = 1.0);

// A run of elements updated alike: param/grad/moment offsets into their own buffers (a
// ZeRO shard keeps moments locally while parameters may live in a full buffer).
struct AdamSegment {
  size_t param_offset = 0, grad_offset = 0, state_offset = 0, count = 0;
  bool decay = false;
  bool tp_replicated = false;  // every tensor-parallel rank holds these elements
  int unit = -1;               // the layout unit the elements belong to
};

// One segment per tensor, all offsets the tensor's offset in the flat layout.
std::vector<AdamSegment> full_segments(const model::ParamLayout& layout);

class AdamW {
 public:
  // Moments for every parameter of the layout (single rank, data parallel).
  AdamW(const AdamWConfig& config, const model::ParamLayout& layout);
  // Moments of `state_size` elements for the given segments (a ZeRO shard).
  AdamW(const AdamWConfig& config, std::vector<AdamSegment> segments, size_t state_size);
  // One update with step number t (1-based, for bias correction) at learning rate lr.
  void step(float* params, const float* grads, float lr, int t);

  // Moves the moments (zero so far) into a file under `dir`, streamed `chunk` elements at a
  // time by every step (optim/offload.h); the in-memory moments are freed. The update
  // arithmetic is the same element by element, so losses are bit-identical.
  Status offload(const std::string& dir, int rank, size_t chunk);
  const OffloadedMoments* offloaded() const { return offloaded_.get(); }
  OffloadedMoments* offloaded() { return offloaded_.get(); }

  // The moments in memory (null when offloaded: use read_moments / write_moments).
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  // Whole-state copies wherever the moments live (kind 0: m, 1: v), for checkpoints.
  void read_moments(int kind, float* dst);
  void write_moments(int kind, const float* src);
  size_t size() const { return size_; }
  const std::vector<AdamSegment>& segments() const { return segments_; }

 private:
  AdamWConfig config_;
  std::vector<AdamSegment> segments_;
  size_t size_;
  Buffer<float> m_, v_;
  std::unique_ptr<OffloadedMoments> offloaded_;
};

}  // namespace meshtrain::optim
