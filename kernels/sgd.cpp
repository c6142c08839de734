// kernels/sgd.cpp — front door of kernels/sgd.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
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
    return cuda::sgd_step(w, gc, b, h, first_step);
  }
  cpu::sgd_step(w, gc, b, h, first_step);
}

}  // namespace ffn
