// kernels/cpu/parallel.cpp — the CPU threads of kernels/cpu/parallel.h.
#include "kernels/cpu/parallel.h"

#include <algorithm>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace ffn::cpu {

int cpu_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int threads_for(int64_t elements) {
  const int64_t want = elements / kMinElementsPerThread;
  return static_cast<int>(std::clamp<int64_t>(want, 1, cpu_threads()));
}

void set_cpu_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

}  // namespace ffn::cpu
