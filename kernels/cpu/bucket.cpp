// kernels/cpu/bucket.cpp — the CPU reference of kernels/bucket.h: the same sums in the same
// order and precision as the kernels, so both give the same bits.
#include "kernels/bucket.h"

#include <cstring>
#include <type_traits>

#include "core/dispatch.h"

namespace ffn::cpu {

void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat) {
  char* base = static_cast<char*>(flat.data_ptr());
  const size_t es = dtype_size(flat.dtype());
  for (size_t k = 0; k < parts.size(); ++k)
    std::memcpy(base + static_cast<size_t>(offsets[k]) * es, parts[k].data_ptr(),
                static_cast<size_t>(parts[k].numel()) * es);
}

void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average) {
  const int64_t slot = slots.numel() / world;
  FFN_DISPATCH_ALL(slots.dtype(), "bucket_mean", [&]<class T>() {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* s = slots.data<T>();
    for (size_t k = 0; k < parts.size(); ++k) {
      T* out = parts[k].data<T>();
      for (int64_t i = 0; i < parts[k].numel(); ++i) {
        A acc = 0;
        for (int64_t r = 0; r < world; ++r)
          acc += detail::cast_value<A>(s[r * slot + offsets[k] + i]);
        if (average) acc /= static_cast<A>(world);
        out[i] = detail::cast_value<T>(acc);
      }
    }
  });
}

}  // namespace ffn::cpu
