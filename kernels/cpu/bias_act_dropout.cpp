// kernels/cpu/bias_act_dropout.cpp — the CPU reference of kernels/bias_act_dropout.h (plain
// loops or Eigen, sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested
// against. The element loops run their rows on OpenMP's threads (kernels/cpu/parallel.h).
#include "kernels/bias_act_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"
#include "kernels/cpu/parallel.h"

namespace ffn {

namespace cpu {

void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_act_dropout", [&]<class T>() {
    const int64_t m = z.size(0), n = z.size(1);
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* out = hd.data<T>();
    FFN_OMP_PARALLEL_FOR_WORK(m * n)
    {
      MaskCursor mask(d);
      FFN_OMP_FOR
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const int64_t i = r * n + c;
          const T pre = zp[i] + (bp ? bp[c] : T(0));
          out[i] =
              act_math::value(pre, act) * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
        }
    }
  });
}

void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor* dpre, Tensor* db,
                               Tensor* hd) {
  FFN_DISPATCH_FLOAT(dhd.dtype(), "bias_act_dropout_backward", [&]<class T>() {
    const int64_t m = dhd.size(0), n = dhd.size(1);
    const T* g = dhd.data<T>();
    const T* zp = z.defined() ? z.data<T>() : nullptr;  // undefined only for identity
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    // db sums dpre's rows in order in a pass of its own, after the parallel one (so the sum
    // is the same whatever the threads); without dpre, into a scratch buffer.
    std::vector<T> scratch(db && !dpre ? m * n : 0);
    T* dp = dpre ? dpre->data<T>() : db ? scratch.data() : nullptr;
    T* hp = hd ? hd->data<T>() : nullptr;
    FFN_OMP_PARALLEL_FOR_WORK(m * n)
    {
      MaskCursor mask(d);
      FFN_OMP_FOR
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const int64_t i = r * n + c;
          const T pre = (zp ? zp[i] : T(0)) + (bp ? bp[c] : T(0));
          const T f = static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
          T val, dact;
          act_math::value_grad(pre, act, val, dact);
          const T v = g[i] * f * dact;
          if (dp) dp[i] = v;
          if (hp) hp[i] = val * f;
        }
    }
    if (db) {
      std::vector<double> acc(n, 0.0);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) acc[c] += static_cast<double>(dp[r * n + c]);
      for (int64_t c = 0; c < n; ++c) db->data<T>()[c] = static_cast<T>(acc[c]);
    }
  });
}

}  // namespace cpu
}  // namespace ffn
