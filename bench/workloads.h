// bench/workloads.h — docs/design.md's benchmark workloads, shared by ffn-bench and the
// PyTorch comparison (bench/compare_torch.py mirrors these numbers; keep them in sync).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/activation.h"

namespace ffn::bench {

struct Workload {
  std::string name;
  DType dtype;
  int64_t m;      // rows of x
  int64_t d;      // features of x (the input width)
  int64_t h1;     // rows of W1 (h, or 2h when gated); 0 = no W1 (x is the GEMM input itself)
  int64_t d_out;  // rows of W2; 0 = no W2
  bool gated;
  Activation act;
  float p_hidden;
  float p_out;
  bool bias1;
  bool bias2;
};

inline std::vector<Workload> workloads() {
  return {
      // y = dropout(gelu_erf(x))·Wᵀ + b, x [2048, 16384], W [4096, 16384]
      {"welder_fc2", DType::f16, 2048, 16384, 0, 4096, false, Activation::gelu_erf, 0.5f, 0.0f,
       false, true},
      {"ffn_d1024", DType::bf16, 16384, 1024, 4096, 1024, false, Activation::gelu_tanh, 0.1f, 0.1f,
       true, true},
      {"ffn_d4096", DType::bf16, 8192, 4096, 16384, 4096, false, Activation::gelu_tanh, 0.1f, 0.1f,
       true, true},
      {"geglu_d1024", DType::bf16, 16384, 1024, 8192, 0, true, Activation::gelu_tanh, 0.0f, 0.0f,
       true, false},
      {"geglu_d2048", DType::bf16, 16384, 2048, 16384, 0, true, Activation::gelu_tanh, 0.0f, 0.0f,
       true, false},
  };
}

// GEMM flops of one forward + backward (each GEMM counted as 2·m·n·k).
inline double gemm_flops(const Workload& w) {
  const double m = static_cast<double>(w.m);
  const double hidden =
      w.h1 ? (w.gated ? w.h1 / 2.0 : static_cast<double>(w.h1)) : static_cast<double>(w.d);
  double f = 0;
  if (w.h1) f += 3 * 2 * m * w.d * w.h1;           // fc1: forward, dW1, dx
  if (w.d_out) f += 3 * 2 * m * hidden * w.d_out;  // fc2: forward, dhd, dW2
  return f;
}

}  // namespace ffn::bench
