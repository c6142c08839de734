// layers/functional.h — differentiable ops on Vars (each records one autograd Node).
//
// Tensor-shaped arguments may have any number of leading dimensions; ops work
// on the flattened [rows, last_dim] view. Dropout specs come from the caller's
// Generator (Generator::dropout) so every call gets its own mask.
#pragma once

#include "core/autograd.h"
#include "core/philox.h"
#include "layers/ffn_functional.h"

namespace ffn::fn {

// y = x · Wᵀ + b.  x: [..., in], w: [out, in], b: [out] (optional, may be an undefined Var).
Var linear(const Var& x, const Var& w, const Var& b);
// y = x ⊙ mask · 1/(1-p) (identity when d.p = 0).
Var dropout(const Var& x, const DropoutSpec& d);
// y = a + b (same shape).
Var add(const Var& a, const Var& b);
// loss = mean((pred - target)²), shape []. target gets no gradient.
Var mse_loss(const Var& pred, const Tensor& target);
// The fused FFN block (layers/ffn_functional.h) as one node; x: [..., d].
Var ffn(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2,
        const FfnConfig& cfg, const FfnDropout& d);

}  // namespace ffn::fn
