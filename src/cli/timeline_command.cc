// `meshtrain timeline`: one step of a Chrome trace (train --trace) as a pipeline diagram,
// with each rank's busy and idle time and the measured bubble; or, with --simulate, the
// theoretical timeline of a schedule from the discrete-event simulator.
#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "parallel/pp/schedule.h"
#include "plot/run_plot.h"
#include "plot/timeline_svg.h"
#include "parallel/pp/sim_trace.h"
#include "trace/timeline.h"

namespace meshtrain::cli {
namespace {

namespace pp = parallel::pp;

struct TimelineArgs {
  std::string trace, out;
  int step = 0;
  bool has_step = false;  // --step given
  std::string simulate;  // a schedule name instead of a trace
  int pp = 4, micro_batches = 8, virtual_stages = 1;
};

// The simulated schedule as a timeline: forward 1 ms, backward 2 ms per chunk.
Status simulated_timeline(const TimelineArgs& a, trace::Timeline* out, std::string* source) {
  pp::ScheduleKind kind;
  RETURN_IF_ERROR(parse_schedule_kind(a.simulate, &kind));
  pp::SimResult sim;
  // zb-v runs two chunks per rank whatever --virtual-stages says.
  const int v = kind == pp::ScheduleKind::kZbV ? 2 : a.virtual_stages;
  RETURN_IF_ERROR(pp::simulate(kind, a.pp, a.micro_batches, v, 1, 2, &sim));
  *source = "simulated " + a.simulate + " p=" + std::to_string(a.pp) + " m=" + std::to_string(a.micro_batches) +
            " v=" + std::to_string(v) + ", forward 1 ms, backward 2 ms" +
            (pp::splits_backward(kind) ? " (B and W 1 ms each)" : "") +
            (pp::never_flushes(kind) ? " (the steady state)" : "");
  RETURN_IF_ERROR(trace::analyze(pp::simulated_trace(sim), std::nullopt, out));
  out->pipeline = {{"schedule", a.simulate}, {"pp", a.pp}, {"micro_batches", a.micro_batches}, {"virtual_stages", v}};
  for (trace::RankTimeline& r : out->ranks) r.pp_rank = r.rank;
  return Status::ok();
}

// The bubble explained (pp::explain_bubble) from the step's spans: each stage's mean
// forward, backward and W over the ranks that run it. Empty when the trace does not say
// which schedule ran (an older trace) or misses a stage's passes.
std::string bubble_parts_line(const trace::Timeline& t) {
  const nlohmann::json& info = t.pipeline;
  pp::ScheduleKind kind;
  if (!info.is_object() || !parse_schedule_kind(info.value("schedule", ""), &kind).is_ok()) return "";
  const int p = info.value("pp", 0), m = info.value("micro_batches", 0), v = info.value("virtual_stages", 1);
  if (p < 1 || m < 1 || v < 1) return "";
  const size_t S = (size_t)p * v;
  std::vector<double> sum[3] = {std::vector<double>(S), std::vector<double>(S), std::vector<double>(S)};
  std::vector<int> count[3] = {std::vector<int>(S), std::vector<int>(S), std::vector<int>(S)};
  for (const trace::RankTimeline& r : t.ranks) {
    if (r.pp_rank < 0 || r.pp_rank >= p) continue;
    for (const trace::Block& b : r.compute) {
      const int pass = b.category == trace::category::kForward          ? 0
                       : b.category == trace::category::kBackward        ? 1
                       : b.category == trace::category::kBackwardWeight ? 2
                                                                         : -1;
      if (pass < 0 || b.chunk >= v) continue;
      const int st = pp::stage_of(kind, p, v, r.pp_rank, b.chunk);
      sum[pass][st] += b.end_ms - b.start_ms, count[pass][st]++;
    }
  }
  pp::PassCosts costs;
  for (int pass = 0; pass < 3; pass++) {
    std::vector<double>& cost = pass == 0 ? costs.forward : pass == 1 ? costs.backward : costs.weight;
    for (size_t st = 0; st < S; st++) {
      if (count[pass][st] == 0 && pass < 2) return "";
      cost.push_back(count[pass][st] ? sum[pass][st] / count[pass][st] : 0.0);
    }
  }
  pp::BubbleParts parts;
  if (!pp::explain_bubble(kind, p, m, v, costs, t.bubble_fraction, &parts).is_ok()) return "";
  char line[256];
  std::snprintf(line, sizeof line,
                "bubble explained: schedule %.4f + stage imbalance %.4f + overhead %.4f (the simulator at each "
                "stage's measured forward, backward and W)\n",
                parts.schedule, parts.imbalance, parts.overhead);
  return line;
}

// FILE.svg: the SVG alone. FILE.png: FILE.svg and its PNG, which must then succeed.
Status write_output(const std::string& svg, const std::string& out, std::string* written) {
  bool png = out.ends_with(".png");
  if (!png && !out.ends_with(".svg")) return Status::error("--out must end in .svg or .png, got " + out);
  plot::PlotOptions options;
  options.png = png;
  std::string svg_path = png ? out.substr(0, out.size() - 4) + ".svg" : out;
  plot::PlotResult result;
  RETURN_IF_ERROR(plot::write_figure(svg, svg_path, options, &result));
  if (png && result.png_path.empty())
    return Status::error("wrote " + svg_path + " but no PNG: " + result.png_note);
  *written = png ? svg_path + " and " + result.png_path : svg_path;
  return Status::ok();
}

int run_timeline(const TimelineArgs& a) {
  if (a.trace.empty() == a.simulate.empty())
    return fail(Status::error("give either a TRACE file or --simulate SCHEDULE"));
  trace::Timeline t;
  std::string source = a.trace;
  std::optional<int> step = a.has_step ? std::optional(a.step) : std::nullopt;
  Status s = a.simulate.empty() ? trace::read_timeline(a.trace, step, &t) : simulated_timeline(a, &t, &source);
  if (!s.is_ok()) return fail(s);
  std::string written;
  if (s = write_output(plot::render_timeline_svg(t, source), a.out, &written); !s.is_ok()) return fail(s);
  std::printf("timeline: step %d of %s: %zu ranks, step window %.3f ms\n", t.step, source.c_str(), t.ranks.size(),
              t.window_ms());
  for (const auto& r : t.ranks)
    std::printf("  rank %d: busy %.3f ms, idle %.3f ms\n", r.rank, r.busy_ms, r.idle_ms);
  std::printf("bubble: %.4f (idle %.2f%% of %zu ranks x %.3f ms)\n", t.bubble_fraction, 100 * t.bubble_fraction,
              t.ranks.size(), t.window_ms());
  std::printf("%s", bubble_parts_line(t).c_str());
  std::printf("wrote %s\n", written.c_str());
  return 0;
}

}  // namespace

Command add_timeline_command(CLI::App& app) {
  auto a = std::make_shared<TimelineArgs>();
  auto* cmd = app.add_subcommand(
      "timeline", "Draw one step of a Chrome trace (train --trace) as a pipeline diagram and measure its bubble");
  cmd->add_option("trace", a->trace, "Merged trace file (JSON)");
  cmd->add_option("--out", a->out, "Output .svg, or .png (writes the .svg beside it; needs rsvg-convert)")
      ->required();
  auto* step = cmd->add_option("--step", a->step, "Training step to draw (default: the last one in the trace)");
  cmd->add_option("--simulate", a->simulate,
                  "Instead of a trace, draw a simulated schedule: gpipe, 1f1b or interleaved");
  cmd->add_option("--pp", a->pp, "With --simulate: pipeline ranks p")->capture_default_str();
  cmd->add_option("--micro-batches", a->micro_batches, "With --simulate: micro-batches m")->capture_default_str();
  cmd->add_option("--virtual-stages", a->virtual_stages, "With --simulate: chunks per rank v (interleaved: >= 2)")
      ->capture_default_str();
  return {cmd, [a, step] {
            a->has_step = step->count() > 0;
            return run_timeline(*a);
          }};
}

}  // namespace meshtrain::cli
