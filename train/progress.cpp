// train/progress.cpp — step timing and the progress lines (train/progress.h).
#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "train/metrics.h"

namespace ffn::train {

Progress::Progress(bool show, int64_t iters, int64_t eval_every, double tokens_per_iter,
                   double flops_per_iter, double peak_flops)
    : show_(show),
      tty_(show && isatty(fileno(stdout))),
      iters_(iters),
      eval_every_(eval_every),
      tokens_per_iter_(tokens_per_iter),
      flops_per_iter_(flops_per_iter),
      peak_(peak_flops) {}

double Progress::step_finished() {
  const auto now = clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - mark_).count();
  mark_ = now;
  step_ms_.push_back(ms);
  window_ms_ += ms;
  ++window_n_;
  ema_ms_ = ema_ms_ == 0 ? ms : 0.9 * ema_ms_ + 0.1 * ms;
  return ms;
}

WindowStats Progress::window() {
  WindowStats w;
  w.avg_ms = window_n_ ? window_ms_ / static_cast<double>(window_n_) : 0.0;
  w.tokens_per_s = tokens_per_iter_ / (w.avg_ms / 1e3);
  w.mfu = peak_ > 0 ? flops_per_iter_ / (w.avg_ms / 1e3) / peak_ : NAN;
  window_ms_ = 0, window_n_ = 0;
  return w;
}

double Progress::median_ms() const {
  if (step_ms_.empty()) return 0.0;
  std::vector<double> s = step_ms_;
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
  return s[s.size() / 2];
}

void Progress::step_line(int64_t done, int64_t end_iter, double loss, double lr,
                         const WindowStats& w, bool skipped) const {
  if (!show_) return;
  const int64_t left = end_iter - done;
  const double evals_left = static_cast<double>(left / eval_every_ + 1);
  const double per_eval = evals_ ? eval_seconds_ / static_cast<double>(evals_) : 0.0;
  const double eta = static_cast<double>(left) * ema_ms_ / 1e3 + evals_left * per_eval;
  char mfu_s[32] = "";
  if (peak_ > 0) std::snprintf(mfu_s, sizeof(mfu_s), " | MFU %4.1f%%", 100 * w.mfu);
  std::printf("%siter %lld/%lld | loss %.4f | lr %.2e | %s tok/s | %.1f ms/iter%s | ETA %s%s",
              tty_ ? "\r\033[K" : "", static_cast<long long>(done), static_cast<long long>(iters_),
              loss, lr, format_count(w.tokens_per_s).c_str(), w.avg_ms, mfu_s,
              format_duration(eta).c_str(), skipped ? " | step skipped (non-finite)" : "");
  std::printf(tty_ ? "" : "\n");
  std::fflush(stdout);
}

void Progress::eval_line(int64_t done, double val, double train, double best) const {
  if (!show_) return;
  std::printf("%seval @ iter %lld: val loss %.4f, train loss %.4f (best val %.4f)\n",
              tty_ ? "\r\033[K" : "", static_cast<long long>(done), val, train, best);
  std::fflush(stdout);
}

void Progress::line(const std::string& text) const {
  if (!show_) return;
  std::printf("%s%s\n", tty_ ? "\r\033[K" : "", text.c_str());
  std::fflush(stdout);
}

void Progress::end() const {
  if (tty_) std::printf("\n");
}

}  // namespace ffn::train
