#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "train/run.h"
#include "trace/trace.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

json comm_json(const std::map<std::string, comm::AxisStats>& stats, double* wait_ms,
               double* busy_ms) {
  json out = json::object();
  *wait_ms = *busy_ms = 0;
  for (const auto& [axis, s] : stats) {
    if (s.calls == 0) continue;
    out[axis] = {{"bytes", s.bytes}, {"calls", s.calls}};
    *wait_ms += s.wait_s * 1e3;
    *busy_ms += s.busy_s * 1e3;
  }
  return out;
}

// The step's measured pipeline bubble over the pp group: idle time inside the pipeline
// window of every stage over the window (see PipelineTimes), next to the schedule's own
// bubble from the simulator with the backward costing twice the forward.
json pipeline_json(Run& run) {
  if (!run.pipeline) return json::object();
  const auto& t = run.pipeline->times();
  double sums[2] = {t.compute_s, t.window_s};
  run.mesh->pp().all_reduce_f64(sums, 2, comm::ReduceOp::kSum);
  parallel::pp::SimResult sim;
  const Status simulated = parallel::pp::simulate(run.schedule, run.mesh_shape.pp, run.shape.A,
                                                  run.opt.virtual_stages, 1.0, 2.0, &sim);
  return {{"bubble", sums[1] > 0 ? 1.0 - sums[0] / sums[1] : 0.0},
          {"bubble_theory", simulated.is_ok() ? sim.bubble_fraction : -1.0},
          {"pp_compute_ms", t.compute_s * 1e3},
          {"pp_window_ms", t.window_s * 1e3},
          {"pp_peak_sets", t.peak_sets}};
}

// Collective: world rank 0 prints every rank's peak memory by category, and the pipeline's
// split and last measured bubble.
void print_summary(Run& run, comm::Group& world, const json& pipeline) {
  constexpr int kFields = 8;
  const MemStats m = MemoryTracker::instance().stats();
  std::vector<double> all((size_t)world.size() * kFields, 0.0);
  double* mine = all.data() + (size_t)world.rank() * kFields;
  auto peak = [&](MemCategory c) { return (double)m.peak[(int)c]; };
  const double other = peak(MemCategory::kComm) + peak(MemCategory::kGathered) + peak(MemCategory::kWorkspace);
  const double row[kFields] = {(double)run.mesh->tp_rank(), (double)run.mesh->pp_rank(),
                               (double)run.mesh->dp_rank(), peak(MemCategory::kParams),
                               peak(MemCategory::kGrads), peak(MemCategory::kOptim),
                               peak(MemCategory::kActivations) + other, (double)m.total_peak};
  std::copy(row, row + kFields, mine);
  world.all_reduce_f64(all.data(), all.size(), comm::ReduceOp::kSum);
  if (!run.is_main) return;
  const double mib = 1024.0 * 1024.0;
  std::printf("peak memory per rank (MiB): params, grads, optimizer state, activations + buffers, total\n");
  for (int r = 0; r < world.size(); r++) {
    const double* f = all.data() + (size_t)r * kFields;
    std::printf("  rank %2d (tp %d pp %d dp %d) | params %8.2f | grads %8.2f | optim %8.2f | acts+buf %8.2f | total %8.2f\n",
                r, (int)f[0], (int)f[1], (int)f[2], f[3] / mib, f[4] / mib, f[5] / mib, f[6] / mib, f[7] / mib);
  }
  if (!run.pipeline) return;
  std::string split;
  for (int n : run.stage_layers) {
    if (!split.empty()) split += ',';
    split += std::to_string(n);
  }
  std::printf("pipeline: %s, %d stages of layers %s, m=%d micro-batches | bubble (last step) measured %.3f, "
              "schedule %.3f\n",
              parallel::pp::schedule_name(run.schedule), (int)run.stage_layers.size(), split.c_str(),
              run.shape.A, pipeline.value("bubble", 0.0), pipeline.value("bubble_theory", 0.0));
}

// Every rank writes FILE.rank<N>; world rank 0 merges them into FILE.
Status write_trace(const std::string& file, comm::Group& world) {
  auto& tracer = trace::Tracer::instance();
  const std::string part = file + ".rank" + std::to_string(world.rank());
  Status written = tracer.write(part);
  tracer.disable();
  world.barrier();
  if (world.rank() != 0 || !written.is_ok()) return written;
  std::vector<std::string> parts;
  for (int r = 0; r < world.size(); r++) parts.push_back(file + ".rank" + std::to_string(r));
  RETURN_IF_ERROR(trace::merge_rank_files(parts, file));
  for (const auto& p : parts) fs::remove(p);
  return Status::ok();
}

}  // namespace meshtrain::train
