// The testing aids among TrainOptions (--debug-stall-rank/--debug-stall-step, which hang
// one rank for the watchdog's tests, and --debug-nonfinite-step/--debug-nonfinite-unit,
// which put a NaN into one unit's gradient), as StepHooks (trainer.h): the loop and the
// step carry no test code.
#pragma once
#include <memory>

#include "train/options.h"
#include "train/trainer.h"

namespace meshtrain::train {

// The hooks `o` asks for on world rank `rank`, or nullptr when it asks for none. The NaN is
// put in only without a loss scaler (`scaled`: fp16 finds its overflows itself).
std::unique_ptr<StepHooks> debug_hooks(const TrainOptions& o, int rank, bool scaled);

}  // namespace meshtrain::train
