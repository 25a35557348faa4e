#include "plot/run_plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "core/file_io.h"

extern char** environ;

namespace meshtrain::plot {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Distinct, colour-blind-friendlier hues, in the order runs are given.
const char* const kPalette[] = {"#1f6fb4", "#e0561b", "#2a9d3a", "#b4329a", "#7a5a2c",
                                "#0fa3b1", "#d4a017", "#5e4fa2", "#c0392b", "#555555"};
constexpr const char* kKeyInk = "#666666";

// A JSON number, or NaN for a missing key or a null (nlohmann writes NaN/inf as null).
double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

void add_record(const json& j, RunSeries* r) {
  if (j.contains("val_loss")) {
    r->val_step.push_back(number(j, "step"));
    r->val_loss.push_back(number(j, "val_loss"));
    r->val_tokens.push_back(number(j, "tokens"));
  } else if (j.contains("loss")) {
    r->step.push_back(number(j, "step"));
    r->loss.push_back(number(j, "loss"));
    r->tokens.push_back(number(j, "tokens"));
    r->tok_s.push_back(number(j, "tokens_per_s"));
    auto mem = j.find("mem");
    r->mem_total.push_back(mem != j.end() && mem->is_object() ? number(*mem, "total") : kNaN);
  }
}

// "small, 4L 256d, B8x1 T128, lr 0.002" from config.json; fields it lacks are left out.
std::string describe_config(const json& c) {
  std::vector<std::string> parts;
  if (c.contains("model") && c["model"].is_string()) parts.push_back(c["model"].get<std::string>());
  const json& m = c.contains("resolved_model") && c["resolved_model"].is_object() ? c["resolved_model"] : c;
  double layers = number(m, "layers"), dim = number(m, "dim"), seq = number(m, "seq_len");
  if (std::isfinite(layers) && std::isfinite(dim))
    parts.push_back(std::to_string((long)layers) + "L " + std::to_string((long)dim) + "d");
  double batch = number(c, "micro_batch"), accum = number(c, "grad_accum");
  if (std::isfinite(batch) && std::isfinite(seq)) {
    std::string b = "B" + std::to_string((long)batch);
    if (std::isfinite(accum) && accum > 1) b += "x" + std::to_string((long)accum);
    parts.push_back(b + " T" + std::to_string((long)seq));
  }
  double lr = number(c, "lr");
  if (std::isfinite(lr)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "lr %g", (double)(float)lr);  // stored from a float
    parts.push_back(buf);
  }
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += ", ";
    out += p;
  }
  return out;
}

// A folder's own name, even for "runs/a/" or ".".
std::string folder_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.filename().empty() || p.filename() == "." || p.filename() == "..") {
    std::error_code ec;
    fs::path abs = fs::weakly_canonical(p, ec);
    if (!ec && !abs.filename().empty()) return abs.filename().string();
  }
  return p.filename().string();
}

// Runs from different parents may share a folder name; the legend must still tell them
// apart, so clashing names get their parent folder too ("a/run", "b/run").
void make_names_unique(const std::vector<std::string>& dirs, std::vector<RunSeries>* runs) {
  std::map<std::string, int> count;
  for (const auto& r : *runs) count[r.name]++;
  for (size_t i = 0; i < runs->size(); i++) {
    if (count[(*runs)[i].name] < 2) continue;
    std::error_code ec;
    fs::path abs = fs::weakly_canonical(fs::path(dirs[i]), ec);
    if (ec) abs = fs::path(dirs[i]).lexically_normal();
    if (abs.filename().empty()) abs = abs.parent_path();
    (*runs)[i].name = folder_name(abs.parent_path().string()) + "/" + (*runs)[i].name;
  }
}

// Train loss (raw, optionally with its EMA) and val loss against one x column.
void add_loss_series(const RunSeries& r, const std::string& color, bool by_tokens,
                     const PlotOptions& o, Panel* panel) {
  const auto& x = by_tokens ? r.tokens : r.step;
  bool smooth = o.smoothing > 0;
  // With a smoothed curve on top, the raw loss recedes to a light line (it is the noise).
  panel->series.push_back({x, r.loss, color, smooth ? 1.2 : 1.8, smooth ? 0.35 : 1.0, false, false});
  if (smooth) panel->series.push_back({x, ema(r.loss, o.smoothing), color, 2.0, 1.0, false, false});
  if (!r.val_loss.empty())
    panel->series.push_back({by_tokens ? r.val_tokens : r.val_step, r.val_loss, color, 1.8, 1.0, true, true});
}

// Memory in MiB, or GiB once any run needs a gigabyte.
std::pair<double, const char*> memory_unit(const std::vector<RunSeries>& runs) {
  double peak = 0;
  for (const auto& r : runs)
    for (double v : r.mem_total)
      if (std::isfinite(v)) peak = std::max(peak, v);
  return peak >= 1024.0 * 1024 * 1024 ? std::pair{1024.0 * 1024 * 1024, "GiB"} : std::pair{1024.0 * 1024, "MiB"};
}

std::vector<double> scaled(const std::vector<double>& v, double divisor) {
  std::vector<double> out(v);
  for (double& x : out) x /= divisor;
  return out;
}

std::vector<LegendEntry> run_legend(const std::vector<RunSeries>& runs, const PlotOptions& o) {
  std::vector<LegendEntry> legend;
  bool any_val = false;
  for (size_t i = 0; i < runs.size(); i++) {
    legend.push_back({runs[i].name, kPalette[i % std::size(kPalette)], false, false, false, runs[i].description});
    for (double v : runs[i].val_loss) any_val |= std::isfinite(v);
  }
  // Style keys, in grey: what solid, light and dashed lines mean.
  if (o.smoothing > 0) {
    legend.push_back({"train loss (EMA)", kKeyInk, false, false, true, "", 1.0, 2.0, true});
    legend.push_back({"train loss (raw)", kKeyInk, false, false, true, "", 0.35, 1.2});
  } else {
    legend.push_back({"train loss", kKeyInk, false, false, true, "", 1.0, 2.4, true});
  }
  if (any_val) legend.push_back({"val loss", kKeyInk, true, true, true, ""});
  return legend;
}

