// tests/cuda_probe.cu — see tests/cuda_probe.h.
#include <curand_philox4x32_x.h>

#include "core/cuda/check.h"
#include "core/philox.h"
#include "tests/cuda_probe.h"

namespace ffn::test {

namespace {

__global__ void ours_kernel(uint64_t seed, uint64_t offset, int64_t nblocks, uint32_t* out) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= nblocks) return;
  const U32x4 r = philox_block(seed, offset, static_cast<uint64_t>(b));
  for (int j = 0; j < 4; ++j) out[4 * b + j] = r.v[j];
}

__global__ void curand_kernel(uint64_t seed, uint64_t offset, int64_t nblocks, uint32_t* out) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= nblocks) return;
  const uint64_t ub = static_cast<uint64_t>(b);
  uint4 c = make_uint4(static_cast<uint32_t>(ub), static_cast<uint32_t>(ub >> 32),
                       static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32));
  uint2 k = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint4 r = curand_Philox4x32_10(c, k);
  out[4 * b + 0] = r.x;
  out[4 * b + 1] = r.y;
  out[4 * b + 2] = r.z;
  out[4 * b + 3] = r.w;
}

template <class K>
std::vector<uint32_t> run(K kernel, uint64_t seed, uint64_t offset, int64_t nblocks) {
  uint32_t* d = nullptr;
  FFN_CHECK_CUDA(cudaMalloc(&d, nblocks * 16));
  kernel<<<static_cast<unsigned>((nblocks + 255) / 256), 256>>>(seed, offset, nblocks, d);
  FFN_CHECK_LAUNCH();
  std::vector<uint32_t> h(nblocks * 4);
  FFN_CHECK_CUDA(cudaMemcpy(h.data(), d, nblocks * 16, cudaMemcpyDeviceToHost));
  FFN_CHECK_CUDA(cudaFree(d));
  return h;
}

}  // namespace

std::vector<uint32_t> philox_words_gpu_ours(uint64_t seed, uint64_t offset, int64_t nblocks) {
  return run(ours_kernel, seed, offset, nblocks);
}
std::vector<uint32_t> philox_words_gpu_curand(uint64_t seed, uint64_t offset, int64_t nblocks) {
  return run(curand_kernel, seed, offset, nblocks);
}

}  // namespace ffn::test
