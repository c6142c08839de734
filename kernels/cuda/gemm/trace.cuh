// kernels/cuda/gemm/trace.cuh — per-tile timestamps of the activation GEMM (Note [Activation
// warpgroup]) for finding where its time goes: compiled only with FFN_GEMM_TRACE defined
// (never in a normal build; the marks are then empty). Each role's first thread records
// clock64() at fixed points of every tile in the first kCtas CTAs; launch_act_in (kernel.cuh)
// arms the marks for every FFN_GEMM_TRACE_EVERY-th launch (default 20) of each kernel (arm)
// and prints one line to stderr after it (report): the consumer's period split into mainloop, wait
// for a free staging buffer and staging, the activation warpgroups' into wait, release and work
// (the plain kernels' only: the GLU's loops carry no marks). Session 31 found Note [Operand
// multicast] this way: put `#define FFN_GEMM_TRACE 1` first in sm90_gemm_act.cu (or compile
// that file alone with -DFFN_GEMM_TRACE=1 and relink), build ffn-bench, run
// `FFN_GEMM_TRACE_EVERY=20 ffn-bench --act-epilogues --window-ms 0`; session 46 split the
// activation kernels' mainloop cycles this way (bench/RESULTS.md).
#pragma once

#include <cstdint>
#if defined(FFN_GEMM_TRACE)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda/check.h"
#endif