std::string png_path_for(const std::string& svg) {
  std::string base = svg;
  if (base.size() >= 4) {
    std::string ext = base.substr(base.size() - 4);
    for (char& c : ext) c = (char)std::tolower((unsigned char)c);
    if (ext == ".svg") base.resize(base.size() - 4);
  }
  return base + ".png";
}

// The converter's full path: as given when it names a path, else the first match on PATH.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(begin, end - begin);
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(full.c_str(), X_OK) == 0 && !fs::is_directory(full)) return full;
    begin = end + 1;
  }
  return "";
}

// Runs a program without a shell (paths with spaces or quotes stay intact); -1 if it
// could not start, else its exit status.
int run_program(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Converts to PNG through a temporary file and a rename, like the SVG, so a reader never
// sees half an image.
void write_png(const std::string& svg, const PlotOptions& o, PlotResult* result) {
  std::string converter = find_program(o.converter);
  if (converter.empty()) {
    result->png_note = o.converter + " not found; no PNG written";
    return;
  }
  std::string png = png_path_for(svg), tmp = png + ".tmp.png";
  int rc = run_program({converter, "-o", tmp, svg});
  std::error_code ec;
  if (rc != 0 || !fs::exists(tmp) || (fs::rename(tmp, png, ec), ec)) {
    fs::remove(tmp, ec);
    result->png_note = o.converter + " failed (exit " + std::to_string(rc) + "); no PNG written";
    return;
  }
  result->png_path = png;
}

Status write_atomically(const std::string& path, const std::string& bytes) {
  fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::string tmp = path + ".tmp";
  RETURN_IF_ERROR(write_file_synced(tmp, bytes.data(), bytes.size()));
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::error("cannot rename " + tmp + " to " + path);
  }
  return fsync_dir(parent.empty() ? "." : parent.string());
}

}  // namespace

Status read_run(const std::string& run_dir, RunSeries* out) {
  *out = RunSeries();
  if (!fs::is_directory(run_dir)) return Status::error("run folder " + run_dir + " does not exist");
  std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  std::ifstream in(metrics);
  if (!in) return Status::error("no metrics.jsonl in " + run_dir);
  out->name = folder_name(run_dir);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) add_record(j, out);  // anything else: a cut-short or foreign line
  }
  if (out->step.empty()) return Status::error(metrics + " has no training-step records");
  std::string config;
  if (read_file((fs::path(run_dir) / "config.json").string(), &config).is_ok()) {
    json c = json::parse(config, nullptr, false);
    if (c.is_object()) out->description = describe_config(c);
  }
  return Status::ok();
}

std::vector<double> ema(const std::vector<double>& values, double weight) {
  std::vector<double> out(values.size(), kNaN);
  double avg = 0, correction = 1;
  for (size_t i = 0; i < values.size(); i++) {
    if (!std::isfinite(values[i])) continue;
    avg = weight * avg + (1 - weight) * values[i];
    correction *= weight;
    // Dividing by 1 - weight^n undoes the pull toward the zero start.
    out[i] = correction < 1 ? avg / (1 - correction) : values[i];
  }
  return out;
}

Figure build_figure(const std::vector<RunSeries>& runs, const PlotOptions& o) {
  Figure fig;
  fig.title = "meshtrain training curves";
  fig.legend = run_legend(runs, o);
  Panel by_step{"Loss vs step", "step", "loss", {}, false};
  Panel by_tokens{"Loss vs tokens", "tokens", "loss", {}, false};
  Panel speed{"Throughput", "step", "tokens / s", {}, true};
  auto [mem_div, mem_unit] = memory_unit(runs);
  Panel memory{"Peak memory (all categories)", "step", std::string("peak memory (") + mem_unit + ")", {}, true};
  for (size_t i = 0; i < runs.size(); i++) {
    const RunSeries& r = runs[i];
    std::string color = kPalette[i % std::size(kPalette)];
    add_loss_series(r, color, false, o, &by_step);
    add_loss_series(r, color, true, o, &by_tokens);
    speed.series.push_back({r.step, r.tok_s, color, 1.6, 1.0, false, false});
    memory.series.push_back({r.step, scaled(r.mem_total, mem_div), color, 2.0, 1.0, false, false});
  }
  fig.panels = {by_step, by_tokens, speed, memory};
  return fig;
}

Status plot_runs(const std::vector<std::string>& run_dirs, const std::string& out_svg,
                 const PlotOptions& options, PlotResult* result) {
  *result = PlotResult();
  if (run_dirs.empty()) return Status::error("no run folders to plot");
  std::vector<RunSeries> runs(run_dirs.size());
  for (size_t i = 0; i < run_dirs.size(); i++) RETURN_IF_ERROR(read_run(run_dirs[i], &runs[i]));
  make_names_unique(run_dirs, &runs);
  return write_figure(render_svg(build_figure(runs, options)), out_svg, options, result);
}

Status write_figure(const std::string& svg, const std::string& out_svg, const PlotOptions& options,
                    PlotResult* result) {
  *result = PlotResult();
  RETURN_IF_ERROR(write_atomically(out_svg, svg));
  if (options.png) write_png(out_svg, options, result);
  else result->png_note = "PNG not requested";
  return Status::ok();
}

}  // namespace meshtrain::plot
