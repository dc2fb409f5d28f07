// The SVG line chart (svg_chart.h): frame, ticks, curves, legend.
#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace zof::report {
namespace {

constexpr double kCharWidth = 6.6;  // px per character of the 11px legend font (approximate)
constexpr double kLegendRow = 16;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A tick's label: plain for ordinary numbers, k/M/G for large ones (tokens, bytes).
std::string tick_label(double v, double scale) {
  if (std::fabs(v) < 1e-12 * std::max(scale, 1e-300)) v = 0;
  const char* suffix = scale >= 1e9 ? "G" : scale >= 1e6 ? "M" : scale >= 1e4 ? "k" : "";
  const double div = scale >= 1e9 ? 1e9 : scale >= 1e6 ? 1e6 : scale >= 1e4 ? 1e3 : 1;
  return fmt("%.6g", v / div) + suffix;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // An empty or single-valued range widened so that ticks exist.
  void settle() {
    if (!std::isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
      const double pad = std::fabs(hi) > 0 ? std::fabs(hi) * 0.05 : 1;
      lo -= pad;
      hi += pad;
    }
  }
};

// The legend's entries in rows that fit the width: (series index, x offset, row).
struct LegendSlot {
  size_t series;
  double x;
  int row;
};
std::vector<LegendSlot> legend_layout(const Chart& c, double width) {
  std::vector<LegendSlot> out;
  double x = 0;
  int row = 0;
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].label.empty()) continue;
    const double w = 22 + kCharWidth * (double)c.series[i].label.size() + 14;
    if (x > 0 && x + w > width) x = 0, ++row;
    out.push_back({i, x, row});
    x += w;
  }
  return out;
}

int legend_rows(const Chart& c, double width) {
  const auto slots = legend_layout(c, width);
  return slots.empty() ? 0 : slots.back().row + 1;
}

