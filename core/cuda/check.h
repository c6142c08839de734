// core/cuda/check.h — the CUDA members of the error family (see core/error.h).
//
// FFN_CHECK_CUDA(expr), FFN_CHECK_CUBLAS(expr), FFN_CHECK_NCCL(expr) throw ffn::Error
// with the library's own error name and text; FFN_CHECK_LAUNCH() checks the last
// error after a kernel launch (every launch is followed by one).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace ffn::detail {
inline std::string describe_cuda(cudaError_t e) {
  return cat("[cuda] ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}
}  // namespace ffn::detail

#define FFN_CHECK_CUDA(expr) FFN_CHECK_STATUS(expr, cudaSuccess, ::ffn::detail::describe_cuda)
#define FFN_CHECK_LAUNCH() FFN_CHECK_CUDA(cudaGetLastError())

#if defined(FFN_CUBLAS_CHECKS)
#include <cublasLt.h>
namespace ffn::detail {
inline std::string describe_cublas(cublasStatus_t s) {
  return cat("[cublas] ", cublasGetStatusName(s), ": ", cublasGetStatusString(s));
}
}  // namespace ffn::detail
#define FFN_CHECK_CUBLAS(expr) \
  FFN_CHECK_STATUS(expr, CUBLAS_STATUS_SUCCESS, ::ffn::detail::describe_cublas)
#endif

#if defined(FFN_NCCL_CHECKS)
#include <nccl.h>
namespace ffn::detail {
inline std::string describe_nccl(ncclResult_t r) {
  return cat("[nccl] error ", static_cast<int>(r), ": ", ncclGetErrorString(r));
}
}  // namespace ffn::detail
#define FFN_CHECK_NCCL(expr) FFN_CHECK_STATUS(expr, ncclSuccess, ::ffn::detail::describe_nccl)
#endif
