// kernels/rope.cpp — front door of kernels/rope.h: argument checks, then the CPU reference
// (kernels/cpu/) or the CUDA kernel (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/rope.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "kernels/scale.h"

namespace ffn {

void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out) {
  const char* op = "rope";
  check_defined(qkv, op, "qkv");
  FFN_CHECK(qkv.dim() == 3, "[rope] qkv must be [B, T, (heads + 2·kv_heads)·head_dim], got ",
            shape_str(qkv.shape()));
  FFN_CHECK(is_float(qkv.dtype()), "[rope] qkv must be a float tensor, got ",
            dtype_name(qkv.dtype()));
  FFN_CHECK(heads > 0 && kv_heads > 0, "[rope] heads=", heads, " and kv_heads=", kv_heads,
            " must be > 0");
  const int64_t width = qkv.size(2), slots = heads + 2 * kv_heads;
  FFN_CHECK(width % slots == 0, "[rope] qkv's last dimension ", width,
            " is not a multiple of heads + 2·kv_heads = ", slots);
  const int64_t d = width / slots;
  FFN_CHECK(d % 2 == 0, "[rope] the head size must be even, got ", d);
  FFN_CHECK(std::isfinite(base) && base > 0, "[rope] base must be > 0, got ", base);
  detail::check_like(out, qkv, qkv.shape(), op, "out");
  FFN_CHECK(out.is_contiguous(), "[rope] out must be contiguous");
  const Tensor c = qkv.contiguous();
  if (c.is_cuda()) {
    return cuda::rope(c, heads, kv_heads, base, inverse, out);
  }
  cpu::rope(c, heads, kv_heads, base, inverse, out);
}

void linear_rope(const Tensor& x, const Tensor& w, int64_t heads, int64_t kv_heads, double base,
                 Tensor& out, const Tensor& row_scale) {
  const char* op = "linear_rope";
  check_defined(x, op, "x");
  check_defined(w, op, "w");
  FFN_CHECK(x.dim() == 3 && w.dim() == 2 && x.size(2) == w.size(1), "[", op,
            "] x must be [B, T, C] and w [(heads + 2·kv_heads)·head_dim, C]; got x ",
            shape_str(x.shape()), ", w ", shape_str(w.shape()));
  check_same_device(w, x, op, "w", "x");
  check_same_dtype(w, x, op, "w", "x");
  detail::check_like(out, x, {x.size(0), x.size(1), w.size(0)}, op, "out");
  FFN_CHECK(heads > 0 && kv_heads > 0 && w.size(0) % (heads + 2 * kv_heads) == 0, "[", op, "] w's ",
            w.size(0), " rows are not (heads + 2·kv_heads)·head_dim for heads=", heads,
            ", kv_heads=", kv_heads);
  const int64_t d = w.size(0) / (heads + 2 * kv_heads);
  FFN_CHECK(d % 2 == 0, "[", op, "] the head size must be even, got ", d);
  FFN_CHECK(std::isfinite(base) && base > 0, "[", op, "] base must be > 0, got ", base);
  if (row_scale.defined()) {
    check_shape(row_scale, {x.size(0) * x.size(1)}, op, "row_scale");
    check_same_device(row_scale, x, op, "row_scale", "x");
    FFN_CHECK(row_scale.dtype() == acc_dtype(x.dtype()) && row_scale.is_contiguous(), "[", op,
              "] row_scale must be a contiguous ", dtype_name(acc_dtype(x.dtype())),
              " tensor, got ", row_scale.desc());
  }
  const Tensor x2 = x.contiguous().view_2d();
  Tensor o2 = out.view_2d();
  if (x.is_cuda() && gemm_epilogues() && d == 64 &&
      cuda::sm90_gemm_supported(x2, w, o2, false, true) && o2.size(1) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(o2.data_ptr()) % 16 == 0) {
    return cuda::sm90_gemm(x2, w, o2,
                           {.trans_b = true,
                            .rope_base = base,
                            .rope_seq = x.size(1),
                            .rope_cols = (heads + kv_heads) * d,
                            .row_scale = row_scale});
  }
  Tensor qkv = matmul(x2, w, {.trans_b = true});
  if (row_scale.defined()) scale_rows(qkv, row_scale, qkv);
  rope(qkv.reshape(out.shape()), heads, kv_heads, base, /*inverse=*/false, out);
}

}  // namespace ffn
