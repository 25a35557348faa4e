// The step profile's report (`bench step --profile`, `train --profile`): each op's time per
// step and its share, its rate set against the machine's measured peaks (GEMM sites and
// attention against the GEMM peak, the rest's bytes against the triad bandwidth), as a
// table for the console and as one JSON record for metrics.jsonl.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/profile.h"

namespace meshtrain::train {

struct ProfilePeaks {
  double gemm_gflops = 0;  // the GEMM peak of the run's precision
  double triad_gbps = 0;   // measure_triad_gbps on the run's threads
};

// `p` recorded over `steps` steps of `step_s` seconds each (median or mean).
std::string profile_table(const profile::Profile& p, int steps, double step_s, const ProfilePeaks& peaks);
nlohmann::json profile_json(const profile::Profile& p, int steps, double step_s, const ProfilePeaks& peaks);

}  // namespace meshtrain::train
