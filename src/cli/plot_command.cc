#include <cstdio>

#include "cli/commands.h"
#include "plot/run_plot.h"

namespace meshtrain::cli {

Command add_plot_command(CLI::App& app) {
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto opts = std::make_shared<plot::PlotOptions>();
  auto* cmd = app.add_subcommand(
      "plot", "Plot loss (vs step and tokens), throughput and memory of runs as SVG (+PNG)");
  cmd->add_option("run_dirs", *dirs, "Run folders (each with metrics.jsonl)")->required();
  cmd->add_option("--out", *out, "Output .svg (a .png is written beside it when rsvg-convert exists)")
      ->required();
  cmd->add_option("--smoothing", opts->smoothing, "EMA weight of the smoothed train loss (0 = none)")
      ->capture_default_str();
  return {cmd, [=] {
            plot::PlotResult r;
            Status s = plot::plot_runs(*dirs, *out, *opts, &r);
            if (!s.is_ok()) return fail(s);
            std::string png = r.png_path.empty() ? " (no PNG: " + r.png_note + ")" : ", " + r.png_path;
            std::printf("plot: %zu run(s) -> %s%s\n", dirs->size(), out->c_str(), png.c_str());
            return 0;
          }};
}

}  // namespace meshtrain::cli
