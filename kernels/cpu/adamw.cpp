// kernels/cpu/adamw.cpp — the CPU reference of kernels/adamw.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
// Covers the fused AdamW step, the global gradient norm and the step decision
// (Note [Device-side step decision]).
#include "kernels/adamw.h"

#include <cmath>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  for (const AdamWSlot& s : slots) {
    FFN_DISPATCH_FLOAT(acc_dtype(s.param.dtype()), "adamw", [&]<class A>() {
      const int64_t n = s.param.numel();
      A* w = s.master.defined() ? s.master.data<A>() : s.param.data<A>();
      A* m = s.m.data<A>();
      A* v = s.v.data<A>();
      const Tensor g = s.grad.to(acc_dtype(s.grad.dtype()));
      const A* gp = g.data<A>();
      const A decay = static_cast<A>(1.0 - h.lr * (s.decay ? h.weight_decay : 0.0));
      for (int64_t i = 0; i < n; ++i) {
        const A gi = gp[i] * static_cast<A>(grad_scale);
        w[i] *= decay;
        m[i] = static_cast<A>(h.beta1) * m[i] + static_cast<A>(1 - h.beta1) * gi;
        v[i] = static_cast<A>(h.beta2) * v[i] + static_cast<A>(1 - h.beta2) * gi * gi;
        const A mh = m[i] / static_cast<A>(bc1), vh = v[i] / static_cast<A>(bc2);
        w[i] -= static_cast<A>(h.lr) * mh / (std::sqrt(vh) + static_cast<A>(h.eps));
      }
    });
    if (s.master.defined()) const_cast<Tensor&>(s.param).copy_(s.master);
  }
}

Tensor global_grad_sumsq(const std::vector<Tensor>& grads) {
  double sum = 0;
  for (const Tensor& g : grads)
    for (double x : g.to_vector()) sum += x * x;
  return Tensor::full({1}, sum, DType::f64);
}

void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision) {
  double* o = decision.data<double>();
  const double l = loss.item();
  const double norm = std::sqrt(sumsq.item()) / d.grad_divisor;
  const bool apply = std::isfinite(l) && std::isfinite(norm);
  if (apply) o[0] += 1;
  double scale = 1.0 / d.grad_divisor;
  if (d.grad_clip > 0 && norm > d.grad_clip) scale *= d.grad_clip / (norm + 1e-6);
  o[1] = apply ? 1.0 : 0.0;
  o[2] = 1.0 - std::pow(d.beta1, o[0]);
  o[3] = 1.0 - std::pow(d.beta2, o[0]);
  o[4] = scale;
  o[5] = l;
  o[6] = norm;
}

}  // namespace cpu
}  // namespace ffn
