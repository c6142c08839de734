// kernels/cuda/embedding.cu — embedding gathers (with the position rows added: Note
// [Embeddings in one pass] in kernels/embedding.h) and their deterministic backward.
//
// Forward: a thread gathers 16 bytes of a row (8 columns of a 16-bit table), adds the
// position row's, and stores them in the output's dtype. position_grad: one column a thread,
// the sequences summed in order.
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
#include "kernels/cuda/rowwise.cuh"  // load_vec, store_vec, dispatch_mixed
#include "kernels/embedding.h"

namespace ffn::cuda {

namespace {

// out[i, :] = table[ids[i], :] (+ pos[i % t, :]), summed in fp32 and rounded once to X (T, or
// fp32 for a 16-bit T: Note [Embeddings in one pass]). V consecutive columns a thread: one
// 16-byte load of each row when V = 8 (16-bit tables).
template <class T, class X, int V>
__global__ void embedding_sum_kernel(const int32_t* ids, const T* table, const T* pos, int64_t t,
                                     X* out, int64_t n, int64_t c) {
  const int64_t groups = c / V, total = n * groups;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / groups, j = (k - i * groups) * V;
    float v[V];
    load_vec<V>(table + int64_t{ids[i]} * c + j, v);
    if (pos) {
      float p[V];
      load_vec<V>(pos + (i % t) * c + j, p);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] += p[e];
    }
    store_vec<V>(out + i * c + j, v);
  }
}

// Double tables: the same in f64, one column a thread.
__global__ void embedding_sum_f64_kernel(const int32_t* ids, const double* table,
                                         const double* pos, int64_t t, double* out, int64_t n,
                                         int64_t c) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n * c;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / c, j = k - i * c;
    out[k] = table[int64_t{ids[i]} * c + j] + (pos ? pos[(i % t) * c + j] : 0.0);
  }
}

// d_pos[p, j] = Σ_s d_out[s·t + p, j] over the sequences s in order (fp32; f64 for f64), rows
// p ≥ t zero. One column a thread, coalesced along the row.
template <class D, class T>
__global__ void position_grad_kernel(const D* d_out, T* d_pos, int64_t seqs, int64_t t,
                                     int64_t rows, int64_t c) {
  using A = acc_t<T>;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < rows * c;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = k / c, j = k - p * c;
    A s = 0;
    if (p < t)
#pragma unroll 4
      for (int64_t q = 0; q < seqs; ++q) s += static_cast<A>(to_acc(d_out[(q * t + p) * c + j]));
    d_pos[k] = from_acc<T>(s);
  }
}

constexpr int64_t kChunk = 16;

// W consecutive values of one row (16 bytes when W > 1).
template <class U, int W>
struct alignas(sizeof(U) * W) Cols {
  U x[W];
};

// One table row's W columns: Σ, or old + Σ with accumulate, rounded once.
template <class T, class A, int W>
__device__ __forceinline__ void store_row(T* p, const A (&acc)[W], bool accumulate) {
  Cols<T, W> out;
  if (accumulate) out = *reinterpret_cast<const Cols<T, W>*>(p);
#pragma unroll
  for (int e = 0; e < W; ++e)
    out.x[e] = from_acc<T>(accumulate ? static_cast<A>(to_acc(out.x[e])) + acc[e] : acc[e]);
  *reinterpret_cast<Cols<T, W>*>(p) = out;
}

