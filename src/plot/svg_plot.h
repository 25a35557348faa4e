// A small, dependency-free line-chart builder that renders a grid of panels to one
// self-contained SVG document (no scripts, no external fonts or images), so a plot can be
// opened anywhere or turned into a PNG by rsvg-convert. It knows nothing about training
// runs; run_plot.h maps metrics onto it.
#pragma once
#include <string>
#include <vector>

namespace meshtrain::plot {

// Axis ticks at multiples of one "nice" step (1, 2 or 5 times a power of ten). The first
// tick is <= the range's low end and the last >= its high end, so the ticks can serve as
// the axis limits themselves.
struct Ticks {
  std::vector<double> values;
  double step = 1;
};

// At most `max_ticks` ticks covering [lo, hi] (in either order). A zero-width range (one
// point, a constant series) is widened around its value; non-finite input gives 0..1.
Ticks nice_ticks(double lo, double hi, int max_ticks = 6);

// How tick values print on one axis: a shared SI suffix (k, M, G, T) for large values,
// an exponent for tiny ones, and just enough decimals to tell neighbouring ticks apart.
std::string format_tick(double value, const Ticks& ticks);

// Escapes the five XML special characters so run names can go into text and attributes.
std::string xml_escape(const std::string& text);

struct Series {
  std::vector<double> x, y;  // same length; non-finite points are skipped
  std::string color = "#1f77b4";
  double width = 1.8;      // stroke width in px
  double opacity = 1.0;    // stroke opacity (light background curves use < 1)
  bool dashed = false;
  bool markers = false;    // a dot at every point
};

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool y_from_zero = false;  // include 0 in the y range (throughput, memory)
};

// One entry of the figure legend: a swatch in the series' style and a label. Entries with
// `muted` render in grey, for style keys ("train", "val") rather than runs.
struct LegendEntry {
  std::string label;
  std::string color = "#1f77b4";
  bool dashed = false;
  bool markers = false;
  bool muted = false;
  std::string note;  // optional grey text after the label (e.g. a run's configuration)
  double opacity = 1.0, width = 2.4;  // of the swatch line
  bool row_break = false;  // start a new legend row here (runs above, style keys below)
  bool box = false;        // a filled box swatch (timeline blocks) instead of a line
};

struct Figure {
  std::string title;
  std::vector<LegendEntry> legend;  // drawn once, above the panels
  std::vector<Panel> panels;        // laid out row by row
  int columns = 2;
  double panel_width = 560, panel_height = 360;
};

// The whole figure as an SVG document (starts with "<svg", ends with "</svg>\n"). Every
// series with at least one finite point is exactly one <polyline>; markers are <circle>s.
std::string render_svg(const Figure& figure);

// ---- The pieces render_svg is made of, shared with the other figures (timeline_svg.h) ----

inline constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";
inline constexpr const char* kInk = "#222222";
inline constexpr const char* kMutedInk = "#666666";
inline constexpr const char* kGridInk = "#e6e6e6";
inline constexpr const char* kFrameInk = "#9a9a9a";
// Sizes in px; fonts suit a figure about 1200 px wide.
inline constexpr double kPad = 18;  // around the whole figure
inline constexpr double kTitleFont = 19, kLabelFont = 13, kTickFont = 12;

// A coordinate with at most two decimals ("12.5", "3").
std::string px(double v);
// A rough, generous estimate of the rendered width of `text`, for layout.
double text_width(const std::string& text, double font_size);
// A <text> element; `body` is escaped, `extra` is raw attributes (with a leading space).
std::string svg_text(double x, double y, const std::string& body, double size, const char* anchor,
                     const char* color, const std::string& extra = "");
// The opening <svg> tag of a width x height document, with the font and a white background.
std::string svg_open(double width, double height);
// Legend entries flowed left to right from (x0, y0), wrapping at max_width; returns the y
// below the last row (y0 when there are none).
double render_legend(const std::vector<LegendEntry>& legend, double x0, double y0, double max_width,
                     std::string* svg);

}  // namespace meshtrain::plot