namespace ffn::cuda::gemm::trace {

inline constexpr int kCtas = 132, kTiles = 64, kSlots = 16;
// Slots: the consumer 0 tile start, 1 mainloop done, 2 buffer free (empty barrier passed),
// 3 staged (full arrived); activation warpgroup c at 4 + 4c: 0 before the full wait, 1 after
// it, 2 after releasing the previous tile, 3 end of the tile's work; the consumer's mainloop
// 12 first k-block issued, 13 last k-block issued; the producer 14 first stage free (its loads
// start), 15 last stage free. Since Note [Overlapped tile boundary] a tile starts when the
// previous one's second half is staged (its first k-block's rows [0, 64) already issued) and
// "staging" includes issuing the next tile's first k-block into the first half.

#if defined(FFN_GEMM_TRACE)
static __device__ unsigned long long* g_buf;  // null: this launch is not traced

__device__ __forceinline__ void mark(int slot, int j) {
  unsigned long long* b = g_buf;
  if (b && blockIdx.x < kCtas && j < kTiles)
    b[(static_cast<int>(blockIdx.x) * kTiles + j) * kSlots + slot] = clock64();
}

// The records of one launch (kCtas · kTiles · kSlots words) as one line: the mean
// cycles a tile of each role's phases over tiles 1 .. n - 2 of every traced CTA, and the
// median and 90th percentile of the waits.
inline void summarize(const std::vector<unsigned long long>& v, const char* what) {
  struct Acc {
    std::vector<double> x;
    void add(double d) { x.push_back(d); }
    double mean() const {
      double s = 0;
      for (double d : x) s += d;
      return x.empty() ? 0 : s / static_cast<double>(x.size());
    }
    double pct(double q) {
      if (x.empty()) return 0;
      std::sort(x.begin(), x.end());
      return x[static_cast<size_t>(q * static_cast<double>(x.size() - 1))];
    }
  };
  Acc period, main_, empty, stage, aperiod[2], await_[2], arel[2], awork[2], kernel;
  Acc first_full, issue, tail, lead, pspan;
  int tiles_max = 0;
  for (int b = 0; b < kCtas; ++b) {  // CTAs that ran fewer than 4 tiles are skipped
    auto at = [&](int j, int s) {
      return static_cast<double>(v[(static_cast<size_t>(b) * kTiles + j) * kSlots + s]);
    };
    // A CTA's tiles: those whose first half was staged (slot 1). Slot 0 also holds a mark for
    // the tile after the last (each tile's start is marked when the one before it is staged),
    // and slot 7 none in the GLU kernels, whose loops carry no marks.
    int n = 0;
    while (n < kTiles && at(n, 1) != 0) ++n;
    tiles_max = std::max(tiles_max, n);
    if (n < 4) continue;
    kernel.add(at(n - 1, 3) - at(0, 0));  // tile 0's start to the last tile staged
    for (int j = 1; j + 2 < n; ++j) {
      period.add(at(j + 1, 0) - at(j, 0));
      main_.add(at(j, 1) - at(j, 0));
      empty.add(at(j, 2) - at(j, 1));
      stage.add(at(j, 3) - at(j, 2));
      first_full.add(at(j, 12) - at(j, 0));
      issue.add(at(j, 13) - at(j, 12));
      tail.add(at(j, 1) - at(j, 13));
      lead.add(at(j, 12) - at(j, 14));
      pspan.add(at(j, 15) - at(j, 14));
      for (int c = 0; c < 2; ++c) {
        const int o = 4 + 4 * c;
        aperiod[c].add(at(j + 1, o) - at(j, o));
        await_[c].add(at(j, o + 1) - at(j, o));
        arel[c].add(at(j, o + 2) - at(j, o + 1));
        awork[c].add(at(j, o + 3) - at(j, o + 2));
      }
    }
  }
  std::fprintf(stderr,
               "trace %s: tiles/CTA <= %d, first-to-last %.0f cyc; consumer period %.0f = "
               "mainloop %.0f + buffer wait %.0f (p50 %.0f p90 %.0f) + staging %.0f",
               what, tiles_max, kernel.mean(), period.mean(), main_.mean(), empty.mean(),
               empty.pct(0.5), empty.pct(0.9), stage.mean());
  std::fprintf(stderr,
               " [first stage wait %.0f (p90 %.0f), k-blocks issued %.0f, tail %.0f; producer's "
               "first load to its use %.0f (p10 %.0f), producer span %.0f]",
               first_full.mean(), first_full.pct(0.9), issue.mean(), tail.mean(), lead.mean(),
               lead.pct(0.1), pspan.mean());
  for (int c = 0; c < 2; ++c)
    std::fprintf(stderr,
                 "; act%d period %.0f = full wait %.0f (p50 %.0f p90 %.0f) + release %.0f + "
                 "work %.0f",
                 c, aperiod[c].mean(), await_[c].mean(), await_[c].pct(0.5), await_[c].pct(0.9),
                 arel[c].mean(), awork[c].mean());
  std::fprintf(stderr, "\n");
}

// Host side, before a launch of one kernel (`launches` counts that kernel's launches): the
// buffer its marks go to on every FFN_GEMM_TRACE_EVERY-th launch (default 20), else null.
// Internal linkage, as g_buf: each translation unit traces its own kernels.
static unsigned long long* arm(int& launches, cudaStream_t stream) {
  static unsigned long long* buf = nullptr;
  const char* every_env = std::getenv("FFN_GEMM_TRACE_EVERY");
  const int every = every_env ? std::max(1, std::atoi(every_env)) : 20;
  const bool traced = ++launches % every == 0;
  const size_t bytes = sizeof(unsigned long long) * kCtas * kTiles * kSlots;
  if (traced && !buf) FFN_CHECK_CUDA(cudaMalloc(&buf, bytes));
  if (traced) FFN_CHECK_CUDA(cudaMemsetAsync(buf, 0, bytes, stream));
  unsigned long long* p = traced ? buf : nullptr;
  FFN_CHECK_CUDA(cudaMemcpyToSymbolAsync(g_buf, &p, sizeof(p), 0, cudaMemcpyHostToDevice, stream));
  return p;
}

// After a traced launch: waits for it, copies the marks back and prints summarize()'s line.
static void report(unsigned long long* buf, cudaStream_t stream, const char* what) {
  std::vector<unsigned long long> host(static_cast<size_t>(kCtas) * kTiles * kSlots);
  FFN_CHECK_CUDA(cudaStreamSynchronize(stream));
  FFN_CHECK_CUDA(cudaMemcpy(host.data(), buf, host.size() * sizeof(unsigned long long),
                            cudaMemcpyDeviceToHost));
  summarize(host, what);
}
#else
__device__ __forceinline__ void mark(int, int) {}
#endif

}  // namespace ffn::cuda::gemm::trace
