// kernels/adamw.cpp — front door of kernels/adamw.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/adamw.h"

#include <cmath>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
void validate(const std::vector<AdamWSlot>& slots, const AdamWHyper& h) {
  FFN_CHECK(std::isfinite(h.lr) && h.lr >= 0, "[adamw] lr must be >= 0, got ", h.lr);
  FFN_CHECK(h.beta1 >= 0 && h.beta1 < 1, "[adamw] beta1 must be in [0, 1), got ", h.beta1);
  FFN_CHECK(h.beta2 >= 0 && h.beta2 < 1, "[adamw] beta2 must be in [0, 1), got ", h.beta2);
  FFN_CHECK(h.eps > 0, "[adamw] eps must be > 0, got ", h.eps);
  FFN_CHECK(h.weight_decay >= 0, "[adamw] weight_decay must be >= 0, got ", h.weight_decay);
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdamWSlot& s = slots[i];
    check_defined(s.param, "adamw", "param");
    const DType acc = acc_dtype(s.param.dtype());
    FFN_CHECK(is_float(s.param.dtype()) && s.param.is_contiguous(), "[adamw] slot ", i,
              ": param must be a contiguous float tensor, got ", s.param.desc());
    detail::check_like(s.grad, s.param, s.param.shape(), "adamw", "grad");
    check_same_device(s.param, slots[0].param, "adamw", "param", "the first param");
    check_same_dtype(s.param, slots[0].param, "adamw", "param", "the first param");
    for (const Tensor* t : {&s.m, &s.v, &s.master}) {
      if (t == &s.master && !t->defined()) continue;
      check_defined(*t, "adamw", "state");
      check_shape(*t, s.param.shape(), "adamw", "state");
      check_same_device(*t, s.param, "adamw", "state", "param");
      FFN_CHECK(t->dtype() == acc && t->is_contiguous(), "[adamw] slot ", i, ": state must be ",
                "contiguous ", dtype_name(acc), ", got ", t->desc());
    }
    FFN_CHECK(s.master.defined() || !is_half(s.param.dtype()), "[adamw] slot ", i,
              ": 16-bit params need an fp32 master (Note [Master weights])");
  }
}
void check_decision(const Tensor& t, const char* name) {
  check_defined(t, "adamw", name);
  FFN_CHECK(t.dtype() == DType::f64 && t.is_contiguous() && t.numel() == kDecisionSize,
            "[adamw] ", name, " must be a contiguous f64 tensor of ", kDecisionSize,
            " values (Note [Device-side step decision]), got ", t.desc());
}
}  // namespace

void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale) {
  validate(slots, h);
  FFN_CHECK(step >= 1, "[adamw] step must be >= 1, got ", step);
  if (slots.empty()) return;
  if (slots[0].param.is_cuda()) {
    return cuda::adamw_step(slots, h, step, grad_scale);
  }
  cpu::adamw_step(slots, h, step, grad_scale);
}

void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h,
                const Tensor& decision) {
  validate(slots, h);
  check_decision(decision, "decision");
  if (slots.empty()) return;
  check_same_device(decision, slots[0].param, "adamw", "decision", "param");
  if (decision.is_cuda()) {
    return cuda::adamw_step(slots, h, 1, 1.0, decision.data<double>());
  }
  const double* d = decision.data<double>();
  if (d[1] == 0.0) return;  // skipped: nothing changes
  AdamWHyper at = h;
  at.lr = d[7];
  cpu::adamw_step(slots, at, static_cast<int64_t>(d[0]), d[4]);
}

Tensor global_grad_sumsq(const std::vector<Tensor>& grads) {
  FFN_CHECK(!grads.empty(), "[grad_norm] needs at least one gradient");
  for (const Tensor& g : grads) {
    check_defined(g, "grad_norm", "grad");
    FFN_CHECK(is_float(g.dtype()) && g.is_contiguous(), "[grad_norm] grads must be contiguous ",
              "float tensors, got ", g.desc());
    check_same_device(g, grads[0], "grad_norm", "grad", "the first grad");
    check_same_dtype(g, grads[0], "grad_norm", "grad", "the first grad");
  }
  if (grads[0].is_cuda()) {
    return cuda::global_grad_sumsq(grads);
  }
  return cpu::global_grad_sumsq(grads);
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  return grads.empty() ? 0.0 : std::sqrt(global_grad_sumsq(grads).item());
}

void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision) {
  check_decision(decision, "decision");
  for (const Tensor* t : {&loss, &sumsq}) {
    const char* name = t == &loss ? "loss" : "sumsq";
    check_defined(*t, "adamw", name);
    FFN_CHECK(is_float(t->dtype()) && t->numel() == 1, "[adamw] ", name,
              " must be a one-element float tensor, got ", t->desc());
    check_same_device(*t, decision, "adamw", name, "decision");
  }
  FFN_CHECK(d.grad_divisor > 0 && std::isfinite(d.grad_divisor),
            "[adamw] grad_divisor must be > 0, got ", d.grad_divisor);
  FFN_CHECK(d.grad_clip >= 0, "[adamw] grad_clip must be >= 0, got ", d.grad_clip);
  FFN_CHECK(d.beta1 >= 0 && d.beta1 < 1 && d.beta2 >= 0 && d.beta2 < 1,
            "[adamw] betas must be in [0, 1), got ", d.beta1, ", ", d.beta2);
  if (decision.is_cuda()) {
    return cuda::adamw_decide(loss, sumsq, d, decision);
  }
  cpu::adamw_decide(loss, sumsq, d, decision);
}

}  // namespace ffn
