#include "optim/loss_scale.h"

#include <algorithm>
#include <cstdio>

namespace meshtrain::optim {

DynamicLossScaler::DynamicLossScaler(const LossScaleConfig& config)
    : config_(config), scale_(config.initial) {}

Status DynamicLossScaler::update(bool overflow) {
  if (!overflow) {
    floor_skips_in_row_ = 0;
    if (++good_in_row_ >= config_.growth_interval) {
      scale_ *= config_.growth;
      good_in_row_ = 0;
    }
    return Status::ok();
  }
  skipped_++;
  good_in_row_ = 0;
  const bool at_floor = scale_ <= config_.min_scale;
  scale_ = std::max(config_.min_scale, scale_ * config_.backoff);
  floor_skips_in_row_ = at_floor ? floor_skips_in_row_ + 1 : 0;
  if (floor_skips_in_row_ >= config_.max_skips_at_floor) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "fp16 loss scale stuck at its floor %g: the last %lld steps all overflowed and "
                  "were skipped (%lld skipped in all), so the model is no longer training; lower "
                  "--lr, use --precision bf16, or lower --loss-scale-min",
                  config_.min_scale, (long long)floor_skips_in_row_, (long long)skipped_);
    return Status::error(buf);
  }
  return Status::ok();
}

void DynamicLossScaler::restore(const State& s) {
  scale_ = s.scale;
  good_in_row_ = s.good_in_row;
  skipped_ = s.skipped;
  floor_skips_in_row_ = s.floor_skips_in_row;
}

}  // namespace meshtrain::optim
