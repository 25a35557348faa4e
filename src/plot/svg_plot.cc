#include "plot/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>

namespace meshtrain::plot {
namespace {

// ---- Layout constants (px). Fonts are sized for a ~1200 px wide figure. ----
constexpr double kGap = 14;             // between panels
constexpr double kTitleHeight = 40;
constexpr double kLegendRow = 24;
constexpr double kLegendSwatch = 30;
constexpr double kPlotLeft = 74, kPlotRight = 22, kPlotTop = 38, kPlotBottom = 52;
constexpr double kPanelTitleFont = 15, kLegendFont = 13, kNoteFont = 12;
// More markers than this merge into a band that hides the lines; the dashed line alone
// then reads better.
constexpr size_t kMaxMarkers = 120;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// Maps data to pixels inside one panel's plot area (y grows downward in SVG).
struct Frame {
  double left, top, width, height;
  Ticks xt, yt;
  double x_px(double x) const {
    return left + (x - xt.values.front()) / (xt.values.back() - xt.values.front()) * width;
  }
  double y_px(double y) const {
    return top + height - (y - yt.values.front()) / (yt.values.back() - yt.values.front()) * height;
  }
};

// Finite min/max over all series of a panel; false when there is no finite point.
bool data_range(const Panel& panel, bool want_x, double* lo, double* hi) {
  *lo = std::numeric_limits<double>::infinity();
  *hi = -*lo;
  for (const Series& s : panel.series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); i++) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      double v = want_x ? s.x[i] : s.y[i];
      *lo = std::min(*lo, v);
      *hi = std::max(*hi, v);
    }
  }
  return *lo <= *hi;
}

// The finite points of a series in pixels, thinned to at most four per pixel column
// (first, lowest, highest, last), which draws the same line as all of them: a long run
// would otherwise make a multi-megabyte SVG that looks no different.
std::vector<std::pair<double, double>> series_pixels(const Series& s, const Frame& f) {
  std::vector<std::pair<double, double>> all;
  for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); i++)
    if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) all.emplace_back(f.x_px(s.x[i]), f.y_px(s.y[i]));
  if (all.size() <= 4 * static_cast<size_t>(f.width)) return all;
  std::vector<std::pair<double, double>> out;
  size_t begin = 0;
  while (begin < all.size()) {
    size_t end = begin;
    double column = std::floor(all[begin].first);
    while (end < all.size() && std::floor(all[end].first) == column) end++;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; i++) {
      if (all[i].second < all[lo].second) lo = i;
      if (all[i].second > all[hi].second) hi = i;
    }
    std::vector<size_t> keep = {begin, lo, hi, end - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (size_t i : keep) out.push_back(all[i]);
    begin = end;
  }
  return out;
}

std::string stroke_attrs(const std::string& color, double width, double opacity, bool dashed) {
  std::string a = " fill=\"none\" stroke=\"" + xml_escape(color) + "\" stroke-width=\"" + px(width) +
                  "\" stroke-linejoin=\"round\" stroke-linecap=\"round\"";
  if (opacity < 1) a += " stroke-opacity=\"" + px(opacity) + "\"";
  if (dashed) a += " stroke-dasharray=\"7 5\"";
  return a;
}

std::string marker(double x, double y, const std::string& color) {
  return "<circle cx=\"" + px(x) + "\" cy=\"" + px(y) + "\" r=\"3.3\" fill=\"" + xml_escape(color) +
         "\" stroke=\"#ffffff\" stroke-width=\"1\"/>\n";
}

void render_series(const Series& s, const Frame& f, std::string* svg) {
  auto points = series_pixels(s, f);
  if (points.empty()) return;
  std::string list;
  for (auto [x, y] : points) {
    if (!list.empty()) list += ' ';
    list += px(x);
    list += ',';
    list += px(y);
  }
  *svg += "<polyline points=\"" + list + "\"" + stroke_attrs(s.color, s.width, s.opacity, s.dashed) + "/>\n";
  // A lone point draws no line, so it always gets a dot.
  if ((s.markers && points.size() <= kMaxMarkers) || points.size() == 1)
    for (auto [x, y] : points) *svg += marker(x, y, s.color);
}

void render_grid_and_ticks(const Frame& f, std::string* svg) {
  for (double v : f.xt.values) {
    double x = f.x_px(v);
    *svg += "<line x1=\"" + px(x) + "\" y1=\"" + px(f.top) + "\" x2=\"" + px(x) + "\" y2=\"" +
            px(f.top + f.height) + "\" stroke=\"" + kGridInk + "\"/>\n";
    *svg += svg_text(x, f.top + f.height + 17, format_tick(v, f.xt), kTickFont, "middle", kInk);
  }
  for (double v : f.yt.values) {
    double y = f.y_px(v);
    *svg += "<line x1=\"" + px(f.left) + "\" y1=\"" + px(y) + "\" x2=\"" + px(f.left + f.width) +
            "\" y2=\"" + px(y) + "\" stroke=\"" + kGridInk + "\"/>\n";
    *svg += svg_text(f.left - 7, y + 4.2, format_tick(v, f.yt), kTickFont, "end", kInk);
  }
  *svg += "<rect x=\"" + px(f.left) + "\" y=\"" + px(f.top) + "\" width=\"" + px(f.width) +
          "\" height=\"" + px(f.height) + "\" fill=\"none\" stroke=\"" + kFrameInk + "\"/>\n";
}

