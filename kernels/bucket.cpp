// kernels/bucket.cpp — front door of kernels/bucket.h: argument checks, then the CPU
// reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/bucket.h"

namespace ffn {

namespace {
// parts against a slot of `slot` elements of `like`'s dtype and device.
void check_parts(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 const Tensor& like, int64_t slot, const char* op) {
  FFN_CHECK(parts.size() == offsets.size(), "[", op, "] ", parts.size(), " parts but ",
            offsets.size(), " offsets");
  FFN_CHECK(!parts.empty(), "[", op, "] no parts");
  int64_t end = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Tensor& p = parts[k];
    check_defined(p, op, "part");
    FFN_CHECK(p.dtype() == like.dtype(), "[", op, "] part ", k, " is ", dtype_name(p.dtype()),
              " but the bucket is ", dtype_name(like.dtype()));
    check_same_device(p, like, op, "part", "bucket");
    FFN_CHECK(p.is_contiguous(), "[", op, "] part ", k, " (", p.desc(), ") is not contiguous");
    FFN_CHECK(offsets[k] >= end && offsets[k] + p.numel() <= slot, "[", op, "] part ", k, " (",
              p.numel(), " elements at offset ", offsets[k],
              ") overlaps the part before it or ends past the slot of ", slot, " elements");
    end = offsets[k] + p.numel();
  }
}
}  // namespace

void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat, void* stream) {
  const char* op = "bucket_pack";
  check_defined(flat, op, "flat");
  FFN_CHECK(flat.dim() == 1 && flat.is_contiguous(),
            "[bucket_pack] flat must be a contiguous 1-D tensor, got ", flat.desc());
  check_parts(parts, offsets, flat, flat.numel(), op);
  if (flat.is_cuda()) return cuda::bucket_pack(parts, offsets, flat, stream);
  cpu::bucket_pack(parts, offsets, flat);
}

void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average) {
  const char* op = "bucket_mean";
  check_defined(slots, op, "slots");
  FFN_CHECK(world >= 1, "[bucket_mean] world must be >= 1, got ", world);
  FFN_CHECK(slots.dim() == 1 && slots.is_contiguous() && slots.numel() % world == 0,
            "[bucket_mean] slots must be a contiguous 1-D tensor of world (", world,
            ") equal slots, got ", slots.desc());
  FFN_CHECK(is_float(slots.dtype()), "[bucket_mean] slots must be a float tensor, got ",
            dtype_name(slots.dtype()));
  check_parts(parts, offsets, slots, slots.numel() / world, op);
  if (slots.is_cuda()) return cuda::bucket_mean(slots, world, offsets, parts, average);
  cpu::bucket_mean(slots, world, offsets, parts, average);
}

}  // namespace ffn
