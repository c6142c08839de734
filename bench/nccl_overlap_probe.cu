// bench/nccl_overlap_probe.cu — ffn-nccl-overlap: what a gradient bucket's collective costs
// kernels running beside it on 2 GPUs (Note [Copy-engine gradient reduction],
// train/dist/comm.h). Two processes (forked), GPU r each; on each, a chain of cuBLAS bf16
// GEMMs on one stream and R collectives on a high-priority stream, both held behind one
// gate kernel so that the host's enqueueing is not timed. Printed (rank 0): the GEMMs alone,
// the collectives alone, and both together: what the collectives added to the GEMMs.
//   ring:  NCCL's all-reduce (ncclAvg), in place
//   ce:    NCCL's in-place all-gather in a symmetric window, on a communicator with the
//          zero-CTA policy (NCCL >= 2.28: the copy engines), then a mean kernel of
//          --sum-ctas thread blocks (0: none), as the copy-engine path first did
// The GEMMs are 8192×8192×2048 by default; --shape M,N,K --at makes them a weight gradient's
// C[M, N] = Aᵀ·B with A [K, M] and B [K, N] row-major (gpt2_small's MLP: 3072,768,16384), the
// products that session 54's traces showed at half speed beside a bucket.
// usage: ffn-nccl-overlap [--mode ring|ce] [--mib 27.04] [--sum-ctas 32] [--shape M,N,K]
//        [--at] [--gemms 30] [--collectives 12]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define FFN_PROBE_CE 1
#else
#define FFN_PROBE_CE 0  // NCCL before 2.28: no symmetric windows or zero-CTA policy
#endif

