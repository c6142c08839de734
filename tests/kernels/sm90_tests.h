// tests/kernels/sm90_tests.h — what the own Hopper GEMM's test files (test_sm90_gemm.cpp,
// test_sm90_act.cpp) share: whether this GPU runs it, bitwise comparison of outputs that start
// as NaN, and layout names.
#pragma once

#include <cmath>

#include "core/tensor.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "tests/kernels/kernel_tests.h"

namespace ffn::test {

// Equal values and NaN-free (the outputs start as NaN, so an unwritten element shows).
inline bool equal_and_written(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::isnan(va[i]) || std::isnan(vb[i]) || va[i] != vb[i]) return false;
  return va.size() == vb.size();
}

// Whether the own Hopper GEMM runs on this GPU (sm_90a code and an sm_90 device).
inline bool sm90_here() {
  const Tensor probe = Tensor::zeros({8, 8}, DType::bf16, kGpu);
  return cuda::sm90_gemm_supported(probe, probe, probe, false, true);
}

inline const char* layout_name(bool ta, bool tb) {
  return ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN");
}

}  // namespace ffn::test
