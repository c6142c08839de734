// kernels/cpu/parallel.h — OpenMP for the CPU references' element loops, where a loop's
// result does not depend on how its rows are split (each element computed from its own inputs
// and mask bits; sums stay in passes of their own, in row order). Without OpenMP the pragmas
// vanish and the loops run on one thread. Threads: OMP_NUM_THREADS, as Eigen's GEMMs.
#pragma once

#if defined(_OPENMP)
#define FFN_OMP_PARALLEL _Pragma("omp parallel")
#define FFN_OMP_FOR _Pragma("omp for schedule(static)")
#else
#define FFN_OMP_PARALLEL
#define FFN_OMP_FOR
#endif

namespace ffn::cpu {
// The threads the CPU loops and Eigen's GEMMs use from the calling thread on (1 without
// OpenMP); set_cpu_threads does nothing without OpenMP.
int cpu_threads();
void set_cpu_threads(int n);
}  // namespace ffn::cpu