void render_panel(const Panel& panel, double x0, double y0, double w, double h, int id,
                  std::string* svg) {
  Frame f{x0 + kPlotLeft, y0 + kPlotTop, w - kPlotLeft - kPlotRight, h - kPlotTop - kPlotBottom, {}, {}};
  double xlo, xhi, ylo, yhi;
  bool has_data = data_range(panel, true, &xlo, &xhi) && data_range(panel, false, &ylo, &yhi);
  if (!has_data) xlo = ylo = 0, xhi = yhi = 1;
  if (panel.y_from_zero) ylo = std::min(ylo, 0.0), yhi = std::max(yhi, 0.0);
  // A little headroom so flat lines and extremes do not sit on the frame; it never
  // crosses zero, which would add a meaningless negative tick to a positive quantity.
  double pad = 0.04 * (yhi - ylo);
  ylo = ylo >= 0 ? std::max(0.0, ylo - pad) : ylo - pad;
  yhi = yhi <= 0 ? std::min(0.0, yhi + pad) : yhi + pad;
  f.xt = nice_ticks(xlo, xhi, 7);
  f.yt = nice_ticks(ylo, yhi, 6);

  *svg += "<g>\n";
  *svg += svg_text(x0 + w / 2, y0 + 22, panel.title, kPanelTitleFont, "middle", kInk, " font-weight=\"bold\"");
  render_grid_and_ticks(f, svg);
  *svg += svg_text(f.left + f.width / 2, y0 + h - 10, panel.x_label, kLabelFont, "middle", kInk);
  double ly = f.top + f.height / 2, lx = x0 + 16;
  *svg += svg_text(lx, ly, panel.y_label, kLabelFont, "middle", kInk,
                   " transform=\"rotate(-90 " + px(lx) + " " + px(ly) + ")\"");
  if (!has_data)
    *svg += svg_text(f.left + f.width / 2, f.top + f.height / 2, "no data", kLabelFont, "middle", kMutedInk);
  // Lines stay inside the plot area even where a marker or stroke would poke out.
  std::string clip = "clip" + std::to_string(id);
  *svg += "<clipPath id=\"" + clip + "\"><rect x=\"" + px(f.left - 4) + "\" y=\"" + px(f.top - 4) +
          "\" width=\"" + px(f.width + 8) + "\" height=\"" + px(f.height + 8) + "\"/></clipPath>\n";
  *svg += "<g clip-path=\"url(#" + clip + ")\">\n";
  for (const Series& s : panel.series) render_series(s, f, svg);
  *svg += "</g>\n</g>\n";
}

struct LegendItem {
  const LegendEntry* entry;
  double x, y, width;
};

// Flows legend entries left to right, wrapping to a new row when the figure is full.
std::vector<LegendItem> layout_legend(const std::vector<LegendEntry>& legend, double x0, double y0,
                                      double max_width) {
  std::vector<LegendItem> items;
  double x = x0, y = y0;
  for (const LegendEntry& e : legend) {
    double w = kLegendSwatch + 8 + text_width(e.label, kLegendFont) + 26;
    if (!e.note.empty()) w += 8 + text_width(e.note, kNoteFont);
    if (x > x0 && (e.row_break || x + w > x0 + max_width)) x = x0, y += kLegendRow;
    items.push_back({&e, x, y, w});
    x += w;
  }
  return items;
}

void render_legend_item(const LegendItem& item, std::string* svg) {
  const LegendEntry& e = *item.entry;
  double mid = item.y + kLegendRow / 2;
  if (e.box) {
    *svg += "<rect x=\"" + px(item.x + 4) + "\" y=\"" + px(mid - 7) + "\" width=\"" + px(kLegendSwatch - 8) +
            "\" height=\"14\" fill=\"" + xml_escape(e.color) + "\" stroke=\"" + kFrameInk +
            "\" stroke-width=\"0.6\"/>\n";
  } else {
    *svg += "<line x1=\"" + px(item.x) + "\" y1=\"" + px(mid) + "\" x2=\"" + px(item.x + kLegendSwatch) +
            "\" y2=\"" + px(mid) + "\"" + stroke_attrs(e.color, e.width, e.opacity, e.dashed) + "/>\n";
  }
  if (e.markers) *svg += marker(item.x + kLegendSwatch / 2, mid, e.color);
  // The note is a <tspan> so the renderer, which knows the font, places it after the label.
  std::string body = xml_escape(e.label);
  if (!e.note.empty())
    body += "<tspan dx=\"8\" font-size=\"" + px(kNoteFont) + "\" fill=\"" + kMutedInk + "\">" +
            xml_escape(e.note) + "</tspan>";
  *svg += "<text x=\"" + px(item.x + kLegendSwatch + 8) + "\" y=\"" + px(mid + 4.5) + "\" font-size=\"" +
          px(kLegendFont) + "\" fill=\"" + (e.muted ? kMutedInk : kInk) + "\">" + body + "</text>\n";
}

}  // namespace

