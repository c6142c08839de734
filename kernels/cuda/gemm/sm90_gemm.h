// kernels/cuda/gemm/sm90_gemm.h — fused-ffn's own Hopper GEMM (sm_90a: TMA + wgmma, warp
// specialized, persistent; Note [Hopper GEMM pipeline]) for C = A·Bᵀ with A [M, K] and
// B [N, K] row-major bf16/f16 (the x·Wᵀ of every forward Linear), with its epilogues.
// cuBLASLt (kernels/cuda/gemm.cu) stays the reference in tests and the fallback: callers
// ask sm90_gemm_supported() first. Plain C++: no CUDA header needed to include it.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn::cuda {

// True when the GEMM can run these operands: an sm_90 GPU and a build with sm_90a code,
// bf16/f16, contiguous, 16-byte aligned rows (K % 8 == 0) and base pointers, M, N, K > 0.
bool sm90_gemm_supported(const Tensor& a, const Tensor& b, const Tensor& c);

// How consumer warpgroups share tiles: cooperative (both on one 128-row tile; Note [Hopper
// GEMM pipeline]) or ping-pong (one tile each, alternating; Note [Hopper GEMM ping-pong]).
// automatic: ping-pong for the fused fc1 epilogue, cooperative for plain stores (measured).
enum class Sm90Schedule : uint8_t { automatic, cooperative, pingpong };

// c = a·bᵀ (+ bias[N]).
void sm90_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c,
                  Sm90Schedule schedule = Sm90Schedule::automatic);

// fc1 of the plain FFN in one kernel: z = x·wᵀ (stored when z is given), hd =
// dropout(act(z + b)) with exactly bias_act_dropout's arithmetic and mask.
void sm90_gemm_nt_bias_act_dropout(const Tensor& x, const Tensor& w, const Tensor& b,
                                   Activation act, const DropoutSpec& d, Tensor& hd, Tensor* z,
                                   Sm90Schedule schedule = Sm90Schedule::automatic);

}  // namespace ffn::cuda
