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

}  // namespace meshtrain::plot