// Chunk k = blockIdx.x covers sorted rows [k·kChunk, …); see the file comment. Each thread
// owns W consecutive columns (one 16-byte load per row when W > 1). D: the gradient's type
// (T, or fp32 beside a 16-bit table). accumulate: the table row becomes old + Σ, rounded
// once (Note [Embeddings in one pass]).
template <class T, class D, class A, int W>
__global__ void chunk_sum_kernel(const int32_t* keys, const int32_t* pos, const D* d_out,
                                 T* d_table, A* head, A* tail, int64_t n, int64_t c,
                                 bool accumulate) {
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
        const Cols<D, W> x = *reinterpret_cast<const Cols<D, W>*>(d_out + int64_t{pos[r]} * c + j);
#pragma unroll
        for (int e = 0; e < W; ++e) acc[e] += static_cast<A>(to_acc(x.x[e]));
      }
      if (cont_prev || cont_next) {
        A* part = (cont_prev ? head : tail) + k * c + j;
#pragma unroll
        for (int e = 0; e < W; ++e) part[e] = acc[e];
      } else {
        store_row<T, A, W>(d_table + int64_t{id} * c + j, acc, accumulate);
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
                                  int64_t n, int64_t c, bool accumulate) {
  const int64_t k = blockIdx.x, lo = k * kChunk, hi = min(n, lo + kChunk);
  const int32_t id = keys[hi - 1];
  const bool starts_here = !(keys[lo] == id && lo > 0 && keys[lo - 1] == id);
  if (!starts_here || hi >= n || keys[hi] != id) return;
  // The run ends before the first sorted key above id: a binary search, where walking the
  // chunk boundaries took one dependent load per chunk (a character id's run crosses hundreds).
  int64_t lo_end = hi, hi_end = n;  // keys[hi] == id
  while (lo_end < hi_end) {
    const int64_t mid = (lo_end + hi_end) / 2;
    if (keys[mid] <= id)
      lo_end = mid + 1;
    else
      hi_end = mid;
  }
  const int64_t last = (lo_end - 1) / kChunk;  // the chunk where the run ends
  for (int64_t j = threadIdx.x * int64_t{W}; j < c; j += int64_t{blockDim.x} * W) {
    Cols<A, W> acc = *reinterpret_cast<const Cols<A, W>*>(tail + k * c + j);
#pragma unroll 8
    for (int64_t q = k + 1; q <= last; ++q) {
      const Cols<A, W> h = *reinterpret_cast<const Cols<A, W>*>(head + q * c + j);
#pragma unroll
      for (int e = 0; e < W; ++e) acc.x[e] += h.x[e];
    }
    store_row<T, A, W>(d_table + int64_t{id} * c + j, acc.x, accumulate);
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

namespace {
bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace

void embedding_sum(const Tensor& ids, const Tensor& table, const Tensor& pos, int64_t t,
                   Tensor& out) {
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream(dev);
  const int64_t n = ids.size(0), c = table.size(1);
  if (n * c == 0) return;
  const auto* id = static_cast<const int32_t*>(ids.data_ptr());
  if (table.dtype() == DType::f64) {
    embedding_sum_f64_kernel<<<grid_for(n * c, 256), 256, 0, s>>>(
        id, table.data<double>(), pos.defined() ? pos.data<double>() : nullptr, t,
        out.data<double>(), n, c);
    FFN_CHECK_LAUNCH();
    return;
  }
  dispatch_mixed(out, table, "embedding", [&]<class X, class T>() {
    const T* p = dptr<const T>(pos);
    constexpr int V = 16 / sizeof(T);
    const bool vec = c % V == 0 && aligned(table.data_ptr(), 16) && (!p || aligned(p, 16)) &&
                     aligned(out.data_ptr(), V * sizeof(X));
    auto run = [&](auto kernel, int64_t per_thread) {
      kernel<<<grid_for(n * c / per_thread, 256), 256, 0, s>>>(
          id, static_cast<const T*>(table.data_ptr()), p, t, dptr<X>(out), n, c);
      FFN_CHECK_LAUNCH();
    };
    if (vec)
      run(embedding_sum_kernel<T, X, V>, V);
    else
      run(embedding_sum_kernel<T, X, 1>, 1);
  });
}

void position_grad(const Tensor& d_out, int64_t t, Tensor& d_pos) {
  const int dev = d_pos.device().index;
  DeviceGuard guard(dev);
  const int64_t n = d_out.size(0), c = d_out.size(1), rows = d_pos.size(0);
  if (rows * c == 0) return;
  auto run = [&]<class D, class T>() {
    position_grad_kernel<D, T><<<grid_for(rows * c, 256), 256, 0, stream(dev)>>>(
        dptr<const D>(d_out), dptr<T>(d_pos), n / t, t, rows, c);
    FFN_CHECK_LAUNCH();
  };
  dispatch_mixed(d_out, d_pos, "position_grad",
                 [&]<class D, class T>() { run.template operator()<D, T>(); });
}

void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table, bool accumulate) {
  const int dev = d_table.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream(dev);
  const int64_t n = ids.size(0), c = d_table.size(1), v = d_table.size(0);
  if (!accumulate) d_table.zero_();
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
  auto scatter = [&]<class D, class T>() {
    using A = acc_t<T>;
    // W columns a thread: 16 bytes of the gradient's row a load where the columns divide.
    constexpr int W = 16 / static_cast<int>(sizeof(D));
    const bool vec = c % W == 0 && aligned(d_out.data_ptr(), 16) &&
                     aligned(d_table.data_ptr(), W * sizeof(T));
    const int64_t cols = vec ? c / W : c;  // per-thread column groups
    const int threads = static_cast<int>(std::min<int64_t>(256, (cols + 31) / 32 * 32));
    auto* table = static_cast<T*>(d_table.data_ptr());
    auto sum = vec ? chunk_sum_kernel<T, D, A, W> : chunk_sum_kernel<T, D, A, 1>;
    sum<<<static_cast<unsigned>(chunks), threads, 0, s>>>(
        k_out, p_out, static_cast<const D*>(d_out.data_ptr()), table,
        static_cast<A*>(head.data_ptr()), static_cast<A*>(tail.data_ptr()), n, c, accumulate);
    FFN_CHECK_LAUNCH();
    // 16 bytes of partials per thread (4 fp32 or 2 f64 columns) where the columns divide.
    constexpr int WA = 16 / static_cast<int>(sizeof(A));
    const bool join_vec = c % WA == 0 && aligned(d_table.data_ptr(), WA * sizeof(T));
    const int64_t join_cols = join_vec ? c / WA : c;
    const int join_threads = static_cast<int>(std::min<int64_t>(256, (join_cols + 31) / 32 * 32));
    auto join = join_vec ? chunk_join_kernel<T, A, WA> : chunk_join_kernel<T, A, 1>;
    join<<<static_cast<unsigned>(chunks), join_threads, 0, s>>>(
        k_out, table, static_cast<const A*>(head.data_ptr()),
        static_cast<const A*>(tail.data_ptr()), n, c, accumulate);
    FFN_CHECK_LAUNCH();
  };
  dispatch_mixed(d_out, d_table, "embedding_backward",
                 [&]<class D, class T>() { scatter.template operator()<D, T>(); });
}

}  // namespace ffn::cuda
