// tests/kernels/test_philox.cpp — the Philox dropout masks: GPU == cuRAND == CPU under any launch
// shape: the CPU reference against formulas and fp64 finite differences, its argument checks, and
// the CUDA kernels against the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/bias_act_dropout.h"
#include "layers/functional.h"
#include "tests/cuda_probe.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

FFN_GPU_TEST("philox on the GPU matches cuRAND's Philox4x32-10 and the CPU bit for bit") {
#if FFN_WITH_CUDA
  for (auto [seed, offset] :
       {std::pair<uint64_t, uint64_t>{0, 0}, {42, 7}, {0x123456789abcdefull, 1ull << 40}}) {
    const int64_t nb = 4099;
    const auto ours = ffn::test::philox_words_gpu_ours(seed, offset, nb);
    const auto ref = ffn::test::philox_words_gpu_curand(seed, offset, nb);
    CHECK(ours == ref);
    int bad = 0;
    for (int64_t b = 0; b < nb; ++b) {
      const U32x4 r = philox_block(seed, offset, b);
      for (int j = 0; j < 4; ++j) bad += r.v[j] != ours[4 * b + j];
    }
    CHECK(bad == 0);
  }
#endif
}

FFN_GPU_TEST("dropout masks on the GPU equal the CPU's, under any launch shape") {
  Generator g(50);
  for (float p : {0.1f, 0.5f})
    for (auto [m, n] : {std::pair<int64_t, int64_t>{1000, 1000}, {3, 4097}, {64, 4096}}) {
      const DropoutSpec d{p, 1234, 77};
      const Tensor ones = Tensor::full({m, n}, 1.0, DType::f32);
      Tensor cpu = Tensor::empty({m, n}, DType::f32);
      bias_dropout(ones, {}, d, cpu);
      for (DType dt : kGpuDtypes) {
        const Tensor z = ones.to(dt).to(kGpu);
        Tensor y = Tensor::empty({m, n}, dt, kGpu);
        bias_dropout(z, {}, d, y);
        Tensor y2 = misaligned(y);  // scalar path, other grid
        bias_dropout(misaligned(z), {}, d, y2);
        const Tensor keep_gpu = y.to(Device::cpu()).to(DType::f32), keep_cpu = cpu;
        CHECK(max_abs_diff(y2.contiguous(), y) == 0.0);
        int64_t mismatch = 0, kept = 0;
        const auto a = keep_gpu.to_vector(), b = keep_cpu.to_vector();
        for (size_t i = 0; i < a.size(); ++i) {
          mismatch += (a[i] != 0) != (b[i] != 0);
          kept += a[i] != 0;
        }
        CHECK(mismatch == 0);
        const double nn = static_cast<double>(m * n);
        CHECK(std::fabs(kept - nn * (1 - p)) <= 4 * std::sqrt(nn * p * (1 - p)));
      }
    }
}
