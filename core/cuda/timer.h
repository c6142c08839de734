// core/cuda/timer.h — the one way fused-ffn times GPU work: CUDA events around each run on
// the stream, median over the runs. Used by the GEMM autotuner (kernels/cuda/gemm.cu) and
// the benchmarks (bench/), so both measure the same way (METHOD.md: warm up, repeat, median).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/cuda/check.h"

namespace ffn::cuda {

// Median milliseconds of at least `iters` runs of `body` (which queues work on `stream`),
// after `warmup` untimed runs, the timed runs going on until `window_ms` of wall time has
// passed as well (bench/timing.h's Note [Timing window]; 0: exactly `iters`, at least one).
// Each run is bracketed by events and waited for.
template <class F>
double median_event_ms(cudaStream_t stream, int warmup, int iters, F&& body,
                       double window_ms = 0) {
  for (int i = 0; i < warmup; ++i) body();
  cudaEvent_t a, b;
  FFN_CHECK_CUDA(cudaEventCreate(&a));
  FFN_CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  while (ms.empty() || static_cast<int>(ms.size()) < iters || elapsed() < window_ms) {
    FFN_CHECK_CUDA(cudaEventRecord(a, stream));
    body();
    FFN_CHECK_CUDA(cudaEventRecord(b, stream));
    FFN_CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    FFN_CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace ffn::cuda
