// `train --plan auto`: the layout the planner predicts fastest for this job's ranks on this
// machine (planner/local.h: the engine's own memory accounting and a time model calibrated
// here), among those that fit the memory budget.
#pragma once
#include <string>

#include "comm/group.h"
#include "core/status.h"
#include "planner/search.h"
#include "train/console.h"
#include "train/options.h"

namespace meshtrain::train {

// Searches the layouts of `ranks` ranks within `fixed` (the layout flags the user gave),
// for the global batch (--global-batch, else --micro-batch x --grad-accum x ranks rows) and
// the budget (--memory-budget GB, else the machine's memory shared by the ranks), and
// writes the fastest that fits into `o`: tp, pp, dp, zero, micro-batch, gradient
// accumulation, schedule, virtual stages, sp and recomputation. `summary` describes it.
// Errors: no layout fits (with the closest one and by how much), none is valid, or the
// run is bf16/fp16 (the local model covers fp32 runs only).
Status choose_layout(TrainOptions* o, int ranks, const planner::SearchSpace& fixed, std::string* summary);

// choose_layout() on every rank of `world` (the prediction is a pure function of the flags
// and the cached GEMM peak, so every rank chooses alike; this checks that they did), then
// rank 0 writes the summary to `console` (unless --quiet).
Status choose_layout_on_every_rank(TrainOptions* o, comm::Group& world, const planner::SearchSpace& fixed,
                                   const Console& console);

}  // namespace meshtrain::train
