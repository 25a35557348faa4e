// Tests of `meshtrain plot`'s library: nice ticks, tick labels, the EMA, reading
// metrics.jsonl (cut-short lines, missing keys, errors), the SVG's structure for several
// runs and for degenerate data, and the files plot_runs writes (atomic SVG, optional PNG).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "plot/run_plot.h"
#include "plot/svg_plot.h"

namespace meshtrain::plot::test_plot {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- Helpers ---------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("meshtrain_plot_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) n++;
  return n;
}

// A step record as the trainer writes it.
std::string step_line(int step, double loss, double tok_s = 1000, double mem = 512.0 * 1024 * 1024) {
  return "{\"grad_norm\":1.0,\"loss\":" + std::to_string(loss) +
         ",\"lr\":0.001,\"mem\":{\"activations\":1,\"comm\":0,\"grads\":1,\"optim\":1,\"params\":1,"
         "\"total\":" + std::to_string((long long)mem) + ",\"workspace\":1},\"mfu\":0.3,\"step\":" +
         std::to_string(step) + ",\"step_ms\":100.0,\"tokens\":" + std::to_string(step * 1024) +
         ",\"tokens_per_s\":" + std::to_string(tok_s) + "}\n";
}

std::string eval_line(int step, double val_loss) {
  return "{\"step\":" + std::to_string(step) + ",\"tokens\":" + std::to_string(step * 1024) +
         ",\"val_loss\":" + std::to_string(val_loss) + "}\n";
}

// A run folder with `steps` decaying, slightly noisy losses and an eval every 10 steps.
std::string make_run(const TempDir& tmp, const std::string& name, int steps, double scale) {
  std::string text;
  for (int s = 1; s <= steps; s++) {
    text += step_line(s, scale * (3 + 8 * std::exp(-s / 15.0)) + 0.1 * std::sin(s * 1.7), 900 + 50 * scale);
    if (s % 10 == 0) text += eval_line(s, scale * (3.1 + 8 * std::exp(-s / 15.0)));
  }
  write_text(tmp / (name + "/metrics.jsonl"), text);
  return tmp / name;
}

// Checks that start and end tags nest properly (a cheap well-formedness test that needs
// no XML parser): every "<x ...>" is closed by "</x>" in order, "<x .../>" closes itself.
bool tags_balanced(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    size_t end = xml.find('>', at);
    if (end == std::string::npos) return false;
    std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.empty()) return false;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  return open.empty();
}

// ---- Ticks -----------------------------------------------------------------------------

// True when step is 1, 2 or 5 times a power of ten.
bool is_125(double step) {
  double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (std::fabs(mantissa - m) < 1e-6) return true;
  return false;
}

TEST(PlotTicks, CoverRangeWithOneTwoFiveSteps) {
  const double ranges[][2] = {{0, 200},    {1, 200},       {4.93, 10.83}, {0, 1},       {-3.2, 7.9},
                              {0.001, 0.0013}, {390, 452}, {0, 204800},   {1e9, 3.7e9}, {7, 7.0001},
                              {-0.5, -0.1}, {12345, 12346}};
  for (auto [lo, hi] : ranges) {
    for (int max_ticks : {3, 5, 7, 10}) {
      Ticks t = nice_ticks(lo, hi, max_ticks);
      SCOPED_TRACE(std::to_string(lo) + ".." + std::to_string(hi) + " max " + std::to_string(max_ticks));
      ASSERT_GE(t.values.size(), 2u);
      EXPECT_LE(t.values.size(), (size_t)max_ticks);
      EXPECT_TRUE(is_125(t.step)) << t.step;
      double tol = 1e-9 * t.step;
      EXPECT_LE(t.values.front(), lo + tol);
      EXPECT_GE(t.values.back(), hi - tol);
      for (size_t i = 0; i < t.values.size(); i++) {
        double k = t.values[i] / t.step;
        EXPECT_NEAR(k, std::round(k), 1e-6) << "tick " << t.values[i] << " not a multiple of the step";
        if (i) {
          EXPECT_NEAR(t.values[i] - t.values[i - 1], t.step, 1e-9 * std::fabs(t.values[i]) + tol);
        }
      }
    }
  }
}

TEST(PlotTicks, ExamplesAreTheExpectedOnes) {
  EXPECT_EQ(nice_ticks(0, 200, 7).values, (std::vector<double>{0, 50, 100, 150, 200}));
  EXPECT_EQ(nice_ticks(1, 10, 6).step, 2);
  EXPECT_EQ(nice_ticks(0, 1, 6).step, 0.2);
  // Either order.
  EXPECT_EQ(nice_ticks(200, 0, 7).values, nice_ticks(0, 200, 7).values);
}

