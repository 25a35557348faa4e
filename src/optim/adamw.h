// AdamW's update with torch.optim.AdamW semantics over the runs of elements a ShardStore
// hands it, the learning-rate schedule, and global gradient-norm clipping (torch
// clip_grad_norm_ semantics).
#pragma once
#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "kernels/ops.h"
#include "model/param_layout.h"
#include "optim/shard_store.h"

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
// The same schedule over tokens (Megatron's --lr-warmup-tokens/--lr-decay-tokens, which
// DeepSpeed's curriculum tutorial advises with a sequence-length curriculum): `before`
// tokens trained before this step, `now` in it; warmup over `warmup` tokens, the cosine
// ending at `total`. With every step the same length it equals learning_rate up to rounding.
float learning_rate_by_tokens(const AdamWConfig& c, double before, double now, double warmup, double total);

// L2 norm of the whole gradient, accumulated in double in a fixed order (the same result
// for any thread count, which bitwise-exact resume relies on).
double grad_norm(const float* grads, size_t n);
double sum_of_squares(const float* x, size_t n);  // the same fixed-order sum
double sum_of_squares(kernels::Precision p, const uint16_t* x, size_t n);  // 16-bit values

// sum_of_squares of n values that arrive in order, in pieces of any size: the same double,
// bit for bit (its 64 chunks and 8 lanes, kept between pieces). For gradients written to a
// file piece by piece, so that the norm needs no second read.
class SumOfSquaresStream {
 public:
  explicit SumOfSquaresStream(size_t n);
  void add(const float* x, size_t count);
  double total() const;  // once all n values arrived

 private:
  static constexpr size_t kChunks = 64, kLanes = 8;
  size_t n_, chunk_, seen_ = 0;
  double lane_[kLanes] = {}, partial_[kChunks] = {};
};
// The factor clip_grads multiplies the gradients by: min(1, max/(norm/S + 1e-6)) / S.
float clip_coefficient(double norm, float max_norm, double loss_scale = 1.0);
// Scales grads by max/(norm + 1e-6) when norm > max; returns the scale applied (1 if none).
// With a loss scale S the gradients hold S times their value and `norm` is theirs: they
// are divided by S and clipped on norm/S in the same pass.
float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale = 1.0);

// One segment per tensor, all offsets the tensor's offset in the flat layout.
std::vector<AdamSegment> full_segments(const model::ParamLayout& layout);

// --- mixed precision: fp32 master weights (the store's kMasterWeights) beside 16-bit
// parameters, addressed by the segments ---
// Sets the master weights (in memory) from fp32 parameters at the segments' param offsets.
void init_master(ShardStore& store, const std::vector<AdamSegment>& segments, const float* params);
// params = the master weights rounded to format p (after a checkpoint load); null: the
// store's own 16-bit parameter shard (ZeRO-3), wherever it lives.
void params_from_master(ShardStore& store, const std::vector<AdamSegment>& segments, kernels::Precision p,
                        uint16_t* params);

// One run of a segment's elements as a store hands it to the update (ShardStore::
// for_each_run), each pointer at the run's first element: parameters and gradients in the
// step's format (fp32 values or 16-bit words), the state in fp32.
struct AdamRun {
  size_t count = 0;
  bool decay = false;
  void* params = nullptr;
  void* grads = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* master = nullptr;  // 16-bit formats only
};

// The optimizer step of one training step (step number t, 1-based for bias correction, at
// learning rate lr): torch.optim.AdamW's update of every run handed to it. It holds no
// state: the moments and master weights are a ShardStore's arrays, wherever they live.
class AdamW {
 public:
  // How every run of the step is updated.
  struct Rule {
    // kFp32: fp32 parameters and gradients. kBf16 / kFp16: 16-bit words; the update runs on
    // the fp32 master weights, from the widened gradients, and rounds them into the words
    // (ZeRO's mixed-precision Adam). Element by element the arithmetic is the fp32 one.
    kernels::Precision format = kernels::Precision::kFp32;
    // The gradients are multiplied by it first (clipping and 1/loss scale; 1: unchanged);
    // fp32 gradients in place.
    float grad_coef = 1.0f;
    // 1-bit Adam's compressed phase (Tang et al. 2021; parallel/dp/onebit_adam.h): m holds
    // this step's momentum already divided by the frozen denominator (u = m / d, averaged
    // over the ranks by the caller); v and the gradients are not read. The update is the
    // fp32 one otherwise: p = p (1 - lr wd) - lr / (1 - β1^t) u.
    bool preconditioned = false;
  };
  AdamW(const AdamWConfig& config, float lr, int t, const Rule& rule);
  void update(const AdamRun& run) const;

  // The step's constants (torch's order of operations): what kernels::adamw_update takes,
  // with `decay` the factor of the tensors that take weight decay.
  struct Coefficients {
    float b1, b2, eps, step_size, bias2_sqrt, decay;
  };

 private:
  static Coefficients coefficients(const AdamWConfig& config, float lr, int t);

  Rule rule_;
  Coefficients c_;
};

}  // namespace meshtrain::optim