Ticks nice_ticks(double lo, double hi, int max_ticks) {
  // Non-finite ends (or a span that overflows) have no sensible ticks; 0..1 keeps the
  // step search below finite.
  if (!std::isfinite(hi - lo)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  max_ticks = std::max(max_ticks, 2);
  // A zero range has no scale of its own: widen it by 10% of the value (or 1 at zero).
  double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  if (hi - lo <= 1e-12 * magnitude || hi == lo) {
    double pad = magnitude > 0 ? 0.1 * magnitude : 1.0;
    lo -= pad, hi += pad;
  }
  // The step must be at least span / (max_ticks - 1); try 1-2-5 multiples upward from the
  // power of ten below that until the outward-rounded ticks fit.
  double min_step = (hi - lo) / (max_ticks - 1);
  double decade = std::pow(10.0, std::floor(std::log10(min_step)));
  for (int k = 0;; k++) {
    for (double mult : {1.0, 2.0, 5.0}) {
      double step = mult * decade * std::pow(10.0, k);
      double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
      if (last - first + 1 > max_ticks) continue;
      Ticks t;
      t.step = step;
      for (double i = first; i <= last; i++) t.values.push_back(std::fabs(i) < 0.5 ? 0.0 : i * step);
      return t;
    }
  }
}

std::string format_tick(double value, const Ticks& ticks) {
  double mag = 0;
  for (double v : ticks.values) mag = std::max(mag, std::fabs(v));
  if (std::fabs(value) < 1e-9 * ticks.step) return "0";
  if (mag < 1e-3) {
    // Tiny values (learning rates): a shared exponent, "2e-4" rather than "0.0002".
    int e = static_cast<int>(std::floor(std::log10(mag)));
    int decimals = std::max(0, e - static_cast<int>(std::floor(std::log10(ticks.step) + 1e-9)));
    return format("%.*fe%d", decimals, value / std::pow(10.0, e), e);
  }
  double scale = 1;
  const char* suffix = "";
  if (mag >= 1e4) {
    static const char* kSuffixes[] = {"k", "M", "G", "T"};
    int group = std::min(4, static_cast<int>(std::floor(std::log10(mag) / 3)));
    scale = std::pow(1000.0, group);
    suffix = kSuffixes[group - 1];
  }
  int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(ticks.step / scale) + 1e-9)));
  return format("%.*f%s", decimals, value / scale, suffix);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// Two decimals: enough for sub-pixel placement, short in the file.
std::string px(double v) {
  std::string s = format("%.2f", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// DejaVu Sans averages ~0.55 em per character; erring wide keeps labels from colliding.
double text_width(const std::string& text, double font_size) {
  return 0.57 * font_size * static_cast<double>(text.size());
}

std::string svg_text(double x, double y, const std::string& body, double size, const char* anchor,
                     const char* color, const std::string& extra) {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) +
         "\" text-anchor=\"" + anchor + "\" fill=\"" + color + "\"" + extra + ">" + xml_escape(body) +
         "</text>\n";
}

std::string svg_open(double width, double height) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) + "\" font-family=\"" + kFont + "\">\n" +
         "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
}

double render_legend(const std::vector<LegendEntry>& legend, double x0, double y0, double max_width,
                     std::string* svg) {
  auto items = layout_legend(legend, x0, y0, max_width);
  for (const LegendItem& item : items) render_legend_item(item, svg);
  return items.empty() ? y0 : items.back().y + kLegendRow;
}

std::string render_svg(const Figure& figure) {
  int columns = std::max(1, figure.columns);
  int rows = (static_cast<int>(figure.panels.size()) + columns - 1) / columns;
  double width = 2 * kPad + columns * figure.panel_width + (columns - 1) * kGap;
  double y = kPad + (figure.title.empty() ? 0 : kTitleHeight);
  // The legend's height decides the document's, so it is drawn before the header exists.
  std::string body;
  double legend_end = render_legend(figure.legend, kPad + 8, y, width - 2 * kPad - 16, &body);
  if (!figure.legend.empty()) y = legend_end + 10;
  double height = y + rows * figure.panel_height + std::max(0, rows - 1) * kGap + kPad;

  std::string svg = svg_open(width, height);
  if (!figure.title.empty())
    svg += svg_text(kPad + 8, kPad + 24, figure.title, kTitleFont, "start", kInk, " font-weight=\"bold\"");
  svg += body;
  for (size_t i = 0; i < figure.panels.size(); i++) {
    double px0 = kPad + (i % columns) * (figure.panel_width + kGap);
    double py0 = y + (i / columns) * (figure.panel_height + kGap);
    render_panel(figure.panels[i], px0, py0, figure.panel_width, figure.panel_height, static_cast<int>(i),
                 &svg);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace meshtrain::plot
