// A simulated schedule (pp::simulate) as trace events (trace/trace.h's format), so that
// trace::analyze and the timeline plot read the theory and a real run alike.
#pragma once
#include <nlohmann/json.hpp>

#include "parallel/pp/schedule.h"

namespace meshtrain::parallel::pp {

// Rank r's forwards and backwards on its compute lane, tagged with `step`, one simulator
// time unit = 1 ms.
nlohmann::json simulated_trace(const SimResult& sim, int step = 0);

}  // namespace meshtrain::parallel::pp
