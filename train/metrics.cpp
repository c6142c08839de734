// train/metrics.cpp — metrics.jsonl, the loss-curve SVG and display helpers.
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace ffn::train {

MetricsLog::MetricsLog(const std::string& path) : out_(path, std::ios::app) {
  FFN_CHECK(out_.good(), "[metrics] cannot open '", path, "' for appending");
}

void MetricsLog::write(const std::vector<std::pair<std::string, std::string>>& fields) {
  out_ << "{";
  for (size_t i = 0; i < fields.size(); ++i)
    out_ << (i ? ", " : "") << "\"" << fields[i].first << "\": " << fields[i].second;
  out_ << "}\n";
  out_.flush();
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(t));
  return buf;
}

std::string format_count(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

double peak_flops(const std::string& name, bool half) {
  // Dense tensor-core peaks (bf16/fp16) and non-tensor fp32 peaks of common parts.
  struct Part {
    const char* key;
    double half, single;
  };
  static const Part parts[] = {{"H200", 989e12, 67e12}, {"H100 PCIe", 756e12, 51e12},
                               {"H100", 989e12, 67e12}, {"A100", 312e12, 19.5e12},
                               {"L40S", 362e12, 91.6e12}, {"A10", 125e12, 31.2e12}};
  for (const Part& p : parts)
    if (name.find(p.key) != std::string::npos) return half ? p.half : p.single;
  return 0.0;
}

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
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1e-3;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">" << title
    << "</text>\n";
  char buf[64];
  for (int i = 0; i <= 5; ++i) {  // grid and tick labels
    const double yv = y0 + (y1 - y0) * i / 5, xv = x0 + (x1 - x0) * i / 5;
    s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << py(yv) << "\" y2=\"" << py(yv)
      << "\" stroke=\"#e5e5e5\"/>\n";
    std::snprintf(buf, sizeof(buf), "%.3g", yv);
    s << "<text x=\"" << L - 6 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\">" << buf
      << "</text>\n";
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
    s << "<polyline fill=\"none\" stroke=\"" << c.color << "\" stroke-width=\"1.5\" points=\"";
    for (auto [x, y] : c.points)
      if (std::isfinite(y)) s << px(x) << "," << py(y) << " ";
    s << "\"/>\n";
    if (c.points.size() == 1 && std::isfinite(c.points[0].second))
      s << "<circle cx=\"" << px(c.points[0].first) << "\" cy=\"" << py(c.points[0].second)
        << "\" r=\"3\" fill=\"" << c.color << "\"/>\n";
    const double ly = T + 14 + 16 * li++;
    s << "<line x1=\"" << W - R - 120 << "\" x2=\"" << W - R - 100 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << c.color << "\" stroke-width=\"2\"/>\n"
      << "<text x=\"" << W - R - 94 << "\" y=\"" << ly << "\">" << c.name << "</text>\n";
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
