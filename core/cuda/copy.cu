// core/cuda/copy.cu — device copies for Tensor: strided copy with dtype conversion,
// fill, axpy (autograd's gradient sums) and host<->device / peer transfers (small
// host -> device copies return before the device has them: stage_to_device).
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/copy.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "core/philox.h"
#include "core/tensor.h"

namespace ffn::cuda_copy {

namespace {

constexpr int kMaxDims = 8;
struct StridedIndex {
  int nd;
  int64_t size[kMaxDims];
  int64_t dst_stride[kMaxDims];
  int64_t src_stride[kMaxDims];
};

template <class D, class S>
__global__ void strided_copy_kernel(D* dst, const S* src, int64_t n, StridedIndex ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = i, od = 0, os = 0;
    for (int k = ix.nd - 1; k >= 0; --k) {
      const int64_t c = rem % ix.size[k];
      rem /= ix.size[k];
      od += c * ix.dst_stride[k];
      os += c * ix.src_stride[k];
    }
    dst[od] = cuda::from_acc<D>(cuda::to_acc(src[os]));
  }
}

template <class D, class S>
__global__ void contiguous_copy_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = cuda::from_acc<D>(cuda::to_acc(src[i]));
}

template <class T>
__global__ void fill_kernel(T* dst, int64_t n, StridedIndex ix, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = i, od = 0;
    for (int k = ix.nd - 1; k >= 0; --k) {
      od += (rem % ix.size[k]) * ix.dst_stride[k];
      rem /= ix.size[k];
    }
    dst[od] = value;
  }
}

template <class T, class S>
__global__ void add_kernel(T* dst, const T* a, const S* b, int64_t n) {
  using A = cuda::acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = cuda::from_acc<T>(cuda::to_acc(a[i]) + static_cast<A>(cuda::to_acc(b[i])));
}

template <class T, class S>
__global__ void axpy_kernel(T* dst, const S* src, int64_t n, double alpha) {
  using A = cuda::acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = cuda::from_acc<T>(cuda::to_acc(dst[i]) +
                               static_cast<A>(alpha) * static_cast<A>(cuda::to_acc(src[i])));
}

template <class T>
__global__ void normal_kernel(T* dst, int64_t n, uint64_t seed, uint64_t offset, float mean,
                              float std) {
  const int64_t nblocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < nblocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    float z[4];
    philox_normal4(seed, offset, static_cast<uint64_t>(b), z);
    for (int j = 0; j < 4 && 4 * b + j < n; ++j)
      dst[4 * b + j] = cuda::from_acc<T>(mean + std * z[j]);
  }
}

StridedIndex make_index(const Tensor& dst, const Tensor* src) {
  FFN_CHECK(dst.dim() <= kMaxDims, "[copy_] CUDA copies support up to ", kMaxDims,
            " dimensions, got ", dst.dim());
  StridedIndex ix{};
  ix.nd = static_cast<int>(dst.dim());
  for (int k = 0; k < ix.nd; ++k) {
    ix.size[k] = dst.shape()[k];
    ix.dst_stride[k] = dst.strides()[k];
    ix.src_stride[k] = src ? src->strides()[k] : 0;
  }
  return ix;
}

// Small host -> device copies (a training batch, a scalar) are staged through pinned slots
// so that they do not wait for the device: the bytes are copied into a slot on the host, so
// the caller may free its buffer at once, and the DMA is queued on the compute stream. A slot
// is reused only after the event recorded behind its DMA has completed.
constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr int kSlots = 8;

struct Staging {
  std::mutex mu;
  char* host = nullptr;
  cudaEvent_t done[kSlots] = {};
  int next = 0;
};

void stage_to_device(void* dst, int dev, const void* src, size_t nbytes) {
  static std::mutex map_mu;
  static std::map<int, std::unique_ptr<Staging>> per_device;
  Staging* st;
  {
    std::lock_guard<std::mutex> lock(map_mu);
    auto& p = per_device[dev];
    if (!p) {
      auto fresh = std::make_unique<Staging>();
      FFN_CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&fresh->host), kSlots * kSlotBytes,
                                   cudaHostAllocPortable));
      for (cudaEvent_t& e : fresh->done)
        FFN_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      p = std::move(fresh);
    }
    st = p.get();
  }
  std::lock_guard<std::mutex> lock(st->mu);
  const int k = st->next;
  st->next = (k + 1) % kSlots;
  FFN_CHECK_CUDA(cudaEventSynchronize(st->done[k]));  // its previous DMA (long done, normally)
  char* slot = st->host + static_cast<size_t>(k) * kSlotBytes;
  std::memcpy(slot, src, nbytes);
  cudaStream_t s = cuda::stream(dev);
  FFN_CHECK_CUDA(cudaMemcpyAsync(dst, slot, nbytes, cudaMemcpyHostToDevice, s));
  FFN_CHECK_CUDA(cudaEventRecord(st->done[k], s));
}

}  // namespace

