// train/io/svg.cpp — the loss chart (train/io/svg.h).
#include "train/io/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ffn::train {

namespace {

std::string xml_escape(const std::string& t) {
  std::string out;
  for (char c : t) {
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

// A "nice" tick step (1, 2 or 5 × 10^k) giving about `n` intervals over `range`.
double nice_step(double range, int n) {
  const double raw = range / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

}  // namespace

// Axes from the first point on: a single point or a flat curve gets a small range around it;
// ticks fall on nice values with as many decimals as their step needs; text is escaped.
void write_loss_svg(const std::string& path, const std::vector<Curve>& curves,
                    const std::string& title) {
  const double W = 720, H = 420, L = 60, R = 20, T = 40, B = 50;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Curve& c : curves)
    for (auto [x, y] : c.points)
      if (std::isfinite(y)) {
        x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
      }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 - x0 < 1) x1 = x0 + 1;
  if (y1 - y0 < 1e-6 * std::max(1.0, std::fabs(y0))) {
    const double half = std::max(0.05 * std::fabs(y0), 1e-3);
    y0 -= half, y1 += half;
  }
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  const double ystep = nice_step(y1 - y0, 5), xstep = std::max(1.0, nice_step(x1 - x0, 6));
  const int ydec = std::max(0, static_cast<int>(std::ceil(-std::log10(ystep) - 1e-9)));
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  char buf[64];
  for (double yv = std::ceil(y0 / ystep) * ystep; yv <= y1 + 1e-9 * ystep; yv += ystep) {
    s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << py(yv) << "\" y2=\""
      << py(yv) << "\" stroke=\"#e5e5e5\"/>\n";
    std::snprintf(buf, sizeof(buf), "%.*f", ydec, std::fabs(yv) < 1e-12 ? 0.0 : yv);
    s << "<text x=\"" << L - 6 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\">" << buf
      << "</text>\n";
  }
  for (double xv = std::ceil(x0 / xstep) * xstep; xv <= x1 + 1e-9; xv += xstep) {
    std::snprintf(buf, sizeof(buf), "%.0f", xv);
    s << "<text x=\"" << px(xv) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << buf
      << "</text>\n";
  }
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
    << H - T - B << "\" fill=\"none\" stroke=\"#888\"/>\n"
    << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 10
    << "\" text-anchor=\"middle\">iteration</text>\n"
    << "<text x=\"16\" y=\"" << (T + H - B) / 2 << "\" transform=\"rotate(-90 16 " << (T + H - B) / 2
    << ")\" text-anchor=\"middle\">loss</text>\n";
  int li = 0;
  for (const Curve& c : curves) {
    s << "<polyline fill=\"none\" stroke=\"" << xml_escape(c.color) << "\" stroke-width=\"1.5\" points=\"";
    for (auto [x, y] : c.points)
      if (std::isfinite(y)) s << px(x) << "," << py(y) << " ";
    s << "\"/>\n";
    if (c.points.size() == 1 && std::isfinite(c.points[0].second))
      s << "<circle cx=\"" << px(c.points[0].first) << "\" cy=\"" << py(c.points[0].second)
        << "\" r=\"3\" fill=\"" << c.color << "\"/>\n";
    const double ly = T + 14 + 16 * li++;
    s << "<line x1=\"" << W - R - 120 << "\" x2=\"" << W - R - 100 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << c.color << "\" stroke-width=\"2\"/>\n"
      << "<text x=\"" << W - R - 94 << "\" y=\"" << ly << "\">" << xml_escape(c.name)
      << "</text>\n";
  }
  s << "</svg>\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    FFN_CHECK(out.good(), "[metrics] cannot write '", tmp, "'");
    out << s.str();
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace ffn::train
