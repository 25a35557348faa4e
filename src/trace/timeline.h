// One training step of a merged trace (trace.h's format), rank by rank: the spans to draw,
// each rank's busy and idle time, and the measured pipeline bubble. Pure functions of the
// events, so a simulated schedule and a real run are analysed by the same code.
//
// Measured bubble. The step window runs from the earliest start to the latest end of the
// step's forward and backward spans over all ranks. A rank's busy time is the sum of its
// forward and backward spans in the step (one rank's compute spans never overlap), and
//   bubble = 1 - (sum of busy over ranks) / (ranks x window),
// the idle time of the pipeline ranks inside the step divided by the step time. With equal
// stage costs it is (p-1)/(v*m+p-1) for GPipe, 1F1B and interleaved 1F1B.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "trace/trace.h"

namespace meshtrain::trace {

// A span placed on the step's time axis: milliseconds from the start of the drawn range.
struct Block {
  Lane lane = Lane::kCompute;
  std::string category;
  std::string name;
  double start_ms = 0, end_ms = 0;
  int microbatch = -1;  // args.mb, -1 without one
  int chunk = 0;        // args.chunk
};

struct RankTimeline {
  int rank = 0;
  std::vector<Block> compute;  // forward, backward, optimizer; by start time
  std::vector<Block> comm;     // collective, p2p (clipped to the drawn range); by start time
  double busy_ms = 0;          // forward + backward
  double idle_ms = 0;          // window - busy
  int pp_rank = -1;            // the rank's pipeline rank, when the trace says (train --trace)
};

struct Timeline {
  int step = 0;
  std::vector<int> steps;  // every step of the trace, ascending
  // The drawn range is [0, range_ms]: every span of the step (optimizer and step spans
  // included), which contains the window [window_start_ms, window_end_ms].
  double range_ms = 0;
  double window_start_ms = 0, window_end_ms = 0;
  int chunks = 1;                   // 1 + the largest args.chunk: v of an interleaved run
  std::vector<RankTimeline> ranks;  // every rank with forward/backward spans in the trace, by rank
  double bubble_fraction = 0;
  // The run's pipeline, when the trace says: {"schedule", "pp", "micro_batches",
  // "virtual_stages"} (the step spans' args of train --trace); null otherwise.
  nlohmann::json pipeline;
  double window_ms() const { return window_end_ms - window_start_ms; }
};

// Analyses `step` (default: the last step with forward/backward spans) of a traceEvents
// array. Fails when the events are malformed, hold no forward/backward span with a step,
// or lack the requested step.
Status analyze(const nlohmann::json& events, std::optional<int> step, Timeline* out);

// read_trace() then analyze(); errors name the file.
Status read_timeline(const std::string& path, std::optional<int> step, Timeline* out);

// A simulated schedule becomes trace events through parallel/pp/sim_trace.h.

}  // namespace meshtrain::trace
