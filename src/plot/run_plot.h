// `meshtrain plot`: training curves of one or more run folders (their metrics.jsonl) as
// one SVG figure, plus a PNG when rsvg-convert is installed.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "plot/svg_plot.h"

namespace meshtrain::plot {

// The plotted columns of one run's metrics.jsonl. Step records fill the first group,
// eval records the second; a record missing a key contributes NaN there (skipped when
// drawn), so every vector of a group has one entry per record.
struct RunSeries {
  std::string name;         // legend label: the folder's name
  std::string description;  // short summary of config.json ("" without one)
  std::vector<double> step, loss, tokens, tok_s, mem_total;  // mem_total in bytes
  std::vector<double> val_step, val_loss, val_tokens;
};

// Reads RUN_DIR/metrics.jsonl (and RUN_DIR/config.json when present). Lines that do not
// parse as JSON objects are skipped, since a crashed run can end mid-line; a file with no
// step records is an error.
Status read_run(const std::string& run_dir, RunSeries* out);

// A debiased exponential moving average (`weight` of the past per point; 0 copies the
// input). Non-finite inputs stay NaN in the output and do not disturb the average.
std::vector<double> ema(const std::vector<double>& values, double weight);

struct PlotOptions {
  double smoothing = 0.9;  // EMA weight of the smoothed train-loss curve; 0 draws none
  bool png = true;         // also convert to PNG when the converter is available
  std::string converter = "rsvg-convert";  // found on PATH unless it contains a '/'
};

struct PlotResult {
  std::string png_path;  // empty when no PNG was written
  std::string png_note;  // why not, when png_path is empty ("rsvg-convert not found", ...)
};

// The four-panel figure (loss vs step, loss vs tokens, tokens/s, peak memory) for runs.
Figure build_figure(const std::vector<RunSeries>& runs, const PlotOptions& options);

// Writes an SVG document to `out_svg` atomically (temporary file, fsync, rename) and, when
// options.png and the converter allow, a PNG beside it (FILE.svg -> FILE.png). A missing or
// failing converter is reported in `result->png_note`, not as an error.
Status write_figure(const std::string& svg, const std::string& out_svg, const PlotOptions& options,
                    PlotResult* result);

// Reads every run and writes their figure with write_figure().
Status plot_runs(const std::vector<std::string>& run_dirs, const std::string& out_svg,
                 const PlotOptions& options, PlotResult* result);

}  // namespace meshtrain::plot
