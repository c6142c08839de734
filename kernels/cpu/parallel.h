// kernels/cpu/parallel.h — OpenMP for the CPU references' element loops, where a loop's
// result does not depend on how its rows are split (each element computed from its own inputs
// and mask bits; sums stay in passes of their own, in row order). Without OpenMP the pragmas
// vanish and the loops run on one thread. Threads: OMP_NUM_THREADS, as Eigen's GEMMs.
//
// A loop gets one thread per kMinElementsPerThread of its elements, up to OMP_NUM_THREADS:
// a team costs more than a small loop. On a 16-core H100 host, test_layers' FFN
// finite-difference case (thousands of small forwards) took over 100 s with a full team for
// every loop, over 60 s with a thread per 512 elements and 23.7 s with one per 4096; on a
// 2-core machine 9–10 s before, 11.6–11.9 s now (bench/RESULTS-2026-11-28-s35-38.md,
// session 35). Eigen likewise keeps small products on one thread.
#pragma once

#include <cstdint>

namespace ffn::cpu {
inline constexpr int64_t kMinElementsPerThread = 4096;
// The threads the CPU loops and Eigen's GEMMs use from the calling thread on (1 without
// OpenMP); set_cpu_threads does nothing without OpenMP.
int cpu_threads();
void set_cpu_threads(int n);
// Threads for a loop over `elements` elements: ⌊elements / kMinElementsPerThread⌋ clamped to
// [1, cpu_threads()].
int threads_for(int64_t elements);
}  // namespace ffn::cpu

#if defined(_OPENMP)
#define FFN_OMP_PRAGMA(x) _Pragma(#x)
#define FFN_OMP_PARALLEL_FOR_WORK(elements) \
  FFN_OMP_PRAGMA(omp parallel num_threads(::ffn::cpu::threads_for(elements)))
#define FFN_OMP_FOR _Pragma("omp for schedule(static)")
#else
#define FFN_OMP_PARALLEL_FOR_WORK(elements)
#define FFN_OMP_FOR
#endif
