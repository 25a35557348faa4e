// `meshtrain bench`: the machine's GEMM peak and end-to-end training-step throughput.
#pragma once
#include "core/status.h"
#include "train/options.h"

namespace meshtrain::train {

// Times `steps` training steps (after `warmup` untimed ones) on random tokens and prints
// tokens/s and MFU next to the measured GEMM peak.
Status bench_step(const TrainOptions& options, int warmup, int steps);

}  // namespace meshtrain::train
