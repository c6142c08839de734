// kernels/cpu/bias_dropout.cpp — front door and CPU reference of bias_dropout / dropout_dbias.
#include "kernels/bias_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

namespace ffn {

void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y) {
  detail::check_matrix(z, "bias_dropout", "z");
  detail::check_dropout(d, "bias_dropout");
  if (b.defined()) detail::check_like(b, z, {z.size(1)}, "bias_dropout", "b");
  detail::check_like(y, z, z.shape(), "bias_dropout", "y");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::bias_dropout(zc, bc, d, y);
#endif
  }
  cpu::bias_dropout(zc, bc, d, y);
}

void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db) {
  detail::check_matrix(dy, "dropout_dbias", "dy");
  detail::check_dropout(d, "dropout_dbias");
  if (dz) detail::check_like(*dz, dy, dy.shape(), "dropout_dbias", "dz");
  if (db) detail::check_like(*db, dy, {dy.size(1)}, "dropout_dbias", "db");
  const Tensor dyc = dy.contiguous();
  if (dy.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::dropout_dbias(dyc, d, dz, db);
#endif
  }
  cpu::dropout_dbias(dyc, d, dz, db);
}

namespace cpu {

void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y) {
  FFN_DISPATCH_FLOAT(z.dtype(), "bias_dropout", [&]<class T>() {
    const int64_t m = z.size(0), n = z.size(1);
    const T* zp = z.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* yp = y.data<T>();
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        const T v = zp[i] + (bp ? bp[c] : T(0));
        yp[i] = v * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
      }
  });
}

void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db) {
  FFN_DISPATCH_FLOAT(dy.dtype(), "dropout_dbias", [&]<class T>() {
    const int64_t m = dy.size(0), n = dy.size(1);
    const T* g = dy.data<T>();
    T* out = dz ? dz->data<T>() : nullptr;
    std::vector<double> acc(db ? n : 0, 0.0);
    MaskCursor mask(d);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        const T v = g[i] * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
        if (out) out[i] = v;
        if (db) acc[c] += static_cast<double>(v);
      }
    if (db)
      for (int64_t c = 0; c < n; ++c) db->data<T>()[c] = static_cast<T>(acc[c]);
  });
}

}  // namespace cpu
}  // namespace ffn
