// core/cuda/context.h — per-device CUDA state: the compute stream, the cuBLASLt
// handle and its workspace. Created lazily on first use, one set per device,
// alive until process exit. All of fused-ffn's device work for a device is
// ordered on its compute stream (Note [One compute stream]).
//
// Note [One compute stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Every kernel, cuBLASLt call and copy for device N runs on stream(N). The
// caching allocator (core/cuda/allocator.cpp) relies on this: a block freed on
// the host may still be read by queued work, but whatever reuses it is queued
// after that work on the same stream. Code that uses another stream (NCCL)
// must fence with events before memory it touched is freed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

struct cublasLtContext;
typedef struct cublasLtContext* cublasLtHandle_t;

namespace ffn::cuda {

cudaStream_t stream(int device);
cublasLtHandle_t cublaslt(int device);
void* workspace(int device);
size_t workspace_bytes();
const cudaDeviceProp& properties(int device);
void synchronize(int device);
// Whether stream(device) is being captured into a CUDA graph (Note [CUDA graph step]).
bool capturing(int device);
// Throws when stream(device) is being captured into a CUDA graph: `what` (a host copy, a
// read of a value) would run once now, or replay stale host memory, instead of each step
// (Note [CUDA graph step], core/graph.h).
void check_not_capturing(int device, const char* what);
// Lets `kernel` launch on the current device with `bytes` of dynamic shared memory (the
// opt-in above 48 KiB); raised once per kernel and device, never lowered. Kernels that
// share a signature share a function type, so the record is keyed by address.
void allow_dynamic_smem(const void* kernel, size_t bytes);

// Makes `device` current for the scope; restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace ffn::cuda
