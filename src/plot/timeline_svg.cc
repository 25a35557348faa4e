#include "plot/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "plot/svg_plot.h"

namespace meshtrain::plot {
namespace {

using trace::Block;
using trace::Timeline;
namespace cat = trace::category;

// ---- Layout (px) ----
constexpr double kLeft = 84;   // rank labels
constexpr double kRight = 86;  // each rank's busy share
constexpr double kHeaderHeight = 58;
constexpr double kRowHeight = 28, kCommHeight = 8, kCommGap = 2, kRankGap = 12;
constexpr double kAxisHeight = 46;
constexpr double kBlockFont = 11, kSmallFont = 10, kSubtitleFont = 13;
// The plot widens until a short block (the lower quartile of forward/backward durations)
// is this wide, enough for a two-digit label, within these bounds.
constexpr double kShortBlockPx = 28, kMinPlotWidth = 760, kMaxPlotWidth = 2200;
// Chunk c of v is mixed with this much white at most (the last chunk), so interleaved
// chunks read as shades of one colour.
constexpr double kMaxTint = 0.55;

const char* base_color(const std::string& category) {
  if (category == cat::kForward) return "#1f6fb4";
  if (category == cat::kBackward) return "#e0561b";
  if (category == cat::kBackwardWeight) return "#2ca25f";
  if (category == cat::kOptimizer) return "#5e4fa2";
  if (category == cat::kCollective) return "#8c8c8c";
  if (category == cat::kP2p) return "#0fa3b1";
  return "#bdbdbd";
}

std::string block_class(const std::string& category) {
  for (const char* known : {cat::kForward, cat::kBackward, cat::kBackwardWeight, cat::kOptimizer, cat::kCollective,
                            cat::kP2p})
    if (category == known) return known;
  return "other";
}

// `hex` ("#rrggbb") mixed with white: t = 0 keeps it, t = 1 is white.
std::string lighten(const char* hex, double t) {
  unsigned rgb[3] = {0, 0, 0};
  std::sscanf(hex + 1, "%2x%2x%2x", &rgb[0], &rgb[1], &rgb[2]);
  char out[8];
  auto mix = [t](unsigned c) { return static_cast<unsigned>(std::lround(c + (255 - c) * t)); };
  std::snprintf(out, sizeof out, "#%02x%02x%02x", mix(rgb[0]) & 255, mix(rgb[1]) & 255, mix(rgb[2]) & 255);
  return out;
}

double chunk_tint(int chunk, int chunks) {
  return chunks > 1 ? kMaxTint * std::min(chunk, chunks - 1) / (chunks - 1) : 0;
}

std::string ms_text(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ms < 100 ? "%.2f" : ms < 10000 ? "%.1f" : "%.0f", ms);
  return buf;
}

// The longest of "mb.chunk" (interleaved runs only) and "mb" that fits `width` px; "opt"
// for an optimizer block; "" when nothing fits or the block has no micro-batch.
std::string fitting_label(const Block& b, int chunks, double width) {
  std::vector<std::string> candidates;
  if (b.microbatch >= 0) {
    std::string mb = std::to_string(b.microbatch);
    if (chunks > 1) candidates.push_back(mb + '.' + std::to_string(b.chunk));
    candidates.push_back(mb);
  } else if (b.category == cat::kOptimizer) {
    candidates.push_back("opt");
  }
  for (const std::string& c : candidates)
    if (text_width(c, kBlockFont) + 4 <= width) return c;
  return "";
}

double plot_width(const Timeline& t) {
  std::vector<double> durations;
  for (const auto& rank : t.ranks)
    for (const Block& b : rank.compute)
      if (b.microbatch >= 0 && b.end_ms > b.start_ms) durations.push_back(b.end_ms - b.start_ms);
  if (durations.empty() || t.range_ms <= 0) return kMinPlotWidth;
  auto quartile = durations.begin() + durations.size() / 4;
  std::nth_element(durations.begin(), quartile, durations.end());
  return std::clamp(t.range_ms / *quartile * kShortBlockPx, kMinPlotWidth, kMaxPlotWidth);
}

bool has_category(const Timeline& t, const char* category) {
  for (const auto& rank : t.ranks)
    for (const auto* lane : {&rank.compute, &rank.comm})
      for (const Block& b : *lane)
        if (b.category == category) return true;
  return false;
}

bool window_is_narrower(const Timeline& t) {
  return t.window_start_ms > 0 || t.window_end_ms < t.range_ms;
}

std::vector<LegendEntry> timeline_legend(const Timeline& t) {
  auto box = [](const std::string& label, std::string color, std::string note = "") {
    LegendEntry e;
    e.label = label;
    e.color = std::move(color);
    e.note = std::move(note);
    e.box = true;
    return e;
  };
  std::string shades = t.chunks > 1 ? "labels: micro-batch.chunk, later chunks lighter" : "labels: micro-batch";
  std::vector<LegendEntry> legend = {box("forward", base_color(cat::kForward), shades),
                                     box("backward", base_color(cat::kBackward))};
  if (has_category(t, cat::kBackwardWeight))
    legend.push_back(box("weight gradients (W)", base_color(cat::kBackwardWeight)));
  if (has_category(t, cat::kOptimizer)) legend.push_back(box("optimizer", base_color(cat::kOptimizer)));
  if (has_category(t, cat::kCollective)) legend.push_back(box("collective", base_color(cat::kCollective)));
  if (has_category(t, cat::kP2p)) legend.push_back(box("send/recv", base_color(cat::kP2p)));
  legend.push_back(box("idle (bubble)", "#ffffff"));
  if (window_is_narrower(t)) {
    LegendEntry window;
    window.label = "step window";
    window.color = kMutedInk;
    window.dashed = true;
    window.width = 1.2;
    legend.push_back(window);
  }
  return legend;
}

// Maps the step's milliseconds to x.
struct Axis {
  double left, width, range_ms;
  double x(double ms) const { return range_ms > 0 ? left + ms / range_ms * width : left; }
};

void render_block(const Block& b, int chunks, const Axis& axis, double y, double h, bool labelled,
                  std::string* svg) {
  double x = axis.x(b.start_ms), w = std::max(axis.x(b.end_ms) - x, 0.6);
  double tint = chunk_tint(b.chunk, chunks);
  std::string tip = b.name + " (" + b.category;
  if (b.microbatch >= 0) tip += ", mb " + std::to_string(b.microbatch) + " chunk " + std::to_string(b.chunk);
  tip += "): " + ms_text(b.start_ms) + " - " + ms_text(b.end_ms) + " ms";
  // A white edge tells neighbouring blocks apart; on a sliver it would hide the colour.
  std::string edge = w > 3 ? " stroke=\"#ffffff\" stroke-width=\"0.8\"" : "";
  *svg += "<rect class=\"" + block_class(b.category) + "\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" +
          px(w) + "\" height=\"" + px(h) + "\" fill=\"" + lighten(base_color(b.category), tint) + "\"" + edge +
          "><title>" + xml_escape(tip) + "</title></rect>\n";
  if (!labelled) return;
  std::string label = fitting_label(b, chunks, w);
  if (label.empty()) return;
  *svg += svg_text(x + w / 2, y + h / 2 + 4, label, kBlockFont, "middle", tint < 0.3 ? "#ffffff" : kInk,
                   " class=\"label\"");
}

void render_rank(const trace::RankTimeline& r, const Timeline& t, const Axis& axis, double y, bool has_comm,
                 std::string* svg) {
  *svg += svg_text(axis.left - 10, y + kRowHeight / 2 + 4.5, "rank " + std::to_string(r.rank), kLabelFont,
                   "end", kInk);
  for (const Block& b : r.compute) render_block(b, t.chunks, axis, y, kRowHeight, true, svg);
  // The frame goes on top of the blocks so that every row has the same crisp outline.
  *svg += "<rect class=\"row\" x=\"" + px(axis.left) + "\" y=\"" + px(y) + "\" width=\"" + px(axis.width) +
          "\" height=\"" + px(kRowHeight) + "\" fill=\"none\" stroke=\"" + kFrameInk +
          "\" stroke-width=\"0.8\"/>\n";
  if (has_comm) {
    double cy = y + kRowHeight + kCommGap;
    *svg += svg_text(axis.left - 10, cy + kCommHeight - 0.5, "comm", kSmallFont, "end", kMutedInk);
    for (const Block& b : r.comm) render_block(b, 1, axis, cy, kCommHeight, false, svg);
    *svg += "<rect class=\"comm-row\" x=\"" + px(axis.left) + "\" y=\"" + px(cy) + "\" width=\"" +
            px(axis.width) + "\" height=\"" + px(kCommHeight) + "\" fill=\"none\" stroke=\"" + kGridInk + "\"/>\n";
  }
  double window = t.window_ms();
  if (window > 0) {
    std::string busy = "busy " + std::to_string(static_cast<int>(std::lround(100 * r.busy_ms / window))) + "%";
    *svg += svg_text(axis.left + axis.width + 10, y + kRowHeight / 2 + 4.5, busy, kTickFont, "start", kMutedInk);
  }
}

// Grid lines and tick labels in ms under the rows, and the dashed step window when the
// drawn range is wider than it (optimizer or whole-step spans).
void render_time_axis(const Timeline& t, const Axis& axis, double top, double bottom, std::string* svg) {
  int max_ticks = std::clamp(static_cast<int>(axis.width / 90), 4, 16);
  Ticks ticks = nice_ticks(0, t.range_ms, max_ticks);
  for (double v : ticks.values) {
    if (v < 0 || v > t.range_ms * (1 + 1e-9)) continue;
    double x = axis.x(v);
    *svg += "<line x1=\"" + px(x) + "\" y1=\"" + px(top) + "\" x2=\"" + px(x) + "\" y2=\"" + px(bottom + 4) +
            "\" stroke=\"" + kGridInk + "\"/>\n";
    *svg += svg_text(x, bottom + 18, format_tick(v, ticks), kTickFont, "middle", kInk);
  }
  *svg += svg_text(axis.left + axis.width / 2, bottom + 38, "time in step (ms)", kLabelFont, "middle", kInk);
  if (!window_is_narrower(t)) return;
  for (double ms : {t.window_start_ms, t.window_end_ms}) {
    double x = axis.x(ms);
    *svg += "<line class=\"window\" x1=\"" + px(x) + "\" y1=\"" + px(top - 4) + "\" x2=\"" + px(x) + "\" y2=\"" +
            px(bottom + 4) + "\" stroke=\"" + kMutedInk + "\" stroke-width=\"1.2\" stroke-dasharray=\"5 4\"/>\n";
  }
}

}  // namespace

