// train/stop.cpp — the signal handlers of Note [Graceful stop].
#include "train/stop.h"

#include <csignal>
#include <ctime>

namespace ffn::train {

namespace {

volatile std::sig_atomic_t g_first = 0;
volatile std::sig_atomic_t g_first_at = 0;  // CLOCK_MONOTONIC seconds of the first signal

long monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<long>(ts.tv_sec);
}

void on_stop_signal(int sig) {
  if (g_first == 0) {
    g_first_at = static_cast<std::sig_atomic_t>(monotonic_s());
    g_first = sig;
    return;
  }
  if (monotonic_s() - g_first_at < static_cast<long>(kDuplicateWindowS)) return;  // the same request
  // A second request: abort now, as if no handler were installed.
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not make blocking reads and writes fail
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_first; }

void reset_stop_request() {
  g_first = 0;
  g_first_at = 0;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace ffn::train