void copy_same_device(const Tensor& dst, const Tensor& src) {
  const int dev = dst.device().index;
  cuda::DeviceGuard guard(dev);
  cudaStream_t s = cuda::stream(dev);
  const int64_t n = dst.numel();
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    FFN_CHECK_CUDA(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  const StridedIndex ix = make_index(dst, &src);
  FFN_DISPATCH_ANY(dst.dtype(), "copy_", [&]<class D>() {
    FFN_DISPATCH_ANY(src.dtype(), "copy_", [&]<class S>() {
      using DD = cuda::device_t<D>;
      using SS = cuda::device_t<S>;
      auto* d = static_cast<DD*>(dst.data_ptr());
      auto* p = static_cast<const SS*>(src.data_ptr());
      if (contiguous)
        contiguous_copy_kernel<DD, SS><<<cuda::grid_for(n, 256), 256, 0, s>>>(d, p, n);
      else
        strided_copy_kernel<DD, SS><<<cuda::grid_for(n, 256), 256, 0, s>>>(d, p, n, ix);
      FFN_CHECK_LAUNCH();
    });
  });
}

void fill(const Tensor& dst, double value) {
  const int dev = dst.device().index;
  cuda::DeviceGuard guard(dev);
  const int64_t n = dst.numel();
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {
    // +0 is all-zero bits in every dtype: a memset runs at the memory's bandwidth (the
    // strided kernel below, with its index arithmetic per element, took 0.22 ms per
    // gpt2_small step to zero the 79 MB of embedding gradients; ncu, H100).
    if (n > 0) FFN_CHECK_CUDA(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), cuda::stream(dev)));
    return;
  }
  const StridedIndex ix = make_index(dst, nullptr);
  FFN_DISPATCH_ANY(dst.dtype(), "fill_", [&]<class T>() {
    using DT = cuda::device_t<T>;
    const T host_v = detail::cast_value<T>(value);
    DT v;
    static_assert(sizeof(DT) == sizeof(T));
    memcpy(&v, &host_v, sizeof(T));
    fill_kernel<DT><<<cuda::grid_for(n, 256), 256, 0, cuda::stream(dev)>>>(
        static_cast<DT*>(dst.data_ptr()), n, ix, v);
    FFN_CHECK_LAUNCH();
  });
}

void axpy(const Tensor& dst, const Tensor& src, double alpha) {
  const int dev = dst.device().index;
  cuda::DeviceGuard guard(dev);
  const int64_t n = dst.numel();
  FFN_DISPATCH_ALL(dst.dtype(), "add_", [&]<class T>() {
    FFN_DISPATCH_ALL(src.dtype(), "add_", [&]<class S>() {
      using DT = cuda::device_t<T>;
      using ST = cuda::device_t<S>;
      axpy_kernel<DT, ST><<<cuda::grid_for(n, 256), 256, 0, cuda::stream(dev)>>>(
          static_cast<DT*>(dst.data_ptr()), static_cast<const ST*>(src.data_ptr()), n, alpha);
      FFN_CHECK_LAUNCH();
    });
  });
}

void add(const Tensor& dst, const Tensor& a, const Tensor& b) {
  const int dev = dst.device().index;
  cuda::DeviceGuard guard(dev);
  const int64_t n = dst.numel();
  FFN_DISPATCH_ALL(dst.dtype(), "plus", [&]<class T>() {
    FFN_DISPATCH_ALL(b.dtype(), "plus", [&]<class S>() {
      using DT = cuda::device_t<T>;
      using ST = cuda::device_t<S>;
      add_kernel<DT, ST><<<cuda::grid_for(n, 256), 256, 0, cuda::stream(dev)>>>(
          static_cast<DT*>(dst.data_ptr()), static_cast<const DT*>(a.data_ptr()),
          static_cast<const ST*>(b.data_ptr()), n);
      FFN_CHECK_LAUNCH();
    });
  });
}

void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset, double mean, double std) {
  const int dev = dst.device().index;
  cuda::DeviceGuard guard(dev);
  const int64_t n = dst.numel();
  FFN_DISPATCH_ALL(dst.dtype(), "randn", [&]<class T>() {
    using DT = cuda::device_t<T>;
    normal_kernel<DT><<<cuda::grid_for((n + 3) / 4, 256), 256, 0, cuda::stream(dev)>>>(
        static_cast<DT*>(dst.data_ptr()), n, seed, offset, static_cast<float>(mean),
        static_cast<float>(std));
    FFN_CHECK_LAUNCH();
  });
}

void memcpy_between(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (nbytes == 0) return;
  cuda::check_not_capturing(dst_dev.is_cuda() ? dst_dev.index : src_dev.index,
                            dst_dev.is_cuda() && src_dev.is_cuda() ? "a copy between GPUs"
                            : dst_dev.is_cuda()                    ? "a host-to-device copy"
                                                                   : "a device-to-host copy");
  if (dst_dev.is_cuda() && src_dev.is_cuda()) {
    cuda::synchronize(src_dev.index);
    FFN_CHECK_CUDA(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes,
                                       cuda::stream(dst_dev.index)));
    cuda::synchronize(dst_dev.index);
    return;
  }
  const int dev = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  cuda::DeviceGuard guard(dev);
  if (dst_dev.is_cuda() && nbytes <= kSlotBytes) {
    stage_to_device(dst, dev, src, nbytes);
    return;
  }
  const cudaMemcpyKind kind = dst_dev.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  FFN_CHECK_CUDA(cudaMemcpyAsync(dst, src, nbytes, kind, cuda::stream(dev)));
  // Host memory is pageable and may be freed right after: wait for the transfer.
  cuda::synchronize(dev);
}

}  // namespace ffn::cuda_copy
