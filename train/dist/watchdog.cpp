// train/dist/watchdog.cpp — the collective watchdog (train/dist/watchdog.h).
#include "train/dist/watchdog.h"

#include <algorithm>

#include "core/error.h"

namespace ffn::train {

Watchdog::Watchdog(double limit_s, Fire fire) : limit_s_(limit_s), fire_(std::move(fire)) {
  FFN_CHECK(limit_s > 0, "[watchdog] the limit must be > 0 s, got ", limit_s);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::progress(int64_t pending, const std::string& oldest, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = Clock::now();
  pending_ = pending;
  if (pending > 0 && oldest_ != oldest) oldest_ = oldest;
  step_ = step;
}

bool Watchdog::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void Watchdog::run() {
  // Looks a few times per limit (at least once a second).
  const auto tick = std::chrono::duration<double>(std::min(1.0, limit_s_ / 4));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, tick, [this] { return stop_; });
    if (stop_ || fired_ || pending_ == 0) continue;
    const double idle = std::chrono::duration<double>(Clock::now() - last_).count();
    if (idle <= limit_s_) continue;
    fired_ = true;
    const std::string oldest = oldest_;
    const int64_t step = step_;
    lock.unlock();
    fire_(oldest, step, idle);
    lock.lock();
  }
}

}  // namespace ffn::train
