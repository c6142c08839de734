// bench/timing.h — how the benchmarks time GPU work: CUDA events on the device's compute
// stream, the median of `iters` runs after `warmup` untimed ones.
#pragma once

#include "core/cuda/context.h"
#include "core/cuda/timer.h"

namespace ffn::bench {

// Milliseconds per run of `body`; each run waits for the GPU, its launch included.
template <class F>
double median_ms(int dev, int warmup, int iters, F&& body) {
  return cuda::median_event_ms(cuda::stream(dev), warmup, iters, body);
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
