// kernels/cuda/gemm/sm90_gemm.h — fused-ffn's own Hopper GEMM (sm_90a: TMA + wgmma, warp
// specialized, persistent; Note [Hopper GEMM pipeline]) for c = op(a)·op(b) with row-major
// bf16/f16 operands, the transposes as in kernels/gemm.h (x·Wᵀ, dy·W and dyᵀ·x are the
// layouts the FFN needs), and its epilogues. cuBLASLt (kernels/cuda/gemm.cu) stays the
// reference in tests and the fallback: callers ask sm90_gemm_supported() first. Plain C++:
// no CUDA header needed to include it.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn::cuda {

// How consumer warpgroups share tiles: cooperative (both on one 128-row tile; Note [Hopper
// GEMM pipeline]) or ping-pong (one tile each, alternating; Note [Hopper GEMM ping-pong]).
// automatic: the measured choice (sm90_gemm.cu, dispatch). act_warpgroups, for the
// activation epilogues only: one consumer and two warpgroups that run the activation (Note
// [Activation warpgroup]); there cooperative and ping-pong run it on the consumers'
// accumulators (ActTma, Note [Activation epilogues]).
enum class Sm90Schedule : uint8_t { automatic, cooperative, pingpong, act_warpgroups };

struct Sm90GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  Tensor bias;  // optional [n], added to every row
  Sm90Schedule schedule = Sm90Schedule::automatic;
  // Store C through shared memory with TMA (Note [TMA store epilogue]) when its rows allow
  // it (n % 8 == 0, 16-byte aligned); false stores from registers (for measurements).
  bool tma_store = true;
  // Split-K (Note [Split-K]): 0 lets the shape decide (only products with fewer tiles than
  // SMs split), 1 never splits, s > 1 cuts K into s parts (at most one per K block).
  int splits = 0;
  // Tile width: 0 lets the shape decide; 128, 192 or 256 forces it (cooperative; ping-pong
  // runs 128 only).
  int tile_n = 0;
  // Tile order (Note [Tile groups] in tile_scheduler.cuh): 0 lets the shape decide (or
  // gemm_group_rows(), kernels/gemm.h, where set), a power of two g up to 4096 walks groups of
  // g tile rows. Changes no bits.
  int group_m = 0;
  // Rotary embeddings in the epilogue (Note [Fused rotary embeddings] in
  // layers/attention.cpp): with rope_base > 0 the first rope_cols columns of C, heads of 64,
  // are rotated as kernels/rope.h's forward (after the bias), row r at sequence position r %
  // rope_seq. Only for x·Wᵀ (trans_b, not trans_a) stored through TMA (n % 8 == 0, C 16-byte
  // aligned), never split; rope_cols a multiple of 64 and at most n, rope_seq > 0.
  double rope_base = 0;
  int64_t rope_seq = 0;
  int64_t rope_cols = 0;
  // A row scale in the epilogue (Note [RMSNorm folded into the QKV GEMM] in
  // layers/attention.cpp): c_ij = row_scale_i·(op(a)·op(b))_ij (+ bias_j), before any rotation.
  // A contiguous f32 [m] tensor on the GPU; the same layout and store rules as the rotation
  // (x·Wᵀ through TMA, never split).
  Tensor row_scale;
};

// True when the GEMM can run these operands: an sm_90 GPU and a build with sm_90a code,
// bf16/f16 throughout, contiguous 2-D tensors with 16-byte aligned base pointers and rows
// (a.size(1) and b.size(1) multiples of 8), shapes that agree, m, n, k > 0.
bool sm90_gemm_supported(const Tensor& a, const Tensor& b, const Tensor& c, bool trans_a,
                         bool trans_b);

// c = op(a)·op(b) (+ bias).
void sm90_gemm(const Tensor& a, const Tensor& b, Tensor& c, const Sm90GemmArgs& args = {});

// How sm90_gemm cuts c [m, n] = a product over k on a GPU of `sms` SMs and `l2_bytes` of L2
// (host logic; Note [Split-K], Note [Tile groups]): the args' schedule, tile_n, splits and
// group_m where they force them, else the shape's choice (rotary epilogues never split).
struct Sm90Plan {
  bool pingpong;
  int tile_n;
  int splits;
  int group_m;
};
Sm90Plan sm90_gemm_plan(int64_t m, int64_t n, int64_t k, int sms, int64_t l2_bytes,
                        const Sm90GemmArgs& args = {});

// fc1 of the plain FFN in one kernel: z = x·wᵀ (stored when z is given), hd =
// dropout(act(z + b)) with exactly bias_act_dropout's arithmetic and mask.
void sm90_gemm_nt_bias_act_dropout(const Tensor& x, const Tensor& w, const Tensor& b,
                                   Activation act, const DropoutSpec& d, Tensor& hd, Tensor* z,
                                   Sm90Schedule schedule = Sm90Schedule::automatic);

