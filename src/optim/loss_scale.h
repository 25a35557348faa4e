// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision
// Training"; the policy of PyTorch's GradScaler and Megatron-LM): the loss is multiplied by
// a scale S before backward so that small gradients survive fp16's narrow exponent range;
// gradients are divided by S before the update. A step whose gradients overflowed (inf or
// NaN anywhere, on any rank) is skipped and S is multiplied by `backoff`; after
// `growth_interval` good steps in a row S is multiplied by `growth`.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace meshtrain::optim {

struct LossScaleConfig {
  double initial = 65536.0;  // 2^16
  double growth = 2.0;
  double backoff = 0.5;
  int growth_interval = 1000;
  double min_scale = 1.0;     // the floor
  // Overflowing steps in a row at the floor after which training is stopped: a scale stuck
  // at its floor means every step is skipped and the model no longer trains.
  int max_skips_at_floor = 10;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScaleConfig& config);
  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  // Records one step's verdict and adjusts the scale. Returns an error (naming the scale
  // and the count) when the scale has been stuck at its floor for max_skips_at_floor steps.
  Status update(bool overflow);

  // For checkpoints: the whole state.
  struct State {
    double scale;
    int64_t good_in_row, skipped, floor_skips_in_row;
  };
  State state() const { return {scale_, good_in_row_, skipped_, floor_skips_in_row_}; }
  void restore(const State& s);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t good_in_row_ = 0, skipped_ = 0, floor_skips_in_row_ = 0;
};

}  // namespace meshtrain::optim
