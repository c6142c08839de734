// train/metrics.h — what a run leaves for people: metrics.jsonl (one JSON object per
// line, `iter` plus train_loss or val_loss and friends) and the number formats of the
// progress display (loss.svg is drawn by train/io/svg.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/io/svg.h"
#include "train/progress.h"

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

// The run's record on disk, kept by the writing rank: metrics.jsonl and loss.svg. On a
// resume from iteration `resumed_iter`, lines after it (from iterations about to be redone)
// are dropped and the curves are reread from the kept lines. Other ranks keep nothing.
class RunRecord {
 public:
  RunRecord(const std::string& run_dir, bool writer, int64_t resumed_iter /* -1: fresh */);
  void step(int64_t iter, double loss, double lr, double grad_norm, const WindowStats& w,
            int64_t skipped_total);
  // step() redraws loss.svg at its first point and then at most every 2 s; eval() always.
  // Writes the eval line and redraws loss.svg.
  void eval(int64_t iter, double val, double train, double best);
  // {"iter": N, "event": "stopped", "signal": ...}: the run stopped early on a request
  // (Note [Graceful stop]); a finished run has no such line.
  void stopped(int64_t iter, const std::string& signal);
  // {"iter": N, fields...}: any other record (fields: key → formatted JSON value).
  void note(int64_t iter, const std::vector<std::pair<std::string, std::string>>& fields);

 private:
  void draw();

  std::string dir_;
  std::unique_ptr<MetricsLog> log_;
  Curve train_{"train", "#1f77b4", {}}, val_{"val", "#d62728", {}};
  std::chrono::steady_clock::time_point drawn_{};  // loss.svg's last redraw
};

std::string format_duration(double seconds);  // "1h02m", "3m12s", "42s"
std::string format_count(double v);           // "152k", "1.3M"
std::string format_bytes(double bytes);       // "512 MiB", "3.7 TiB"
std::string json_number(double v);            // finite numbers; "null" otherwise

// Peak dense FLOP/s of the device for MFU (0 when unknown: MFU is then not shown).
double peak_flops(const std::string& device_name, bool half_precision);

}  // namespace ffn::train
