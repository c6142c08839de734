// train/progress.h — the terminal side of a run: step times (each step's wall time from the
// previous step's outcome to its own, evals and saves excluded), the windowed speed, MFU and
// ETA, and the lines ffn-train prints (a self-overwriting line on a terminal, one line per
// log otherwise). Only rank 0 of an un-quiet run prints; every rank keeps the timings.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ffn::train {

// The speed over the steps since the last log line.
struct WindowStats {
  double avg_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // NaN without a peak (the CPU)
};

class Progress {
 public:
  // peak_flops = 0: MFU is not shown.
  Progress(bool show, int64_t iters, int64_t eval_every, double tokens_per_iter,
           double flops_per_iter, double peak_flops);

  // The time since the last mark is one step's; returns it in ms.
  double step_finished();
  // Evals and checkpoints are not charged to steps: restart the clock after them.
  void restart_clock() { mark_ = clock::now(); }
  void add_eval_seconds(double s) { eval_seconds_ += s, ++evals_; }
  // Speed since the last window() call (resets the window).
  WindowStats window();
  double median_ms() const;  // over every step of this process; 0 if none

  void step_line(int64_t done, int64_t end_iter, double loss, double lr, const WindowStats& w,
                 bool skipped) const;
  void eval_line(int64_t done, double val, double train, double best) const;
  // A full line (clears a pending progress line first on a terminal).
  void line(const std::string& text) const;
  void end() const;  // ends the progress line on a terminal
  bool shown() const { return show_; }

 private:
  using clock = std::chrono::steady_clock;
  bool show_, tty_;
  int64_t iters_, eval_every_;
  double tokens_per_iter_, flops_per_iter_, peak_;
  clock::time_point mark_ = clock::now();
  std::vector<double> step_ms_;
  double window_ms_ = 0, ema_ms_ = 0, eval_seconds_ = 0;
  int64_t window_n_ = 0, evals_ = 0;
};

}  // namespace ffn::train