#define CK(x)                                                                        \
  do {                                                                               \
    if (cudaError_t e = (x); e != cudaSuccess) {                                     \
      std::fprintf(stderr, "ffn-nccl-overlap: %s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)
#define NK(x)                                                                        \
  do {                                                                               \
    if (ncclResult_t e = (x); e != ncclSuccess) {                                    \
      std::fprintf(stderr, "ffn-nccl-overlap: %s: %s\n", #x, ncclGetErrorString(e)); \
      std::exit(3);                                                                  \
    }                                                                                \
  } while (0)

namespace {

__global__ void gate(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void mean2(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out,
                      size_t n8) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n8;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 va = reinterpret_cast<const uint4*>(a)[i];
    const uint4 vb = reinterpret_cast<const uint4*>(b)[i];
    const auto* pa = reinterpret_cast<const __nv_bfloat16*>(&va);
    const auto* pb = reinterpret_cast<const __nv_bfloat16*>(&vb);
    uint4 vo;
    auto* po = reinterpret_cast<__nv_bfloat16*>(&vo);
    for (int j = 0; j < 8; ++j)
      po[j] = __float2bfloat16((__bfloat162float(pa[j]) + __bfloat162float(pb[j])) * 0.5f);
    reinterpret_cast<uint4*>(out)[i] = vo;
  }
}

struct Probe {
  int rank = 0;
  std::string mode;
  size_t n = 0;  // bf16 elements of the bucket
  int sum_ctas = 32;
  ncclComm_t comm{};
  cudaStream_t gemms{}, comms{};
  cublasHandle_t blas{};
  __nv_bfloat16 *a{}, *b{}, *c{}, *grad{}, *window{};
  float* tiny{};
  int M = 8192, N = 8192, K = 2048, G = 30, R = 12;
  bool at = false;  // C = Aᵀ·B (A [K, M], B [K, N]) instead of C = A·Bᵀ (A [M, K], B [N, K])

  void gemm() {
    const float one = 1, zero = 0;
    // Row-major C [M, N] is column-major Cᵀ [N, M] = op(B)·op(A) in cuBLAS's terms.
    if (at)
      cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, N, M, K, &one, b, CUDA_R_16BF, N, a,
                   CUDA_R_16BF, M, &zero, c, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    else
      cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, CUDA_R_16BF, K, a,
                   CUDA_R_16BF, K, &zero, c, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  }
  void collective(bool ring) {
    if (ring) {
      NK(ncclAllReduce(grad, grad, n, ncclBfloat16, ncclAvg, comm, comms));
      return;
    }
    NK(ncclAllGather(window + rank * n, window, n, ncclBfloat16, comm, comms));
    if (sum_ctas > 0)
      mean2<<<sum_ctas, 512, 0, comms>>>(window, window + n, window + rank * n, n / 8);
  }
  void barrier() {
    NK(ncclAllReduce(tiny, tiny, 1, ncclFloat, ncclSum, comm, comms));
    CK(cudaDeviceSynchronize());
  }
  // ms of the GEMM chain (with R collectives beside it when kind > 0: 1 ring, 2 ce) and of
  // the collectives.
  std::pair<float, float> timed(int kind, bool gemms_too) {
    cudaEvent_t g0, g1, c0, c1;
    for (cudaEvent_t* ev : {&g0, &g1, &c0, &c1}) CK(cudaEventCreate(ev));
    barrier();
    gate<<<1, 1, 0, gemms>>>(6000000LL);  // ~3 ms: everything below is queued by then
    CK(cudaEventRecord(g0, gemms));
    if (kind > 0) {
      CK(cudaStreamWaitEvent(comms, g0, 0));
      CK(cudaEventRecord(c0, comms));
      for (int i = 0; i < R; ++i) collective(kind == 1);
      CK(cudaEventRecord(c1, comms));
    }
    if (gemms_too)
      for (int i = 0; i < G; ++i) gemm();
    CK(cudaEventRecord(g1, gemms));
    CK(cudaDeviceSynchronize());
    float tg = 0, tc = 0;
    CK(cudaEventElapsedTime(&tg, g0, g1));
    if (kind > 0) CK(cudaEventElapsedTime(&tc, c0, c1));
    for (cudaEvent_t e : {g0, g1, c0, c1}) cudaEventDestroy(e);
    return {tg, tc};
  }
  static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

  void run() {
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithFlags(&gemms, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&comms, cudaStreamNonBlocking, hi));
    cublasCreate(&blas);
    cublasSetStream(blas, gemms);
    CK(cudaMalloc(&a, static_cast<size_t>(M) * K * 2));
    CK(cudaMalloc(&b, static_cast<size_t>(N) * K * 2));
    CK(cudaMalloc(&c, static_cast<size_t>(M) * N * 2));
    CK(cudaMemset(a, 0x3c, static_cast<size_t>(M) * K * 2));
    CK(cudaMemset(b, 0x3c, static_cast<size_t>(N) * K * 2));
    CK(cudaMalloc(&grad, n * 2));
    CK(cudaMemset(grad, 0x3c, n * 2));
    CK(cudaMalloc(&tiny, 4));
    const bool ce = mode == "ce";
#if FFN_PROBE_CE
    ncclWindow_t win{};
    if (ce) {
      NK(ncclMemAlloc(reinterpret_cast<void**>(&window), 2 * n * 2));
      NK(ncclCommWindowRegister(comm, window, 2 * n * 2, &win, NCCL_WIN_COLL_SYMMETRIC));
      CK(cudaMemset(window, 0x3c, 2 * n * 2));
    }
#endif
    for (int i = 0; i < 3; ++i) {  // warm-up
      gemm();
      collective(true);
      if (ce) collective(false);
    }
    std::vector<float> alone, comm_alone, with, comm_with;
    for (int rep = 0; rep < 5; ++rep) alone.push_back(timed(0, true).first);
    const int kind = ce ? 2 : 1;
    for (int rep = 0; rep < 5; ++rep) comm_alone.push_back(timed(kind, false).second);
    for (int rep = 0; rep < 5; ++rep) {
      const auto [g, c] = timed(kind, true);
      with.push_back(g);
      comm_with.push_back(c);
    }
    if (rank == 0) {
      const float ta = median(alone), tw = median(with);
      std::printf(
          "%s, %d x %.2f MiB%s: %d GEMMs %dx%dx%d%s alone %.3f ms (%.0f TFLOP/s); "
          "collectives alone %.3f ms (%.3f each), beside the GEMMs %.3f ms; GEMMs with "
          "them %.3f ms (+%.3f ms)\n",
          mode.c_str(), R, n * 2.0 / 1048576.0,
          ce ? (" + mean of " + std::to_string(sum_ctas) + " CTAs").c_str() : "", G, M, N, K,
          at ? " Aᵀ" : "", ta, 2.0 * M * N * K * G / ta / 1e9, median(comm_alone),
          median(comm_alone) / R, median(comm_with), tw, tw - ta);
      std::fflush(stdout);
    }
#if FFN_PROBE_CE
    if (ce) NK(ncclCommWindowDeregister(comm, win));
#endif
    NK(ncclCommDestroy(comm));
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ffn-nccl-overlap: a bucket's collective beside GEMMs on 2 GPUs"};
  std::string mode = "ring";
  double mib = 27.04;
  int sum_ctas = 32, gemms = 30, collectives = 12;
  std::vector<int> shape = {8192, 8192, 2048};
  bool at = false;
  app.add_option("--mode", mode, "ring (NCCL's all-reduce) or ce (copy-engine all-gather)")
      ->check(CLI::IsMember({"ring", "ce"}));
  app.add_option("--mib", mib, "bucket size in MiB (bf16)")->check(CLI::PositiveNumber);
  app.add_option("--sum-ctas", sum_ctas, "ce: thread blocks of the mean kernel (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--shape", shape, "the GEMMs' M,N,K")->delimiter(',')->expected(3)
      ->check(CLI::PositiveNumber);
  app.add_flag("--at", at, "C = Aᵀ·B (a weight gradient's layout) instead of C = A·Bᵀ");
  app.add_option("--gemms", gemms, "GEMMs in the chain")->check(CLI::PositiveNumber);
  app.add_option("--collectives", collectives, "collectives beside them")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (mode == "ce" && !FFN_PROBE_CE) {
    std::fprintf(stderr, "ffn-nccl-overlap: --mode ce needs NCCL >= 2.28 (built with %d.%d)\n",
                 NCCL_MAJOR, NCCL_MINOR);
    return 1;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::fprintf(stderr, "ffn-nccl-overlap: needs 2 GPUs, found %d\n", devices);
    return 1;
  }
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    if (kids[r] != 0) continue;
    Probe p;
    p.rank = r;
    p.mode = mode;
    p.sum_ctas = sum_ctas;
    p.M = shape[0];
    p.N = shape[1];
    p.K = shape[2];
    p.at = at;
    p.G = gemms;
    p.R = collectives;
    p.n = static_cast<size_t>(mib * 1048576.0 / 2) / 64 * 64;
    ncclUniqueId id;
    if (r == 0) {
      NK(ncclGetUniqueId(&id));
      if (write(fds[1], &id, sizeof id) != sizeof id) _exit(1);
    } else if (read(fds[0], &id, sizeof id) != sizeof id) {
      _exit(1);
    }
    CK(cudaSetDevice(r));
#if FFN_PROBE_CE
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    if (mode == "ce") cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    NK(ncclCommInitRankConfig(&p.comm, 2, id, r, &cfg));
#else
    NK(ncclCommInitRank(&p.comm, 2, id, r));
#endif
    p.run();
    _exit(0);
  }
  int bad = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    bad |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad;
}