TEST(PlotTicks, DegenerateRangesStillHaveWidth) {
  for (double v : {0.0, 5.0, -2.5, 548380672.0, 1e-7}) {
    Ticks t = nice_ticks(v, v);
    ASSERT_GE(t.values.size(), 2u);
    EXPECT_LT(t.values.front(), v);
    EXPECT_GT(t.values.back(), v);
  }
  Ticks t = nice_ticks(kNaN, std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.values.front(), 0);
  EXPECT_EQ(t.values.back(), 1);
  EXPECT_EQ(nice_ticks(-1e308, 1e308).values.back(), 1);  // the span overflows
}

TEST(PlotTicks, LabelsAreShortAndDistinct) {
  Ticks tokens = nice_ticks(0, 204800, 7);
  EXPECT_EQ(format_tick(0, tokens), "0");
  EXPECT_EQ(format_tick(200000, tokens), "200k");
  Ticks loss = nice_ticks(4.9, 10.9, 7);
  EXPECT_EQ(format_tick(5, loss), "5");
  Ticks fine = nice_ticks(2.1, 2.9, 6);
  EXPECT_EQ(format_tick(2.4, fine), "2.4");
  Ticks tokens_m = nice_ticks(0, 1.3e6, 8);
  EXPECT_EQ(format_tick(1.2e6, tokens_m), "1.2M");
  Ticks lr = nice_ticks(0, 6e-4, 4);
  EXPECT_EQ(format_tick(4e-4, lr), "4e-4");
  // Neighbouring ticks never print the same.
  for (auto [lo, hi] : {std::pair{0.0, 1.0}, {3.1, 3.3}, {0.0, 5e7}, {1e-5, 3e-5}, {99, 101}}) {
    Ticks t = nice_ticks(lo, hi);
    for (size_t i = 1; i < t.values.size(); i++)
      EXPECT_NE(format_tick(t.values[i - 1], t), format_tick(t.values[i], t));
  }
}

// ---- EMA -------------------------------------------------------------------------------

TEST(PlotEma, DebiasedAndSkipsNonFinite) {
  auto flat = ema({4, 4, 4, 4}, 0.9);
  for (double v : flat) EXPECT_NEAR(v, 4, 1e-12);  // no pull toward zero at the start
  auto with_gap = ema({1, kNaN, 3}, 0.5);
  EXPECT_DOUBLE_EQ(with_gap[0], 1);
  EXPECT_TRUE(std::isnan(with_gap[1]));
  EXPECT_NEAR(with_gap[2], (0.25 * 1 + 0.5 * 3) / 0.75, 1e-12);
  EXPECT_EQ(ema({1, 2, 3}, 0), (std::vector<double>{1, 2, 3}));
}

// ---- Reading runs ----------------------------------------------------------------------

TEST(PlotReadRun, ParsesStepAndEvalLinesAndSkipsBrokenOnes) {
  TempDir tmp;
  std::string text = step_line(1, 10.5, 400, 548380672) + step_line(2, 9.25, 450) +
                     "not json at all\n" + "\n" + eval_line(2, 9.5) +
                     "{\"step\":3,\"loss\":null,\"tokens\":3072}\n" +  // NaN loss is written as null
                     "[1,2,3]\n" + step_line(4, 8.0) + "{\"step\":5,\"loss\":7.9,\"tok";  // cut short
  write_text(tmp / "run_a/metrics.jsonl", text);
  write_text(tmp / "run_a/config.json",
             R"({"model":"small","micro_batch":8,"grad_accum":2,"lr":0.0020000000949949026,)"
             R"("resolved_model":{"layers":4,"dim":256,"seq_len":128}})");
  RunSeries r;
  ASSERT_TRUE(read_run(tmp / "run_a/", &r).is_ok());
  EXPECT_EQ(r.name, "run_a");
  EXPECT_EQ(r.description, "small, 4L 256d, B8x2 T128, lr 0.002");
  EXPECT_EQ(r.step, (std::vector<double>{1, 2, 3, 4}));
  ASSERT_EQ(r.loss.size(), 4u);
  EXPECT_DOUBLE_EQ(r.loss[1], 9.25);
  EXPECT_TRUE(std::isnan(r.loss[2]));
  EXPECT_TRUE(std::isnan(r.tok_s[2]));
  EXPECT_TRUE(std::isnan(r.mem_total[2]));
  EXPECT_DOUBLE_EQ(r.tokens[3], 4096);
  EXPECT_DOUBLE_EQ(r.tok_s[1], 450);
  EXPECT_DOUBLE_EQ(r.mem_total[0], 548380672);
  EXPECT_EQ(r.val_step, (std::vector<double>{2}));
  EXPECT_DOUBLE_EQ(r.val_loss[0], 9.5);
  EXPECT_DOUBLE_EQ(r.val_tokens[0], 2048);
}

