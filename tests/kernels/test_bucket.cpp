// tests/kernels/test_bucket.cpp — a gradient bucket's pack and mean passes (kernels/bucket.h):
// the CPU reference against sums written out, its argument checks, and the CUDA kernels
// against the reference bit for bit (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#if FFN_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "kernels/bucket.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

namespace {
// Parts of odd and aligned sizes (one element, a 16-byte group and a bit, a GPT bias, a
// matrix) at offsets with gaps, some not 16-byte aligned.
const std::vector<int64_t> kSizes = {1, 9, 768, 3 * 1000 + 5, 4096};
std::vector<int64_t> offsets_for(const std::vector<int64_t>& sizes, int64_t gap) {
  std::vector<int64_t> off;
  int64_t at = gap;
  for (int64_t n : sizes) {
    off.push_back(at);
    at += n + gap;
  }
  return off;
}
int64_t slot_for(const std::vector<int64_t>& sizes, int64_t gap) {
  return offsets_for(sizes, gap).back() + sizes.back() + gap;
}
// A stream beside the compute stream (the communicator's kind), as an opaque handle.
struct SideStream {
  void* s = nullptr;
  SideStream() {
#if FFN_WITH_CUDA
    cudaStream_t st;
    REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    s = st;
#endif
  }
  // Everything queued on the compute stream (the inputs' uploads, zero fills) done first:
  // the side stream does not wait for it by itself.
  static void settle() {
#if FFN_WITH_CUDA
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#endif
  }
  void sync() const {
#if FFN_WITH_CUDA
    REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(s)) == cudaSuccess);
#endif
  }
  ~SideStream() {
#if FFN_WITH_CUDA
    cudaStreamDestroy(static_cast<cudaStream_t>(s));
#endif
  }
};
}  // namespace

TEST_CASE("bucket_pack / bucket_mean on the CPU: parts placed, ranks summed in order") {
  Generator g(5);
  const std::vector<int64_t> sizes = {3, 1, 4};
  const std::vector<int64_t> off = offsets_for(sizes, 2);
  const int64_t slot = slot_for(sizes, 2);
  std::vector<Tensor> parts;
  for (int64_t n : sizes) parts.push_back(rand64({n}, g));
  Tensor flat = Tensor::zeros({slot}, DType::f64);
  bucket_pack(parts, off, flat);
  const auto f = flat.to_vector();
  for (size_t k = 0; k < parts.size(); ++k) {
    const auto p = parts[k].to_vector();
    for (int64_t i = 0; i < sizes[k]; ++i) CHECK(f[off[k] + i] == p[i]);
  }
  CHECK(f[0] == 0.0);  // the gaps stay as they were
  CHECK(f[off[1] - 1] == 0.0);
  for (int64_t world : {1, 2, 3}) {
    const Tensor slots = rand64({world * slot}, g);
    const auto s = slots.to_vector();
    for (bool average : {true, false}) {
      std::vector<Tensor> out;
      for (int64_t n : sizes) out.push_back(Tensor::zeros({n}, DType::f64));
      bucket_mean(slots, world, off, out, average);
      for (size_t k = 0; k < out.size(); ++k) {
        const auto o = out[k].to_vector();
        for (int64_t i = 0; i < sizes[k]; ++i) {
          double want = 0;
          for (int64_t r = 0; r < world; ++r) want += s[r * slot + off[k] + i];
          if (average) want /= static_cast<double>(world);
          CHECK(o[i] == want);
        }
      }
    }
  }
  // bf16: the fp32 mean rounded once: (1 + 2^-7 + 1) / 2 = 1 + 2^-8 is halfway between the
  // bf16s 1 and 1 + 2^-7 and rounds to even, 1.
  const Tensor s16 =
      Tensor::from_vector({1.0, 1.0 + std::ldexp(1.0, -7), 1.0, 1.0}, {4}, DType::f64)
          .to(DType::bf16);
  std::vector<Tensor> o16 = {Tensor::zeros({2}, DType::bf16)};
  bucket_mean(s16, 2, {0}, o16, true);
  const auto v16 = o16[0].to_vector();
  CHECK(v16[0] == 1.0);  // (1 + 1) / 2
  CHECK(v16[1] == 1.0);
}

