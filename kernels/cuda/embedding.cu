// kernels/cuda/embedding.cu — embedding gather and its deterministic backward
// (kernels/embedding.h).
//
// Backward: the (id, position) pairs are sorted by id with CUB's stable radix sort, so
// each id's positions come out in increasing order. The sorted list is cut into fixed
// chunks of kChunk = 16 rows, one block each (1024 blocks for GPT-2's 16384 tokens; a
// thread reads 16 bytes of a row at a time); a block sums each run of equal ids inside its
// chunk in order (fp32). A run that lies inside one chunk is written to the table at
// once; the pieces of a run that crosses chunk boundaries go to per-chunk partials (the
// piece that starts the run: `tail`, a piece continuing one: `head`), and a second
// kernel adds them in chunk order (16-byte loads, 8 chunks in flight). Every sum's order
// depends only on the ids, and there are no float atomics, so the result is bitwise
// reproducible for given ids. (A common character id in a char-level batch has thousands
// of rows: one block per id would leave most of the GPU idle.)
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

constexpr int64_t kChunk = 16;

// W consecutive values of one row (16 bytes when W > 1).
template <class U, int W>
struct alignas(sizeof(U) * W) Cols {
  U x[W];
};

// Chunk k = blockIdx.x covers sorted rows [k·kChunk, …); see the file comment. Each thread
// owns W consecutive columns (one 16-byte load per row when W > 1).
template <class T, class A, int W>
__global__ void chunk_sum_kernel(const int32_t* keys, const int32_t* pos, const T* d_out,
                                 T* d_table, A* head, A* tail, int64_t n, int64_t c) {
  const int64_t k = blockIdx.x, lo = k * kChunk, hi = min(n, lo + kChunk);
  for (int64_t a = lo; a < hi;) {
    const int32_t id = keys[a];
    int64_t b = a + 1;
    while (b < hi && keys[b] == id) ++b;
    const bool cont_prev = a == lo && a > 0 && keys[a - 1] == id;
    const bool cont_next = b == hi && b < n && keys[b] == id;
    for (int64_t j = threadIdx.x * int64_t{W}; j < c; j += int64_t{blockDim.x} * W) {
      A acc[W] = {};
#pragma unroll 4
      for (int64_t r = a; r < b; ++r) {
        const Cols<T, W> x = *reinterpret_cast<const Cols<T, W>*>(d_out + int64_t{pos[r]} * c + j);
#pragma unroll
        for (int e = 0; e < W; ++e) acc[e] += to_acc(x.x[e]);
      }
      if (cont_prev || cont_next) {
        A* part = (cont_prev ? head : tail) + k * c + j;
#pragma unroll
        for (int e = 0; e < W; ++e) part[e] = acc[e];
      } else {
        Cols<T, W> out;
#pragma unroll
        for (int e = 0; e < W; ++e) out.x[e] = from_acc<T>(acc[e]);
        *reinterpret_cast<Cols<T, W>*>(d_table + int64_t{id} * c + j) = out;
      }
    }
    a = b;
  }
}

// Block k: if a run starts in chunk k and continues into chunk k+1, add its pieces in
// chunk order and write the table row. A character id's run crosses hundreds of chunks, so
// each thread owns W consecutive columns (16-byte partial loads) and keeps 8 chunks' loads
// in flight; the additions stay in chunk order.
template <class T, class A, int W>
__global__ void chunk_join_kernel(const int32_t* keys, T* d_table, const A* head, const A* tail,
                                  int64_t n, int64_t c) {
  const int64_t k = blockIdx.x, lo = k * kChunk, hi = min(n, lo + kChunk);
  const int32_t id = keys[hi - 1];
  const bool starts_here = !(keys[lo] == id && lo > 0 && keys[lo - 1] == id);
  if (!starts_here || hi >= n || keys[hi] != id) return;
  int64_t last = k + 1;  // the chunk where the run ends
  while ((last + 1) * kChunk < n && keys[(last + 1) * kChunk - 1] == id &&
         keys[(last + 1) * kChunk] == id)
    ++last;
  for (int64_t j = threadIdx.x * int64_t{W}; j < c; j += int64_t{blockDim.x} * W) {
    Cols<A, W> acc = *reinterpret_cast<const Cols<A, W>*>(tail + k * c + j);
#pragma unroll 8
    for (int64_t q = k + 1; q <= last; ++q) {
      const Cols<A, W> h = *reinterpret_cast<const Cols<A, W>*>(head + q * c + j);
#pragma unroll
      for (int e = 0; e < W; ++e) acc.x[e] += h.x[e];
    }
    Cols<T, W> out;
#pragma unroll
    for (int e = 0; e < W; ++e) out.x[e] = from_acc<T>(acc.x[e]);
    *reinterpret_cast<Cols<T, W>*>(d_table + int64_t{id} * c + j) = out;
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
  bad_index_kernel<<<grid_for(n, 256, 4096), 256, 0, s>>>(
      static_cast<const int32_t*>(ids.data_ptr()), n, limit, f);
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
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const DType acc_dt = acc_dtype(d_table.dtype());
  Tensor head = Tensor::empty({chunks, c}, acc_dt, d), tail = Tensor::empty({chunks, c}, acc_dt, d);
  FFN_DISPATCH_ALL(d_table.dtype(), "embedding_backward", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    constexpr int W = 16 / static_cast<int>(sizeof(T));
    const bool vec = c % W == 0 && reinterpret_cast<uintptr_t>(d_out.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(d_table.data_ptr()) % 16 == 0;
    const int64_t cols = vec ? c / W : c;  // per-thread column groups
    const int threads = static_cast<int>(std::min<int64_t>(256, (cols + 31) / 32 * 32));
    auto* table = static_cast<T*>(d_table.data_ptr());
    auto sum = vec ? chunk_sum_kernel<T, A, W> : chunk_sum_kernel<T, A, 1>;
    sum<<<static_cast<unsigned>(chunks), threads, 0, s>>>(
        k_out, p_out, static_cast<const T*>(d_out.data_ptr()), table,
        static_cast<A*>(head.data_ptr()), static_cast<A*>(tail.data_ptr()), n, c);
    FFN_CHECK_LAUNCH();
    // 16 bytes of partials per thread (4 fp32 or 2 f64 columns) where the columns divide.
    constexpr int WA = 16 / static_cast<int>(sizeof(A));
    const bool join_vec =
        c % WA == 0 && reinterpret_cast<uintptr_t>(d_table.data_ptr()) % (WA * sizeof(T)) == 0;
    const int64_t join_cols = join_vec ? c / WA : c;
    const int join_threads = static_cast<int>(std::min<int64_t>(256, (join_cols + 31) / 32 * 32));
    auto join = join_vec ? chunk_join_kernel<T, A, WA> : chunk_join_kernel<T, A, 1>;
    join<<<static_cast<unsigned>(chunks), join_threads, 0, s>>>(
        k_out, table, static_cast<const A*>(head.data_ptr()),
        static_cast<const A*>(tail.data_ptr()), n, c);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