TEST(PlotReadRun, WithoutConfigOrEvalLines) {
  TempDir tmp;
  write_text(tmp / "r/metrics.jsonl", step_line(1, 5));
  RunSeries r;
  ASSERT_TRUE(read_run(tmp / "r", &r).is_ok());
  EXPECT_EQ(r.description, "");
  EXPECT_TRUE(r.val_loss.empty());
}

TEST(PlotReadRun, ErrorsNameTheProblem) {
  TempDir tmp;
  RunSeries r;
  Status missing = read_run(tmp / "nope", &r);
  EXPECT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("does not exist"), std::string::npos) << missing.message();

  fs::create_directories(tmp / "no_metrics");
  Status no_file = read_run(tmp / "no_metrics", &r);
  EXPECT_NE(no_file.message().find("no metrics.jsonl"), std::string::npos) << no_file.message();

  write_text(tmp / "empty/metrics.jsonl", "");
  Status empty = read_run(tmp / "empty", &r);
  EXPECT_NE(empty.message().find("no training-step records"), std::string::npos) << empty.message();

  write_text(tmp / "evals_only/metrics.jsonl", eval_line(10, 3) + "{\"loss\":");
  EXPECT_FALSE(read_run(tmp / "evals_only", &r).is_ok());
}

// ---- SVG -------------------------------------------------------------------------------

// Series with at least one finite point: each must appear as exactly one <polyline>.
size_t drawable_series(const Figure& fig) {
  size_t n = 0;
  for (const Panel& p : fig.panels)
    for (const Series& s : p.series)
      for (size_t i = 0; i < s.x.size(); i++)
        if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
          n++;
          break;
        }
  return n;
}

