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
            (pp::splits_backward(kind) ? " (B and W 1 ms each)" : "");
  return trace::analyze(pp::simulated_trace(sim), std::nullopt, out);
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
