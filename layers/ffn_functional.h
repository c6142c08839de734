// layers/ffn_functional.h — the fused FFN block as two tensor-level functions.
//
// FeedForward, GatedFeedForward and the benchmarks all run these, so what is
// timed is what users train with. With x: [M, d] (callers flatten leading dims):
//   z  = x · W1ᵀ                                   [M, H1]  (H1 = h, or 2h when gated)
//   hd = dropout_h(act(z + b1))                    plain   (bias_act_dropout)
//   hd = dropout_h(v ⊙ act(g)), [v | g] = z + b1   gated   (bias_glu_dropout)
//   y  = dropout_o(hd · W2ᵀ + b2)                  [M, d_out]
// Any of b1, W2, b2 may be absent; without W1 the input is z itself (x = z),
// which is the `welder_fc2` workload. Without W2, y = hd (the `geglu_*` workloads).
//
// Note [FFN saved state]
// ~~~~~~~~~~~~~~~~~~~~~~
// Between forward and backward the block keeps x (its input, owned by the
// caller), z (unless recompute is on or W1 is absent; z + b1 when fc1 ran with the
// GELU_AUX_BIAS epilogue) and the two DropoutSpecs.
// Never the mask, never hd or the activation: backward regenerates the mask
// from the specs and recomputes hd from z in the same kernel that computes dz
// and db1 (bias_act_dropout_backward / bias_glu_dropout_backward).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn {

struct FfnParams {
  Tensor w1, b1, w2, b2;  // w1: [H1, d], b1: [H1], w2: [d_out, h], b2: [d_out]; each optional
  // Optional, [M] in acc_dtype(x) (f32 for 16-bit x), needs w1 (Note [RMSNorm folded into the
  // FFN] in layers/ffn_nodes.cpp):
  // fc1's product scaled by rows, z = diag(row_scale)·x·W1ᵀ (+ b1 after it), a constant:
  // the backward's dx and dw1 are the gradients of that function with respect to x and W1.
  Tensor row_scale;
};

struct FfnConfig {
  Activation act = Activation::gelu_erf;
  bool gated = false;      // GEGLU / SwiGLU: W1 has 2h rows, value half first
  bool recompute = false;  // save nothing but x; recompute z = x·W1ᵀ in backward
};

struct FfnDropout {
  DropoutSpec hidden;  // on hd
  DropoutSpec out;     // on y (needs W2)
};

struct FfnForward {
  Tensor y;
  Tensor z;  // the saved activation; undefined with recompute or without W1
  // z already holds z + b1 (the GELU_AUX_BIAS epilogue path, see ffn_forward).
  bool z_has_bias = false;
};

struct FfnGrads {
  Tensor dx, dw1, db1, dw2, db2;  // undefined where the matching input is absent / not needed
};

// Validates shapes, dtypes and devices of x and params (errors name the tensor and shapes).
void ffn_check(const Tensor& x, const FfnParams& p, const FfnConfig& cfg, const FfnDropout& d);

FfnForward ffn_forward(const Tensor& x, const FfnParams& p, const FfnConfig& cfg,
                       const FfnDropout& d);

// `saved` is ffn_forward's result (its z may be undefined with recompute); its y is not
// used. x, p, cfg and d must be the ones ffn_forward was given and checked (they are not
// checked again); dy and the saved z are. need_dx = false skips dx. db2, when defined, is
// the column sum of dy that the pass writing dy already took (Note [Branch bias gradient] in
// layers/functional.cpp); it becomes the gradient of b2 (with d.out inactive) instead of a
// column-sum pass.
FfnGrads ffn_backward(const Tensor& dy, const Tensor& x, const FfnForward& saved,
                      const FfnParams& p, const FfnConfig& cfg, const FfnDropout& d,
                      bool need_dx = true, const Tensor& db2 = {});

}  // namespace ffn
