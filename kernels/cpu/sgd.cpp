// kernels/cpu/sgd.cpp — front door and CPU reference of the SGD step.
#include "kernels/sgd.h"

#include <cmath>

#include "core/dispatch.h"

namespace ffn {

void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step) {
  check_defined(w, "sgd", "param");
  check_defined(g, "sgd", "grad");
  FFN_CHECK(w.shape() == g.shape(), "[sgd] param.shape=", shape_str(w.shape()),
            " != grad.shape=", shape_str(g.shape()));
  check_same_device(w, g, "sgd", "param", "grad");
  check_same_dtype(w, g, "sgd", "param", "grad");
  FFN_CHECK(w.is_contiguous(), "[sgd] param must be contiguous");
  FFN_CHECK(std::isfinite(h.lr) && h.lr >= 0, "[sgd] lr must be a finite number >= 0, got ", h.lr);
  FFN_CHECK(h.momentum >= 0 && h.momentum < 1, "[sgd] momentum must be in [0, 1), got ",
            h.momentum);
  FFN_CHECK(h.momentum > 0 || !h.nesterov, "[sgd] nesterov needs momentum > 0");
  if (h.momentum > 0) {
    FFN_CHECK(buf && buf->defined(), "[sgd] momentum > 0 needs a momentum buffer");
    FFN_CHECK(buf->shape() == w.shape() && buf->dtype() == w.dtype() &&
                  buf->device() == w.device() && buf->is_contiguous(),
              "[sgd] momentum buffer ", buf->desc(), " does not match param ", w.desc());
  }
  const Tensor gc = g.contiguous();
  Tensor* b = h.momentum > 0 ? buf : nullptr;
  if (w.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::sgd_step(w, gc, b, h, first_step);
#endif
  }
  cpu::sgd_step(w, gc, b, h, first_step);
}

namespace cpu {

void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step) {
  FFN_DISPATCH_FLOAT(w.dtype(), "sgd", [&]<class T>() {
    T* wp = w.data<T>();
    const T* gp = g.data<T>();
    T* bp = buf ? buf->data<T>() : nullptr;
    const int64_t n = w.numel();
    const T lr = T(h.lr), mom = T(h.momentum), wd = T(h.weight_decay);
    for (int64_t i = 0; i < n; ++i) {
      const T gi = gp[i] + wd * wp[i];
      T step = gi;
      if (bp) {
        bp[i] = first_step ? gi : mom * bp[i] + gi;
        step = h.nesterov ? gi + mom * bp[i] : bp[i];
      }
      wp[i] -= lr * step;
    }
  });
}

}  // namespace cpu
}  // namespace ffn
