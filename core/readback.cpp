// core/readback.cpp — Readback (core/readback.h): pinned host memory and an event per reader.
#include "core/readback.h"

#include <cstring>

#if FFN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#endif

namespace ffn {

Readback::~Readback() {
#if FFN_WITH_CUDA
  // Best effort: a queued copy must land before its memory is returned.
  if (event_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
    cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  }
  if (pinned_) cudaFreeHost(pinned_);
#endif
}

void Readback::start(const Tensor& src) {
  check_defined(src, "readback", "src");
  FFN_CHECK(!pending_, "[readback] start() while the previous copy was not waited for");
  FFN_CHECK(src.is_contiguous() && src.nbytes() <= kMaxBytes, "[readback] src must be ",
            "contiguous and at most ", kMaxBytes, " bytes, got ", src.desc());
  if (!src.is_cuda()) {
    host_ = src.clone();
    from_device_ = false;
    pending_ = true;
    return;
  }
#if FFN_WITH_CUDA
  const int dev = src.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::check_not_capturing(dev, "a readback");
  if (!pinned_ || device_ != dev) {
    if (event_) FFN_CHECK_CUDA(cudaEventDestroy(static_cast<cudaEvent_t>(event_)));
    if (pinned_) FFN_CHECK_CUDA(cudaFreeHost(pinned_));
    pinned_ = nullptr, event_ = nullptr;
    FFN_CHECK_CUDA(cudaHostAlloc(&pinned_, kMaxBytes, cudaHostAllocPortable));
    cudaEvent_t e;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_ = e;
    device_ = dev;
  }
  cudaStream_t s = cuda::stream(dev);
  FFN_CHECK_CUDA(cudaMemcpyAsync(pinned_, src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost, s));
  FFN_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event_), s));
  host_ = Tensor::empty(src.shape(), src.dtype());
  from_device_ = true;
  pending_ = true;
#else
  FFN_THROW("[readback] ", cuda_unavailable_reason());
#endif
}

std::vector<double> Readback::wait() {
  FFN_CHECK(pending_, "[readback] wait() without a started copy");
  pending_ = false;
#if FFN_WITH_CUDA
  if (from_device_) {
    cuda::DeviceGuard guard(device_);
    FFN_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
    std::memcpy(host_.data_ptr(), pinned_, host_.nbytes());
  }
#endif
  return host_.to_vector();
}

}  // namespace ffn
