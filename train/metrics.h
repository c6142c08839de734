// train/metrics.h — what a run leaves for people: metrics.jsonl (one JSON object per
// line, `iter` plus train_loss or val_loss and friends), loss.svg (train and val curves,
// redrawn at every eval), and the one-line progress display with ETA.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ffn::train {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsLog(const std::string& path);
  // fields: key → already-formatted JSON value.
  void write(const std::vector<std::pair<std::string, std::string>>& fields);

 private:
  std::ofstream out_;
};

struct Curve {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (iter, loss)
};

// Writes an SVG line chart of the curves (iterations on x, loss on y) atomically.
void write_loss_svg(const std::string& path, const std::vector<Curve>& curves,
                    const std::string& title);

std::string format_duration(double seconds);  // "1h02m", "3m12s", "42s"
std::string format_count(double v);           // "152k", "1.3M"
std::string format_bytes(double bytes);       // "512 MiB", "3.7 TiB"
std::string json_number(double v);            // finite numbers; "null" otherwise

// Peak dense FLOP/s of the device for MFU (0 when unknown: MFU is then not shown).
double peak_flops(const std::string& device_name, bool half_precision);

}  // namespace ffn::train
