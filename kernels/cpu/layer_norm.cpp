// kernels/cpu/layer_norm.cpp — the CPU reference of kernels/layer_norm.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/layer_norm.h"

#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd) {
  FFN_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&]<class T>() {
    const int64_t m = x.size(0), c = x.size(1);
    const T* xp = x.data<T>();
    const T* wp = w.data<T>();
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    T* yp = y.defined() ? y.data<T>() : nullptr;        // none: the statistics only
    T* mp = mean.defined() ? mean.data<T>() : nullptr;  // none: RMSNorm (mean held at 0)
    T* rp = rstd.data<T>();
    for (int64_t i = 0; i < m; ++i) {
      const T* row = xp + i * c;
      double mu = 0, var = 0;
      if (mp) {
        for (int64_t j = 0; j < c; ++j) mu += row[j];
        mu /= static_cast<double>(c);
      }
      for (int64_t j = 0; j < c; ++j) var += (row[j] - mu) * (row[j] - mu);
      var /= static_cast<double>(c);
      const double r = 1.0 / std::sqrt(var + eps);
      if (mp) mp[i] = static_cast<T>(mu);
      rp[i] = static_cast<T>(r);
      if (yp)
        for (int64_t j = 0; j < c; ++j)
          yp[i * c + j] = static_cast<T>((row[j] - mu) * r * wp[j] + (bp ? bp[j] : T(0)));
    }
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate_dx,
                         bool prescaled) {
  FFN_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&]<class T>() {
    const int64_t m = x.size(0), c = x.size(1);
    const T* xp = x.data<T>();
    const T* g = dy.data<T>();
    const T* wp = w.data<T>();
    const T* mp = mean.defined() ? mean.data<T>() : nullptr;  // none: RMSNorm
    const T* rp = rstd.data<T>();
    std::vector<double> aw(c, 0.0), ab(c, 0.0), xh(c);
    for (int64_t i = 0; i < m; ++i) {
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < c; ++j) {
        xh[j] = (xp[i * c + j] - (mp ? static_cast<double>(mp[i]) : 0.0)) * rp[i];
        const double gj = static_cast<double>(g[i * c + j]) * wp[j];
        s1 += gj;
        s2 += gj * xh[j];
        // prescaled (RMSNorm): g holds rstd·dy, so dy ⊙ x̂ is g ⊙ x.
        aw[j] += g[i * c + j] * (prescaled ? static_cast<double>(xp[i * c + j]) : xh[j]);
        ab[j] += g[i * c + j];
      }
      s1 = mp ? s1 / static_cast<double>(c) : 0.0;  // RMSNorm has no mean term
      s2 /= static_cast<double>(c);
      if (dx)
        for (int64_t j = 0; j < c; ++j) {
          const double gj = static_cast<double>(g[i * c + j]) * wp[j];
          T& out = dx->data<T>()[i * c + j];
          const double v = (prescaled ? 1.0 : static_cast<double>(rp[i])) * (gj - s1 - xh[j] * s2);
          out = static_cast<T>(accumulate_dx ? static_cast<double>(out) + v : v);
        }
    }
    for (int64_t j = 0; j < c; ++j) {
      if (dw) dw->data<T>()[j] = static_cast<T>(aw[j]);
      if (db) db->data<T>()[j] = static_cast<T>(ab[j]);
    }
  });
}

}  // namespace cpu
}  // namespace ffn
