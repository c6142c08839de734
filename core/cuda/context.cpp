// core/cuda/context.cpp — lazily created streams, cuBLASLt handles and workspaces.
#define FFN_CUBLAS_CHECKS 1
#include "core/cuda/context.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/check.h"

namespace ffn::cuda {

namespace {
// cuBLASLt recommends 32 MiB of workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct PerDevice {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  cudaDeviceProp props{};
};

std::mutex g_mu;
std::vector<std::unique_ptr<PerDevice>> g_devices;

PerDevice& get(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  int count = 0;
  FFN_CHECK_CUDA(cudaGetDeviceCount(&count));
  FFN_CHECK(device >= 0 && device < count, "[cuda] device cuda:", device, " does not exist (",
            count, " GPUs visible)");
  if (g_devices.size() < static_cast<size_t>(count)) g_devices.resize(count);
  if (!g_devices[device]) {
    auto d = std::make_unique<PerDevice>();
    DeviceGuard guard(device);
    FFN_CHECK_CUDA(cudaGetDeviceProperties(&d->props, device));
    FFN_CHECK_CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    FFN_CHECK_CUBLAS(cublasLtCreate(&d->lt));
    FFN_CHECK_CUDA(cudaMalloc(&d->workspace, kWorkspaceBytes));
    g_devices[device] = std::move(d);
  }
  return *g_devices[device];
}
}  // namespace

cudaStream_t stream(int device) {
  return get(device).stream;
}
cublasLtHandle_t cublaslt(int device) {
  return get(device).lt;
}
void* workspace(int device) {
  return get(device).workspace;
}
size_t workspace_bytes() {
  return kWorkspaceBytes;
}
const cudaDeviceProp& properties(int device) {
  return get(device).props;
}

void allow_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[{kernel, dev}];
  if (bytes > have) {
    FFN_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
    have = bytes;
  }
}

bool capturing(int device) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  FFN_CHECK_CUDA(cudaStreamIsCapturing(stream(device), &st));
  return st != cudaStreamCaptureStatusNone;
}

void check_not_capturing(int device, const char* what) {
  FFN_CHECK(!capturing(device), "[cuda graph] ", what, " on cuda:", device,
            " while its stream is captured into a CUDA graph: a graph replays device work only "
            "(Note [CUDA graph step]); runtime.cuda_graph = false runs the step without one");
}

void synchronize(int device) {
  FFN_CHECK_CUDA(cudaStreamSynchronize(stream(device)));
}

DeviceGuard::DeviceGuard(int device) {
  FFN_CHECK_CUDA(cudaGetDevice(&prev_));
  if (prev_ != device) FFN_CHECK_CUDA(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
}

}  // namespace ffn::cuda