TEST(PlotSvg, TwoRunsHaveEverySeriesLegendAndLabel) {
  TempDir tmp;
  std::vector<RunSeries> runs(2);
  ASSERT_TRUE(read_run(make_run(tmp, "baseline", 60, 1.0), &runs[0]).is_ok());
  ASSERT_TRUE(read_run(make_run(tmp, "wide & <fast>", 40, 0.9), &runs[1]).is_ok());
  Figure fig = build_figure(runs, PlotOptions());
  ASSERT_EQ(fig.panels.size(), 4u);
  std::string svg = render_svg(fig);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_TRUE(tags_balanced(svg));
  // Per run: train, EMA and val in each loss panel, then throughput and memory.
  EXPECT_EQ(drawable_series(fig), 2u * (3 + 3 + 1 + 1));
  EXPECT_EQ(count(svg, "<polyline"), drawable_series(fig));
  EXPECT_NE(svg.find(">baseline<"), std::string::npos);
  EXPECT_NE(svg.find(">wide &amp; &lt;fast&gt;<"), std::string::npos);  // escaped
  for (const char* label : {">step<", ">tokens<", ">loss<", ">tokens / s<", ">peak memory (MiB)<", ">val loss<",
                            ">Loss vs step<", ">Loss vs tokens<", ">Throughput<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  // Self-contained: nothing fetched from elsewhere.
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);
  EXPECT_EQ(svg.find("@import"), std::string::npos);
}

TEST(PlotSvg, GigabyteRunsUseGiB) {
  RunSeries r;
  r.name = "big";
  r.step = {1, 2};
  r.loss = {3, 2};
  r.tokens = {1, 2};
  r.tok_s = {5, 5};
  r.mem_total = {3.5 * 1024 * 1024 * 1024, 3.5 * 1024 * 1024 * 1024};
  std::string svg = render_svg(build_figure({r}, PlotOptions()));
  EXPECT_NE(svg.find(">peak memory (GiB)<"), std::string::npos);
}

TEST(PlotSvg, DegenerateDataStillRendersFiniteCoordinates) {
  RunSeries one;  // a single step, no evals
  one.name = "one";
  one.step = {1};
  one.loss = {7};
  one.tokens = {1024};
  one.tok_s = {500};
  one.mem_total = {1e8};
  RunSeries odd;  // constant and non-finite values
  odd.name = "odd";
  odd.step = {1, 2, 3, 4};
  odd.loss = {5, kNaN, std::numeric_limits<double>::infinity(), 5};
  odd.tokens = {10, 20, 30, 40};
  odd.tok_s = {kNaN, kNaN, kNaN, kNaN};
  odd.mem_total = {2e8, 2e8, 2e8, 2e8};
  odd.val_step = {4};
  odd.val_loss = {kNaN};
  odd.val_tokens = {40};
  PlotOptions no_smoothing;
  no_smoothing.smoothing = 0;
  Figure fig = build_figure({one, odd}, no_smoothing);
  std::string svg = render_svg(fig);
  EXPECT_TRUE(tags_balanced(svg));
  EXPECT_EQ(count(svg, "<polyline"), drawable_series(fig));
  for (const char* bad : {"nan", "inf", "NaN"}) EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
  // The lone point of "one" is drawn as a dot so it is visible.
  EXPECT_GE(count(svg, "<circle"), 4u);
}

TEST(PlotSvg, EmptyPanelSaysNoData) {
  Figure fig;
  fig.panels.push_back(Panel{"Empty", "x", "y", {Series{{kNaN}, {1}}}, false});
  std::string svg = render_svg(fig);
  EXPECT_NE(svg.find(">no data<"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_TRUE(tags_balanced(svg));
}

// ---- Files -----------------------------------------------------------------------------

bool have_rsvg_convert() { return std::system("command -v rsvg-convert >/dev/null 2>&1") == 0; }

TEST(PlotRuns, WritesSvgAndMaybePng) {
  TempDir tmp;
  std::vector<std::string> dirs = {make_run(tmp, "a", 30, 1.0), make_run(tmp, "b", 30, 0.95)};
  std::string out = tmp / "plots/curves.svg";  // the folder does not exist yet
  PlotResult result;
  Status s = plot_runs(dirs, out, PlotOptions(), &result);
  ASSERT_TRUE(s.is_ok()) << s.message();
  std::string svg = read_text(out);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  if (!have_rsvg_convert()) {
    EXPECT_EQ(result.png_path, "");
    EXPECT_NE(result.png_note, "");
    GTEST_SKIP() << "rsvg-convert not installed; PNG not checked";
  }
  EXPECT_EQ(result.png_path, tmp / "plots/curves.png");
  std::string png = read_text(result.png_path);
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_FALSE(fs::exists(result.png_path + ".tmp.png"));
}

TEST(PlotRuns, MissingConverterIsNotAnError) {
  TempDir tmp;
  PlotOptions o;
  o.converter = "meshtrain-no-such-converter";
  PlotResult result;
  ASSERT_TRUE(plot_runs({make_run(tmp, "a", 5, 1.0)}, tmp / "x.svg", o, &result).is_ok());
  EXPECT_EQ(result.png_path, "");
  EXPECT_NE(result.png_note.find("not found"), std::string::npos);
  EXPECT_TRUE(fs::exists(tmp / "x.svg"));
  EXPECT_FALSE(fs::exists(tmp / "x.png"));
}

TEST(PlotRuns, SameFolderNamesAreToldApart) {
  TempDir tmp;
  std::vector<std::string> dirs = {make_run(tmp, "lr1/run", 5, 1.0), make_run(tmp, "lr2/run", 5, 1.0)};
  PlotOptions o;
  o.png = false;
  PlotResult result;
  ASSERT_TRUE(plot_runs(dirs, tmp / "x.svg", o, &result).is_ok());
  std::string svg = read_text(tmp / "x.svg");
  EXPECT_NE(svg.find(">lr1/run<"), std::string::npos);
  EXPECT_NE(svg.find(">lr2/run<"), std::string::npos);
}

TEST(PlotRuns, ErrorsLeaveNoFile) {
  TempDir tmp;
  PlotResult result;
  EXPECT_FALSE(plot_runs({}, tmp / "x.svg", PlotOptions(), &result).is_ok());
  Status s = plot_runs({make_run(tmp, "a", 5, 1.0), tmp / "missing"}, tmp / "x.svg", PlotOptions(), &result);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("missing"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "x.svg"));
}

}  // namespace
}  // namespace meshtrain::plot::test_plot
