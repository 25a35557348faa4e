#include "train/step_profile.h"

#include <algorithm>
#include <cstdio>

namespace meshtrain::train {

namespace {

using profile::Op;

// One op's figures per step.
struct Row {
  const char* name;
  double ms = 0, share = 0, calls = 0, gflops = 0, gbps = 0;
  double of_peak = 0;  // its rate over the GEMM peak (GEMMs, attention) or the triad (the rest)
  bool compute = false;
};

Row row_of(Op op, const profile::OpStats& s, int steps, double step_s, const ProfilePeaks& peaks) {
  Row r{profile::op_name(op)};
  const double seconds = s.seconds / steps;
  r.ms = seconds * 1e3, r.share = step_s > 0 ? seconds / step_s : 0, r.calls = (double)s.calls / steps;
  r.compute = s.flops > 0;
  if (s.seconds > 0) r.gflops = s.flops / s.seconds / 1e9, r.gbps = s.bytes / s.seconds / 1e9;
  if (r.compute && peaks.gemm_gflops > 0) r.of_peak = r.gflops / peaks.gemm_gflops;
  else if (!r.compute && r.gbps > 0 && peaks.triad_gbps > 0) r.of_peak = r.gbps / peaks.triad_gbps;
  return r;
}

std::vector<Row> rows_of(const profile::Profile& p, int steps, double step_s, const ProfilePeaks& peaks) {
  std::vector<Row> rows;
  for (int i = 0; i < (int)Op::kCount; i++)
    if (p[i].calls > 0) rows.push_back(row_of((Op)i, p[i], steps, step_s, peaks));
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return rows;
}

}  // namespace

std::string profile_table(const profile::Profile& p, int steps, double step_s, const ProfilePeaks& peaks) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "step profile (%d step%s of %.1f ms; GEMM peak %.1f GFLOP/s, triad %.1f GB/s, measured this run)\n"
                "  %-14s %9s %6s %7s %10s %8s %9s\n",
                steps, steps == 1 ? "" : "s", step_s * 1e3, peaks.gemm_gflops, peaks.triad_gbps, "op", "ms/step",
                "share", "calls", "GFLOP/s", "GB/s", "of peak");
  out += line;
  double profiled = 0;
  for (const Row& r : rows_of(p, steps, step_s, peaks)) {
    profiled += r.ms;
    const std::string rate = r.compute ? std::to_string((int)(r.gflops + 0.5)) : "-";
    char gbps[32] = "-", of_peak[32] = "-";
    if (!r.compute && r.gbps > 0) std::snprintf(gbps, sizeof gbps, "%.1f", r.gbps);
    if (r.of_peak > 0) std::snprintf(of_peak, sizeof of_peak, "%.1f%% %s", 100 * r.of_peak, r.compute ? "G" : "M");
    std::snprintf(line, sizeof line, "  %-14s %9.2f %5.1f%% %7.0f %10s %8s %9s\n", r.name, r.ms, 100 * r.share,
                  r.calls, rate.c_str(), gbps, of_peak);
    out += line;
  }
  const double other = step_s * 1e3 - profiled;
  std::snprintf(line, sizeof line, "  %-14s %9.2f %5.1f%%   (the step's time outside every op above)\n", "other",
                other, step_s > 0 ? 100 * other / (step_s * 1e3) : 0);
  out += line;
  out += "  (of peak: G = of the GEMM peak, M = of the triad bandwidth, by the bytes each op must move at least)\n";
  return out;
}

nlohmann::json profile_json(const profile::Profile& p, int steps, double step_s, const ProfilePeaks& peaks) {
  nlohmann::json ops = nlohmann::json::object();
  double profiled = 0;
  for (const Row& r : rows_of(p, steps, step_s, peaks)) {
    profiled += r.ms;
    nlohmann::json j = {{"ms_per_step", r.ms}, {"share", r.share}, {"calls_per_step", r.calls}};
    if (r.compute) j["gflops"] = r.gflops;
    else j["gbps"] = r.gbps;
    j["of_peak"] = r.of_peak;
    ops[r.name] = j;
  }
  return {{"steps", steps},
          {"step_ms", step_s * 1e3},
          {"gemm_peak_gflops", peaks.gemm_gflops},
          {"triad_gbps", peaks.triad_gbps},
          {"other_ms", step_s * 1e3 - profiled},
          {"ops", ops}};
}

}  // namespace meshtrain::train
