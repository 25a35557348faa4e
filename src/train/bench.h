// `meshtrain bench`: the machine's GEMM peak and end-to-end training-step throughput.
#pragma once
#include "core/status.h"
#include "train/console.h"
#include "train/options.h"

namespace meshtrain::train {

// Times `steps` training steps (after `warmup` untimed ones) on random tokens and writes
// tokens/s and MFU next to the measured GEMM peak to `console`. `profile`: also the step
// profile of the timed steps (train/step_profile.h), beside the triad bandwidth measured
// in the same run.
Status bench_step(const TrainOptions& options, int warmup, int steps, const Console& console, bool profile = false);

}  // namespace meshtrain::train
