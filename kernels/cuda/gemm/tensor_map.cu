// kernels/cuda/gemm/tensor_map.cu — TMA tensor maps and the sm_90a probe
// (kernels/cuda/gemm/tensor_map.h).
//
// Note [sm_90a code]
// ~~~~~~~~~~~~~~~~~~
// The Hopper kernels (wgmma, TMA, setmaxnreg) exist only in sm_90a machine code; compiled
// for any other target (the compute_80 PTX that a default build also carries, or a build
// for other architectures), their bodies are empty. A Hopper GPU running a build without
// 90a would JIT that PTX and run the empty bodies, so the "supported" checks ask the device
// itself: a probe kernel compiled under the same condition reports whether the code it runs
// is the sm_90a one.
#include "kernels/cuda/gemm/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/context.h"

namespace ffn::cuda::gemm {

namespace {

__global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda needed).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FFN_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                    cudaEnableDefault, &q));
    FFN_CHECK(p && q == cudaDriverEntryPointSuccess,
              "[tma] cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMap encode(const void* base, DType dt, int rank, const cuuint64_t* dims,
                   const cuuint64_t* strides_bytes, const cuuint32_t* box, const char* op,
                   const Shape& shape) {
  FFN_CHECK(dt == DType::bf16 || dt == DType::f16, "[", op, "] TMA maps take bf16/f16, got ",
            dtype_name(dt));
  CUtensorMap map;
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(
      &map, dt == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      rank, const_cast<void*>(base), dims, strides_bytes, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FFN_CHECK(r == CUDA_SUCCESS, "[", op, "] cuTensorMapEncodeTiled failed (", static_cast<int>(r),
            ") for a ", shape_str(shape), " ", dtype_name(dt), " operand");
  return map;
}

}  // namespace

CUtensorMap tensor_map_2d(const Tensor& t, int box_rows, const char* op) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.size(1)),
                              static_cast<cuuint64_t>(t.size(0))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.size(1)) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return encode(t.data_ptr(), t.dtype(), 2, dims, strides, box, op, t.shape());
}

CUtensorMap tensor_map_3d(const void* base, DType dt, const uint64_t (&dims)[3],
                          const uint64_t (&strides)[2], int box_rows, const char* op) {
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t s[2] = {strides[0] * 2, strides[1] * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  return encode(base, dt, 3, d, s, box, op,
                Shape{static_cast<int64_t>(dims[2]), static_cast<int64_t>(dims[1]),
                      static_cast<int64_t>(dims[0])});
}

bool sm90a_code_on(int dev) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  const cudaDeviceProp& p = properties(dev);
  bool on = false;
  if (p.major == 9 && p.minor == 0) {
    DeviceGuard guard(dev);
    int* flag = nullptr;
    int host = 0;
    FFN_CHECK_CUDA(cudaMalloc(&flag, sizeof(int)));
    sm90a_probe_kernel<<<1, 1>>>(flag);
    const cudaError_t launched = cudaGetLastError();
    if (launched == cudaSuccess)
      FFN_CHECK_CUDA(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
    FFN_CHECK_CUDA(cudaFree(flag));
    // No kernel image for this device at all: no sm_90a code either.
    on = launched == cudaSuccess && host == 1;
  }
  return known[dev] = on;
}

}  // namespace ffn::cuda::gemm
