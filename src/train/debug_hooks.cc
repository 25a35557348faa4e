#include "train/debug_hooks.h"

#include <chrono>
#include <thread>

namespace meshtrain::train {

namespace {

class DebugHooks : public StepHooks {
 public:
  DebugHooks(int64_t stall_step, int64_t nonfinite_step, int nonfinite_unit)
      : stall_step_(stall_step), nonfinite_step_(nonfinite_step), nonfinite_unit_(nonfinite_unit) {}

  void before_step(int64_t k) override {
    // After the step is announced (the heartbeat names it), before its first collective:
    // the other ranks wait for this one until the watchdog fires.
    if (k + 1 == stall_step_)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  void before_update(int64_t k, parallel::DataParallel& dp) override {
    if (k + 1 == nonfinite_step_) dp.poison_gradient(nonfinite_unit_);
  }

 private:
  int64_t stall_step_, nonfinite_step_;
  int nonfinite_unit_;
};

}  // namespace

std::unique_ptr<StepHooks> debug_hooks(const TrainOptions& o, int rank, bool scaled) {
  const int64_t stall = rank == o.debug_stall_rank ? o.debug_stall_step : -1;
  const int64_t nonfinite = scaled ? 0 : o.debug_nonfinite_step;
  if (stall <= 0 && nonfinite <= 0) return nullptr;
  return std::make_unique<DebugHooks>(stall, nonfinite, o.debug_nonfinite_unit);
}

}  // namespace meshtrain::train
