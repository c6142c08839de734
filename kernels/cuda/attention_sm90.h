// kernels/cuda/attention_sm90.h — the Hopper (sm_90a) kernels of the fused causal attention
// (kernels/attention.h): the same math, layouts, dropout draws and determinism as the
// mma.sync kernels in attention.cu, on wgmma with TMA-fed, warp-specialised pipelines
// (Note [Hopper attention], attention_sm90.cuh). Head size 64 only (GPT-2, the char models);
// attention.cu routes to them where sm90_attention_supported() and falls back otherwise.
// Plain C++: no CUDA header needed to include it.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn::cuda {

// True when these kernels can run: bf16/f16 qkv on a GPU with sm_90a code in this build
// (Note [sm_90a code]), head_dim 64, 16-byte aligned tensors, B > 0, 0 < T < 2^31 and fewer
// than 2^31 units (B·heads·⌈T/128⌉).
bool sm90_attention_supported(const Tensor& qkv, int64_t heads);

// Tests: the heads per unit group of both kernels (Note [Unit order], attention_sm90.cuh);
// 0, the default, picks them from the shape, the grid and the GPU's L2 size.
void sm90_attention_force_unit_group(int64_t heads);
// Tests: at most this many CTAs in both kernels' persistent grids (0, the default: one per
// SM), so that small shapes walk several units a CTA, with their handoffs between units.
void sm90_attention_force_grid(int64_t ctas);
// Tests and benchmarks: the forward's query rows a unit without attention dropout, 128 or 192
// (Note [Forward block rows], attention_sm90_fwd.cu: 192 only where 64 divides T; with dropout
// always 128); 0, the default, takes the measured choice. The same bits either way.
void sm90_attention_force_forward_rows(int64_t rows);
// The forward's query rows a unit without dropout at sequence length t, as forced or chosen.
int64_t sm90_attention_forward_rows(int64_t t);
// Tests and benchmarks: the forward's consumer warpgroups taking turns to issue their
// products (Note [Forward ping-pong], attention_sm90_fwd.cu): 1 on, -1 off, 0 the default
// (off). The same bits either way.
void sm90_attention_force_forward_pingpong(int mode);
bool sm90_attention_forward_pingpong();
// Tests: every key tile of the forward whole (true), not the half diagonal tile of Note [Half
// diagonal tile] (attention_sm90_fwd.cu; without ping-pong and dropout only); false, the
// default, takes the halves. The same bits.
void sm90_attention_force_whole_diagonal(bool on);

// Shapes and checks as cuda::fused_attention / fused_attention_backward (attention.cu).
void sm90_attention_forward(const Tensor& qkv, int64_t heads, float scale, const DropoutSpec& d,
                            Tensor& y, Tensor& lse);
// rope_base > 0: dq and dk leave rotated back by rotary embeddings of that base; dqkv_sum
// (optional, [3·heads·64] in qkv's dtype): dqkv's column sums, from partials the kernels write
// (kernels/attention.h's fused_attention_backward).
void sm90_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                             const Tensor& lse, int64_t heads, float scale, const DropoutSpec& d,
                             Tensor& dqkv, double rope_base = 0, Tensor* dqkv_sum = nullptr,
                             const Tensor& row_scale = {});

}  // namespace ffn::cuda
