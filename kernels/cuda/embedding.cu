// kernels/cuda/embedding.cu — embedding gather and its deterministic backward
// (kernels/embedding.h).
//
// Backward: the (id, position) pairs are sorted by id with CUB's stable radix sort, so
// each id's positions come out in increasing order; one block per run of equal ids
// sums those rows of d_out in that order (fp32) and writes the table row once. No
// float atomics, so the result is bitwise reproducible for given ids.
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/embedding.h"

namespace ffn::cuda {

namespace {

template <class T>
__global__ void gather_kernel(const int32_t* ids, const T* table, T* out, int64_t n, int64_t c) {
  const int64_t total = n * c;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / c, j = k - i * c;
    out[k] = table[int64_t{ids[i]} * c + j];
  }
}

// Block b looks at sorted position b; if it starts a run of equal ids, it sums the run.
template <class T>
__global__ void segment_sum_kernel(const int32_t* keys, const int32_t* pos, const T* d_out,
                                   T* d_table, int64_t n, int64_t c) {
  const int64_t s = blockIdx.x;
  const int32_t id = keys[s];
  if (s > 0 && keys[s - 1] == id) return;
  int64_t e = s + 1;
  while (e < n && keys[e] == id) ++e;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    acc_t<T> acc = 0;
    for (int64_t r = s; r < e; ++r) acc += to_acc(d_out[int64_t{pos[r]} * c + j]);
    d_table[int64_t{id} * c + j] = from_acc<T>(acc);
  }
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<int32_t>(i);
}

__global__ void bad_index_kernel(const int32_t* ids, int64_t n, int64_t limit,
                                 unsigned long long* first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    if (ids[i] < 0 || ids[i] >= limit) atomicMin(first, static_cast<unsigned long long>(i));
}

}  // namespace

int64_t first_bad_index(const Tensor& ids, int64_t limit) {
  const int dev = ids.device().index;
  DeviceGuard guard(dev);
  const int64_t n = ids.numel();
  if (n == 0) return -1;
  Tensor flag = Tensor::empty({2}, DType::i32, ids.device());  // one u64
  auto* f = static_cast<unsigned long long*>(flag.data_ptr());
  cudaStream_t s = stream(dev);
  FFN_CHECK_CUDA(cudaMemsetAsync(f, 0xff, sizeof(unsigned long long), s));
  bad_index_kernel<<<grid_for(n, 256, 4096), 256, 0, s>>>(static_cast<const int32_t*>(ids.data_ptr()),
                                                        n, limit, f);
  FFN_CHECK_LAUNCH();
  unsigned long long host = 0;
  FFN_CHECK_CUDA(cudaMemcpyAsync(&host, f, sizeof(host), cudaMemcpyDeviceToHost, s));
  synchronize(dev);
  return host == ~0ull ? -1 : static_cast<int64_t>(host);
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  const int64_t n = ids.size(0), c = table.size(1);
  if (n * c == 0) return;
  FFN_DISPATCH_ALL(table.dtype(), "embedding", [&]<class H>() {
    using T = device_t<H>;
    gather_kernel<T><<<grid_for(n * c, 256), 256, 0, stream(dev)>>>(
        static_cast<const int32_t*>(ids.data_ptr()), static_cast<const T*>(table.data_ptr()),
        static_cast<T*>(out.data_ptr()), n, c);
    FFN_CHECK_LAUNCH();
  });
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table) {
  const int dev = d_table.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream(dev);
  const int64_t n = ids.size(0), c = d_table.size(1), v = d_table.size(0);
  d_table.zero_();
  if (n == 0 || c == 0) return;
  FFN_CHECK(n < (int64_t{1} << 31), "[embedding_backward] more than 2^31 ids: ", n);
  const Device d = d_table.device();
  Tensor pos_in = Tensor::empty({n}, DType::i32, d);
  Tensor keys_out = Tensor::empty({n}, DType::i32, d), pos_out = Tensor::empty({n}, DType::i32, d);
  iota_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<int32_t*>(pos_in.data_ptr()), n);
  FFN_CHECK_LAUNCH();
  int end_bit = 1;
  while (end_bit < 32 && (int64_t{1} << end_bit) < v) ++end_bit;
  const auto* k_in = static_cast<const int32_t*>(ids.data_ptr());
  auto* k_out = static_cast<int32_t*>(keys_out.data_ptr());
  const auto* p_in = static_cast<const int32_t*>(pos_in.data_ptr());
  auto* p_out = static_cast<int32_t*>(pos_out.data_ptr());
  size_t temp_bytes = 0;
  FFN_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, p_in, p_out,
                                                 static_cast<int>(n), 0, end_bit, s));
  Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes / 4) + 1}, DType::i32, d);
  FFN_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, k_in, k_out, p_in,
                                                 p_out, static_cast<int>(n), 0, end_bit, s));
  FFN_DISPATCH_ALL(d_table.dtype(), "embedding_backward", [&]<class H>() {
    using T = device_t<H>;
    const int threads = static_cast<int>(std::min<int64_t>(256, (c + 31) / 32 * 32));
    segment_sum_kernel<T><<<static_cast<unsigned>(n), threads, 0, s>>>(
        k_out, p_out, static_cast<const T*>(d_out.data_ptr()), static_cast<T*>(d_table.data_ptr()),
        n, c);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
