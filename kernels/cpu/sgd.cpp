// kernels/cpu/sgd.cpp — the CPU reference of kernels/sgd.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/sgd.h"

#include <cmath>

#include "core/dispatch.h"

namespace ffn {

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