// The plain FFN's activation and hidden dropout folded into its two GEMMs (Note [Activation
// epilogues], Note [Activation warpgroup]); outputs bit-identical to the unfused kernels' given
// the same product, the mask the same bits (Note [Dropout RNG]).
//   forward:  z = x·wᵀ (x [m, k], w [n, k]) and hd = dropout(act(z + b)), z stored without
//             the bias;
//   backward: dz = dropout'(dy·w) ⊙ act'(z + b) (dy [m, k], w [k, n], z [m, n] as the
//             forward saved it) and hd = dropout(act(z + b)) recomputed for dW2.
// b may be undefined (no bias). sm90_gemm_act_supported says whether the product runs here:
// sm90_gemm_supported for it, act one of gelu_erf, gelu_tanh, silu, n % 8 == 0 and a 16-byte
// aligned out (z or dz); the calls check the other tensors and throw on a mismatch. An active
// d needs the act_warpgroups schedule (or automatic, which is that one).
bool sm90_gemm_act_supported(const Tensor& a, const Tensor& b, bool backward, Activation act,
                             const Tensor& out);
void sm90_gemm_nt_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                      const DropoutSpec& d, Tensor& z, Tensor& hd,
                      Sm90Schedule schedule = Sm90Schedule::automatic);
// automatic is act_warpgroups. db (optional, [n]): Σ_rows dz in the same kernel, from
// per-128-row-tile fp32 partials summed in a fixed order (deterministic, independent of the
// grid; Note [Activation warpgroup]); act_warpgroups (or automatic) only.
void sm90_gemm_nn_act_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dz, Tensor& hd,
                               Sm90Schedule schedule = Sm90Schedule::automatic,
                               Tensor* db = nullptr);

// The gated FFN's fc1 in one kernel (Note [GLU warpgroup]): z = x·wᵀ (x [m, k], w [2h, k] as
// [value | gate] rows, z [m, 2h] stored without the bias) and out = dropout((z_v + b_v) ⊙
// act(z_g + b_g)) [m, h], bit-identical to the GEMM followed by bias_glu_dropout. b optional
// [2h]. sm90_gemm_glu_supported: sm90_gemm_supported for x·wᵀ -> z, act one of gelu_erf,
// gelu_tanh, silu, h % 64 == 0 and a 16-byte aligned z.
// row_scale (optional, f32 [m]; Note [RMSNorm folded into the FFN] in layers/ffn_nodes.cpp):
// z = diag(row_scale)·x·wᵀ, each row of the accumulators scaled before it is rounded.
bool sm90_gemm_glu_supported(const Tensor& x, const Tensor& w, Activation act, const Tensor& z);
void sm90_gemm_nt_glu(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                      const DropoutSpec& d, Tensor& z, Tensor& out, const Tensor& row_scale = {});
// Its backward's dhd product (Note [GLU warpgroup]): dhd = dy·w (dy [m, k], w [k, h]: fc2's
// weight) and, with the saved z [m, 2h] (without the bias), dz [m, 2h] = [dv | dg] and out
// = the forward's output recomputed (dW2's input), bit-identical to the GEMM followed by
// bias_glu_dropout_backward; db (optional, [2h]) from per-tile partials as the plain
// backward's. sm90_gemm_glu_backward_supported: sm90_gemm_supported for dy·w -> out [m, h],
// act one of gelu_erf, gelu_tanh, silu, h % 8 == 0 and a 16-byte aligned out. row_scale
// (optional, f32 [m], not with db): the forward's; dz comes out as diag(row_scale)·dz, the
// gradient of x·wᵀ.
bool sm90_gemm_glu_backward_supported(const Tensor& dy, const Tensor& w, Activation act,
                                      const Tensor& out);
void sm90_gemm_nn_glu_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dz, Tensor& out,
                               Tensor* db = nullptr, const Tensor& row_scale = {});

// A pre-norm block's branch ended inside its GEMM (Note [Residual add and norm in the
// epilogue], norm_epilogue.cuh): h = x·wᵀ + bias (x [m, k], w [n, k], never stored), a = res +
// dropout(h) (res and a fp32 [m, n], dropout_add's arithmetic and mask: a is bit for bit the
// unfused path's given the same product) and y = LayerNorm(a)·g + beta (mean defined) or
// RMSNorm(a)·g (mean undefined, beta undefined), with mean and rstd [m] in fp32 as
// layer_norm writes them (to rounding: the row sums run in another order). bias and beta
// optional. The row's tiles run as one cluster: n must be 2 or 4 tiles of 192 columns or 2 to
// 4 of 128 (tile_n: 0 picks 192 where it can; 128 or 192 forces it).
// sm90_gemm_add_norm_supported: sm90_gemm_supported for x·wᵀ -> y, such an n, res and a fp32
// with 32-byte aligned rows, y 16-byte aligned.
bool sm90_gemm_add_norm_supported(const Tensor& x, const Tensor& w, const Tensor& res,
                                  const Tensor& a, const Tensor& y);
void sm90_gemm_nt_add_norm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& res,
                           const DropoutSpec& d, const Tensor& g, const Tensor& beta, double eps,
                           Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd, int tile_n = 0);

}  // namespace ffn::cuda
