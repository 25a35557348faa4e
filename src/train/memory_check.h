// The up-front memory check of `train`: before any large allocation, each rank compares
// the planner's replay of its peak (planner/local.h, the engine's tracker to the byte) with
// the memory it may use (machine/memory_limit.h), and refuses a run
// that cannot fit with both figures and the changes that would make it fit. prepare()
// runs it on every rank under agree(), so every rank stops alike before any work.
#pragma once
#include "core/status.h"
#include "train/options.h"
#include "train/run.h"

namespace meshtrain::train {

// OK when this rank's predicted peak fits, or when the local planner does not model the
// run (zero-bubble schedules, expert parallelism: see predict_local); then a failed
// allocation still names itself (core/memory.h). 16-bit storage is checked against a
// lower bound from the fp32 replay. With --offload or
// --memory-budget the state that can go to files is left out of the figure (a lower
// bound). --memory-budget itself is not the limit: it decides what goes to files, and
// place_state() checks it once the state is placed.
// `run` must hold what prepare_local() resolves: config, shape, layout, schedule, threads.
Status check_memory_fits(const TrainOptions& o, const Run& run, int world_rank);

}  // namespace meshtrain::train
