// train/dist/watchdog.h — the last line of defence against a host thread stuck on a
// collective that will never finish.
//
// Note [Collective watchdog]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The host polls collectives instead of waiting on them (Note [NCCL timeouts], Note
// [Deferred collective check]), so a lost peer becomes an error naming the collective. A
// CUDA call that waits for the compute stream while that stream waits for a stuck collective
// (a synchronous copy, a free, a full launch queue) would still block the host for good, and
// such a thread cannot be unwound. The NCCL communicator therefore reports to a Watchdog
// whenever it enqueues or polls; if collectives are pending and nothing was reported for
// `limit_s` (the collective timeout plus a margin), the watchdog's own thread calls `fire`
// with the oldest pending collective's name, which prints why and ends the process with
// exit code 1 (the launcher then stops the other ranks). The watchdog itself never calls
// CUDA: a thread that did would block in the driver as well.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ffn::train {

class Watchdog {
 public:
  // oldest: the oldest pending collective's name and step; idle_s: seconds without progress.
  using Fire = std::function<void(const std::string& oldest, int64_t step, double idle_s)>;
  Watchdog(double limit_s, Fire fire);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // The host made progress; `pending` collectives are outstanding, the oldest `oldest` of
  // step `step`.
  void progress(int64_t pending, const std::string& oldest, int64_t step);
  bool fired() const;

 private:
  void run();
  using Clock = std::chrono::steady_clock;
  const double limit_s_;
  const Fire fire_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Clock::time_point last_ = Clock::now();
  int64_t pending_ = 0, step_ = 0;
  std::string oldest_;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace ffn::train