TEST_CASE("bucket_pack / bucket_mean reject what does not fit, naming the op") {
  Tensor flat = Tensor::zeros({8}, DType::f32);
  std::vector<Tensor> parts = {Tensor::zeros({5}, DType::f32)};
  CHECK_THROWS_WITH_AS(bucket_pack(parts, {4}, flat),
                       doctest::Contains("[bucket_pack] part 0 (5 elements at offset 4) overlaps "
                                         "the part before it or ends past the slot of 8"),
                       Error);
  std::vector<Tensor> two = {Tensor::zeros({2}, DType::f32), Tensor::zeros({2}, DType::f32)};
  CHECK_THROWS_WITH_AS(bucket_pack(two, {0, 1}, flat), doctest::Contains("part 1"), Error);
  std::vector<Tensor> wrong = {Tensor::zeros({2}, DType::f64)};
  CHECK_THROWS_WITH_AS(bucket_pack(wrong, {0}, flat),
                       doctest::Contains("[bucket_pack] part 0 is f64 but the bucket is f32"),
                       Error);
  CHECK_THROWS_WITH_AS(bucket_mean(Tensor::zeros({9}, DType::f32), 2, {0}, parts, true),
                       doctest::Contains("[bucket_mean] slots must be a contiguous 1-D tensor "
                                         "of world (2) equal slots"),
                       Error);
  CHECK_THROWS_WITH_AS(bucket_pack(parts, {}, flat),
                       doctest::Contains("[bucket_pack] 1 parts but 0 offsets"), Error);
}

// More parts than one launch's table (32), unaligned parts and offsets, 1-3 ranks; every
// dtype; the pack on a stream of its own, as the communicator runs it.
FFN_GPU_TEST("bucket_pack / bucket_mean on the GPU equal the CPU bit for bit") {
  Generator g(17);
  std::vector<int64_t> sizes;
  for (int rep = 0; rep < 8; ++rep) sizes.insert(sizes.end(), kSizes.begin(), kSizes.end());
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16})
    for (int64_t gap : {0, 3, 8}) {
      const std::vector<int64_t> off = offsets_for(sizes, gap);
      const int64_t slot = slot_for(sizes, gap);
      std::vector<Tensor> parts, parts_g;
      for (size_t k = 0; k < sizes.size(); ++k) {
        parts.push_back(rand64({sizes[k]}, g).to(dt));
        // every third part misaligned on the GPU (a view one element in)
        Tensor pg = parts.back().to(kGpu);
        parts_g.push_back(k % 3 == 1 ? misaligned(pg) : pg);
      }
      Tensor flat = Tensor::zeros({slot}, dt), flat_g = Tensor::zeros({slot}, dt, kGpu);
      bucket_pack(parts, off, flat);
      const SideStream side;
      SideStream::settle();
      bucket_pack(parts_g, off, flat_g, side.s);
      side.sync();
      CHECK_MESSAGE(
          max_abs_diff(flat_g.to(Device::cpu()).to(DType::f64), flat.to(DType::f64)) == 0.0,
          "pack ", dtype_name(dt), " gap ", gap);
      for (int64_t world : {1, 2, 3}) {
        const Tensor slots = rand64({world * slot}, g).to(dt);
        std::vector<Tensor> out, out_g;
        for (int64_t n : sizes) {
          out.push_back(Tensor::zeros({n}, dt));
          out_g.push_back(Tensor::zeros({n}, dt, kGpu));
        }
        bucket_mean(slots, world, off, out, true);
        bucket_mean(slots.to(kGpu), world, off, out_g, true);
        double worst = 0;
        for (size_t k = 0; k < out.size(); ++k)
          worst = std::max(worst, max_abs_diff(out_g[k].to(Device::cpu()).to(DType::f64),
                                               out[k].to(DType::f64)));
        CHECK_MESSAGE(worst == 0.0, "mean ", dtype_name(dt), " gap ", gap, " world ", world);
      }
    }
}
