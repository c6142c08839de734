// bench/gemm_bench.h — ffn-bench's comparisons of the GEMMs alone and with their fused
// epilogues against cuBLASLt and the unfused passes (bench/gemm_bench.cpp): each prints JSON
// lines with ms (and TFLOP/s where it is a bare product).
#pragma once

#include <string>

#include "kernels/gemm.h"

namespace ffn::bench {

// The comparisons whose columns say "cuBLASLt" run gemm() on cuBLASLt alone (Note [Own GEMM
// in gemm()]); the workloads and their floor run it as training does.
struct CublasLtOnly {
  OwnGemm saved = own_gemm();
  CublasLtOnly() { set_own_gemm(OwnGemm::never); }
  ~CublasLtOnly() { set_own_gemm(saved); }
};

// --gemm: the own Hopper GEMM against cuBLASLt on every product of the workloads and GPT-2.
void gemm_comparison(int device, int warmup, int iters, const std::string& only,
                     const std::string& variant);
// --out-dropout: fc2 with its output dropout in the GEMM's epilogue against GEMM + pass.
void out_dropout_bench(int device, int warmup, int iters);
// --act-epilogues: fc1's activation (and its backward) in the GEMMs against GEMM + pass.
void act_epilogue_bench(int device, int warmup, int iters);

}  // namespace ffn::bench