std::string render_timeline_svg(const Timeline& t, const std::string& note) {
  bool has_comm = false;
  for (const auto& rank : t.ranks) has_comm |= !rank.comm.empty();
  double lane_height = kRowHeight + (has_comm ? kCommGap + kCommHeight : 0);
  Axis axis{kPad + kLeft, plot_width(t), t.range_ms};
  double width = axis.left + axis.width + kRight + kPad;

  std::string legend;
  double rows_top =
      render_legend(timeline_legend(t), kPad + 8, kPad + kHeaderHeight, width - 2 * kPad - 16, &legend) + 14;
  double n = static_cast<double>(t.ranks.size());
  double rows_bottom = rows_top + n * lane_height + std::max(0.0, n - 1) * kRankGap;
  double height = rows_bottom + kAxisHeight + kPad;

  std::string svg = svg_open(width, height);
  char title[128];
  std::snprintf(title, sizeof title, "Pipeline timeline, step %d: measured bubble %.1f%%", t.step,
                100 * t.bubble_fraction);
  svg += svg_text(kPad + 8, kPad + 24, title, kTitleFont, "start", kInk, " font-weight=\"bold\"");
  std::string subtitle = std::to_string(t.ranks.size()) + " ranks \u00b7 step window " + ms_text(t.window_ms()) +
                         " ms \u00b7 bubble = idle time in the window / (ranks \u00d7 window)";
  if (!note.empty()) subtitle += " \u00b7 " + note;
  svg += svg_text(kPad + 8, kPad + 46, subtitle, kSubtitleFont, "start", kMutedInk);
  svg += legend;
  render_time_axis(t, axis, rows_top, rows_bottom, &svg);
  for (size_t i = 0; i < t.ranks.size(); ++i)
    render_rank(t.ranks[i], t, axis, rows_top + static_cast<double>(i) * (lane_height + kRankGap), has_comm, &svg);
  svg += "</svg>\n";
  return svg;
}

}  // namespace meshtrain::plot