std::string axes(const Chart& c, const ChartFrame& f, int height) {
  std::string s;
  const auto xt = nice_ticks(f.x0, f.x1, 6), yt = nice_ticks(f.y0, f.y1, 6);
  const double xs = std::max(std::fabs(f.x0), std::fabs(f.x1));
  const double ys = std::max(std::fabs(f.y0), std::fabs(f.y1));
  for (double t : yt) {
    const std::string y = fmt("%.2f", f.py(t));
    s += "<line class=\"grid\" x1=\"" + fmt("%.2f", f.left) + "\" x2=\"" + fmt("%.2f", f.right) +
         "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
    s += "<text class=\"tick\" x=\"" + fmt("%.2f", f.left - 6) + "\" y=\"" + y +
         "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + tick_label(t, ys) + "</text>";
  }
  for (double t : xt) {
    const std::string x = fmt("%.2f", f.px(t));
    s += "<line class=\"grid\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fmt("%.2f", f.top) +
         "\" y2=\"" + fmt("%.2f", f.bottom) + "\"/>";
    s += "<text class=\"tick\" x=\"" + x + "\" y=\"" + fmt("%.2f", f.bottom + 16) +
         "\" text-anchor=\"middle\">" + tick_label(t, xs) + "</text>";
  }
  s += "<rect class=\"frame\" x=\"" + fmt("%.2f", f.left) + "\" y=\"" + fmt("%.2f", f.top) +
       "\" width=\"" + fmt("%.2f", f.right - f.left) + "\" height=\"" +
       fmt("%.2f", f.bottom - f.top) + "\"/>";
  s += "<text class=\"axis-label\" x=\"" + fmt("%.2f", (f.left + f.right) / 2) + "\" y=\"" +
       fmt("%.2f", (double)height - 6) + "\" text-anchor=\"middle\">" + xml_escape(c.x_label) +
       "</text>";
  s += "<text class=\"axis-label\" transform=\"translate(14," + fmt("%.2f", (f.top + f.bottom) / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(c.y_label) + "</text>";
  return s;
}

std::string curve(const Series& sr, const ChartFrame& f) {
  std::string d, dots;
  bool pen_down = false;
  for (size_t i = 0; i < sr.x.size() && i < sr.y.size(); ++i) {
    if (!std::isfinite(sr.x[i]) || !std::isfinite(sr.y[i])) {
      pen_down = false;  // a gap where a step's loss was not finite
      continue;
    }
    const std::string x = fmt("%.2f", f.px(sr.x[i])), y = fmt("%.2f", f.py(sr.y[i]));
    d += (pen_down ? " L" : (d.empty() ? "M" : " M")) + x + " " + y;
    pen_down = true;
    if (sr.markers)
      dots += "<circle class=\"marker\" cx=\"" + x + "\" cy=\"" + y + "\" r=\"3\" fill=\"" +
              xml_escape(sr.colour) + "\"/>";
  }
  return "<path class=\"curve\" data-series=\"" + xml_escape(sr.name) + "\" d=\"" + d +
         "\" fill=\"none\" stroke=\"" + xml_escape(sr.colour) + "\" stroke-width=\"" +
         fmt("%.2g", sr.width) + "\" stroke-opacity=\"" + fmt("%.2g", sr.opacity) +
         "\" stroke-linejoin=\"round\"/>" + dots;
}

std::string legend(const Chart& c, const ChartFrame& f) {
  std::string s = "<g class=\"legend\">";
  for (const LegendSlot& l : legend_layout(c, f.right - f.left)) {
    const Series& sr = c.series[l.series];
    const double x = f.left + l.x, y = 30 + kLegendRow * l.row;
    s += "<line x1=\"" + fmt("%.2f", x) + "\" x2=\"" + fmt("%.2f", x + 18) + "\" y1=\"" +
         fmt("%.2f", y) + "\" y2=\"" + fmt("%.2f", y) + "\" stroke=\"" + xml_escape(sr.colour) +
         "\" stroke-width=\"" + fmt("%.2g", std::max(sr.width, 2.0)) + "\" stroke-opacity=\"" +
         fmt("%.2g", sr.opacity) + "\"/>";
    s += "<text class=\"legend-label\" x=\"" + fmt("%.2f", x + 22) + "\" y=\"" + fmt("%.2f", y) +
         "\" dominant-baseline=\"middle\">" + xml_escape(sr.label) + "</text>";
  }
  return s + "</g>";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  const double step = (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

ChartFrame chart_frame(const Chart& c, int width, int height) {
  Range xr, yr;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i])) xr.add(s.x[i]), yr.add(s.y[i]);
  xr.settle();
  yr.settle();
  ChartFrame f;
  f.left = 66;
  f.right = width - 16;
  f.top = 30 + kLegendRow * legend_rows(c, f.right - f.left) + 4;
  f.bottom = height - 42;
  // The axes end on ticks, so the outermost grid lines frame the data.
  const auto xt = nice_ticks(xr.lo, xr.hi, 6), yt = nice_ticks(yr.lo, yr.hi, 6);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  f.x0 = std::floor(xr.lo / xstep + 1e-9) * xstep;
  f.x1 = std::ceil(xr.hi / xstep - 1e-9) * xstep;
  f.y0 = std::floor(yr.lo / ystep + 1e-9) * ystep;
  f.y1 = std::ceil(yr.hi / ystep - 1e-9) * ystep;
  if (!(f.x1 > f.x0)) f.x1 = f.x0 + xstep;
  if (!(f.y1 > f.y0)) f.y1 = f.y0 + ystep;
  return f;
}

std::string svg_line_chart(const Chart& c, int width, int height) {
  const ChartFrame f = chart_frame(c, width, height);
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" +
                  std::to_string(width) + "\" height=\"" + std::to_string(height) +
                  "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
                  "\" role=\"img\">";
  s += "<title>" + xml_escape(c.title) + "</title>";
  s += "<text class=\"chart-title\" x=\"" + fmt("%.2f", f.left) + "\" y=\"16\">" +
       xml_escape(c.title) + "</text>";
  s += axes(c, f, height);
  s += "<g class=\"curves\">";
  for (const Series& sr : c.series) s += curve(sr, f);
  s += "</g>";
  s += legend(c, f);
  return s + "</svg>";
}

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += ch;
    }
  }
  return o;
}

}  // namespace zof::report
