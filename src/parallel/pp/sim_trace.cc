#include "parallel/pp/sim_trace.h"

#include <algorithm>
#include <string>
#include <vector>

#include "trace/trace.h"

namespace meshtrain::parallel::pp {

using nlohmann::json;

json simulated_trace(const SimResult& sim, int step) {
  using trace::category::kBackward, trace::category::kBackwardWeight, trace::category::kForward, trace::Lane,
      trace::SpanRecord;
  int chunks = 1;
  for (const auto& rank : sim.spans)
    for (const auto& s : rank) chunks = std::max(chunks, s.chunk + 1);
  json events = json::array();
  for (size_t r = 0; r < sim.spans.size(); ++r) {
    std::vector<SpanRecord> spans;
    for (const auto& s : sim.spans[r]) {
      const bool forward = s.kind == ActionKind::kForward, weight = s.kind == ActionKind::kBackwardWeight;
      // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + string.
      std::string name = forward ? "F" : weight ? "W" : "B";
      name += std::to_string(s.microbatch);
      if (chunks > 1) {
        name += '.';
        name += std::to_string(s.chunk);
      }
      spans.push_back({Lane::kCompute, name, forward ? kForward : weight ? kBackwardWeight : kBackward, s.start * 1000,
                       s.end * 1000, {{"step", step}, {"mb", s.microbatch}, {"chunk", s.chunk}}});
    }
    for (json& e : trace::trace_events(static_cast<int>(r), spans)) events.push_back(std::move(e));
  }
  return events;
}

}  // namespace meshtrain::parallel::pp
