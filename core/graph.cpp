// core/graph.cpp — StepGraph (core/graph.h): stream capture into a private memory pool.
#include "core/graph.h"

#include <vector>

#include "core/error.h"

#if FFN_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#endif

namespace ffn {

StepGraph::~StepGraph() {
  reset();
}

void StepGraph::reset() {
#if FFN_WITH_CUDA
  if (device_ < 0) return;
  cuda::DeviceGuard guard(device_);
  // A replay may still be running: its memory goes back to the cache only after it.
  cudaStreamSynchronize(cuda::stream(device_));
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  cuda_alloc::release_private_pool(device_);
#endif
  exec_ = graph_ = nullptr;
  device_ = -1;
  nodes_ = 0;
  kinds_.clear();
}

void StepGraph::capture(Device dev, const std::function<void()>& body) {
  FFN_CHECK(dev.is_cuda(), "[cuda graph] capture needs a CUDA device, got ", dev.str());
  FFN_CHECK(device_ < 0, "[cuda graph] capture() on a graph that holds one already");
#if FFN_WITH_CUDA
  cuda::DeviceGuard guard(dev.index);
  cudaStream_t s = cuda::stream(dev.index);
  cuda_alloc::begin_private_pool(dev.index);
  device_ = dev.index;
  // Thread-local mode: this thread's synchronizing calls fail instead of being missed.
  const cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (b != cudaSuccess) {
    cudaGetLastError();
    reset();
    FFN_THROW("[cuda graph] cannot start a capture on cuda:", dev.index, ": ",
              cudaGetErrorString(b));
  }
  cudaGraph_t g = nullptr;
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    reset();
    throw;
  }
  const cudaError_t e = cudaStreamEndCapture(s, &g);
  cuda_alloc::end_capture(dev.index);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    reset();
    FFN_THROW("[cuda graph] the capture on cuda:", dev.index, " failed: ", cudaGetErrorString(e),
              " (something in the step synchronized with the host or used another stream; "
              "runtime.cuda_graph = false runs the step without a graph)");
  }
  graph_ = g;
  FFN_CHECK_CUDA(cudaGraphGetNodes(g, nullptr, &nodes_));
  std::vector<cudaGraphNode_t> nodes(nodes_);
  if (nodes_ > 0) FFN_CHECK_CUDA(cudaGraphGetNodes(g, nodes.data(), &nodes_));
  size_t kernels = 0, copies = 0, memsets = 0;
  for (cudaGraphNode_t n : nodes) {
    // Nodes the runtime has no type for (NCCL's copy-engine collectives record the driver's
    // stream memory operations: Note [Copy-engine gradient reduction]) count as other nodes.
    cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
    if (cudaGraphNodeGetType(n, &t) != cudaSuccess) cudaGetLastError();
    kernels += t == cudaGraphNodeTypeKernel;
    copies += t == cudaGraphNodeTypeMemcpy;
    memsets += t == cudaGraphNodeTypeMemset;
  }
  kinds_ = std::to_string(kernels) + " kernels, " + std::to_string(copies) + " copies, " +
           std::to_string(memsets) + " memsets";
  if (kernels + copies + memsets < nodes_)
    kinds_ += ", " + std::to_string(nodes_ - kernels - copies - memsets) + " other nodes";
  cudaGraphExec_t x = nullptr;
  FFN_CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
  exec_ = x;
#else
  (void)body;
  FFN_THROW("[cuda graph] ", cuda_unavailable_reason());
#endif
}

void StepGraph::launch() const {
  FFN_CHECK(exec_, "[cuda graph] launch() before a successful capture()");
#if FFN_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  FFN_CHECK_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda::stream(device_)));
#endif
}

}  // namespace ffn
