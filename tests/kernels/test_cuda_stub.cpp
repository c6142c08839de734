// tests/kernels/test_cuda_stub.cpp — the cuda:: backend of a CPU-only build
// (kernels/cuda_stub.cpp): the CPU reference against formulas and fp64 finite differences, its
// argument checks, and the CUDA kernels against the reference (FFN_GPU_TEST cases skip visibly
// without a GPU).
#include <cmath>

#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/gemm.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("a CPU-only build's cuda:: backend throws naming the op") {
  if (built_with_cuda()) {
    MESSAGE("built with CUDA: the stub backend (kernels/cuda_stub.cpp) is not linked");
    return;
  }
  Tensor a = Tensor::zeros({2, 2}), c = Tensor::zeros({2, 2});
  CHECK_THROWS_WITH_AS(cuda::gemm(a, a, c, {}), doctest::Contains("[gemm] built without CUDA"),
                       Error);
  CHECK_THROWS_WITH_AS(cuda::bias_act_dropout(a, {}, Activation::silu, {}, c),
                       doctest::Contains("[bias_act_dropout] built without CUDA"), Error);
  CHECK(!fused_attention_supported(DType::bf16, 64, 64));
  CHECK_THROWS_WITH_AS(Tensor::zeros({2}, DType::f32, Device::cuda(0)),
                       doctest::Contains("[alloc] a CUDA tensor was requested but"), Error);
}
