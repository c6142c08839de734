// kernels/rope.cpp — front door of kernels/rope.h: argument checks, then the CPU reference
// (kernels/cpu/) or the CUDA kernel (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/rope.h"

#include <cmath>

#include "kernels/checks.h"

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

}  // namespace ffn
