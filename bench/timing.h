// bench/timing.h — how the benchmarks time GPU work: CUDA events on the device's compute
// stream, the median of at least `iters` runs after `warmup` untimed ones, the timed runs
// spread over a window of wall time (Note [Timing window]).
#pragma once

#include "core/cuda/context.h"
#include "core/cuda/timer.h"

namespace ffn::bench {

// Note [Timing window]
// ~~~~~~~~~~~~~~~~~~~~
// An H100 under GEMM load runs into its 700 W power cap within ~0.1 s, and from then on its SM
// clock swings between ~1.4 and ~1.98 GHz with a period of about a second (nvidia-smi every
// 100 ms, throttle reason "SW power cap"; 100-ms bins of one back-to-back GEMM 207-254 us:
// bench/RESULTS-2026-11-27-s30-32.md session 30). Thirty 1.5-ms steps sample one phase of that
// swing, so two runs of the same binary differed by up to 10%, and what ran just before (an
// autotuner timing its candidates, another benchmark) moved the result: session 30 saw a 12-16%
// "regression" of the FFN workloads that was 1.5-2% once each variant ran 200 steps. Every timed
// loop therefore goes on until it has both `iters` runs and `window_ms` of wall time (ffn-bench
// --window-ms, default 1000), so its median is taken over the clock's whole swing, as a training
// run sees it. 0 restores the plain `iters` runs.
inline double& window_ms() {
  static double ms = 1000;
  return ms;
}

// Milliseconds per run of `body`; each run waits for the GPU, its launch included.
template <class F>
double median_ms(int dev, int warmup, int iters, F&& body) {
  return cuda::median_event_ms(cuda::stream(dev), warmup, iters, body, window_ms());
}

// Milliseconds per run of `body` timed as four back-to-back runs (median over `iters` such
// groups), so the host's launch time is hidden behind the GPU's work as in a training step
// and as gemm()'s autotuner times (Note [Own GEMM in gemm()]).
template <class F>
double back_to_back_ms(int dev, int warmup, int iters, F&& body) {
  return median_ms(dev, warmup, iters, [&] {
           for (int i = 0; i < 4; ++i) body();
         }) /
         4;
}

}  // namespace ffn::bench
