// kernels/cpu/bias_glu_dropout.cpp — the CPU reference of kernels/bias_glu_dropout.h (plain
// loops or Eigen, sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested
// against. The element loops run their rows on OpenMP's threads (kernels/cpu/parallel.h).
#include "kernels/bias_glu_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"
#include "kernels/cpu/parallel.h"

namespace ffn {

namespace cpu {

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_glu_dropout", [&]<class T>() {
    const int64_t m = z.size(0), h = z.size(1) / 2;
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* o = out.data<T>();
    FFN_OMP_PARALLEL_FOR_WORK(m * h)
    {
      MaskCursor mask(d);
      FFN_OMP_FOR
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < h; ++c) {
          const T v = zp[r * 2 * h + c] + (bp ? bp[c] : T(0));
          const T g = zp[r * 2 * h + h + c] + (bp ? bp[h + c] : T(0));
          const int64_t i = r * h + c;
          o[i] = v * act_math::value(g, act) *
                 static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
        }
    }
  });
}

void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_glu_dropout_backward", [&]<class T>() {
    const int64_t m = z.size(0), h = z.size(1) / 2;
    const T* gp = dout.data<T>();
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* dzp = dz.data<T>();
    T* o = out ? out->data<T>() : nullptr;
    FFN_OMP_PARALLEL_FOR_WORK(m * h)
    {
      MaskCursor mask(d);
      FFN_OMP_FOR
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < h; ++c) {
          const T v = zp[r * 2 * h + c] + (bp ? bp[c] : T(0));
          const T g = zp[r * 2 * h + h + c] + (bp ? bp[h + c] : T(0));
          const int64_t i = r * h + c;
          const T f = static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
          const T s = gp[i] * f;
          T a, da;
          act_math::value_grad(g, act, a, da);
          dzp[r * 2 * h + c] = s * a;
          dzp[r * 2 * h + h + c] = s * v * da;
          if (o) o[i] = v * a * f;
        }
    }
    if (db) {  // dz's rows summed in order, in a pass of their own (the same whatever the threads)
      std::vector<double> acc(2 * h, 0.0);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < 2 * h; ++c) acc[c] += static_cast<double>(dzp[r * 2 * h + c]);
      for (int64_t c = 0; c < 2 * h; ++c) db->data<T>()[c] = static_cast<T>(acc[c]);
    }
  });
}

}  // namespace cpu
}  // namespace ffn
