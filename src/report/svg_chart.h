// A line chart as inline SVG: one job, no knowledge of runs or metrics. Axes with 1-2-5 ticks and
// labels, one <path class="curve"> per series, optional point markers, and a legend of the
// series that name themselves.
#pragma once
#include <string>
#include <vector>

namespace zof::report {

struct Series {
  std::string name;           // what the curve is (its data-series attribute), e.g. "run1 loss ema"
  std::string label;          // legend entry; empty: not in the legend (e.g. raw under a smoothed curve)
  std::string colour;         // CSS colour
  std::vector<double> x, y;   // the points, in order; non-finite y are left out
  double width = 2.0;         // stroke width
  double opacity = 1.0;
  bool markers = false;       // a dot on every point (sparse series such as evaluations)
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

// Where a chart's data lands: the axis ranges after rounding to ticks, and the plot area in
// SVG pixels. Exposed so that a test can map a drawn path back to data.
struct ChartFrame {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // data range of the axes
  double left = 0, top = 0, right = 0, bottom = 0;  // plot area (px)
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (right - left); }
  double py(double y) const { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
};

// The frame chart would be drawn in at width x height pixels.
ChartFrame chart_frame(const Chart& chart, int width, int height);

// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target);

// The chart as one <svg> element.
std::string svg_line_chart(const Chart& chart, int width = 560, int height = 330);

// Text safe inside XML/HTML elements and attributes.
std::string xml_escape(const std::string& s);

}  // namespace zof::report
