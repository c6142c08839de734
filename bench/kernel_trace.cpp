// bench/kernel_trace.cpp — libffn-kernel-trace.so: every kernel a CUDA process runs, with its
// start and end on the GPU's clock, written to a CSV file as it runs (Note [Kernel trace]).
//
// Note [Kernel trace]
// ~~~~~~~~~~~~~~~~~~~
// ncu times one kernel at a time with the GPU otherwise idle, so it cannot say which kernels
// get longer when something runs beside them (NCCL's collectives beside backward on 2 GPUs,
// issue 16), and Nsight Systems does not run on the device machines. This library is loaded
// by the CUDA driver into any CUDA program (ours, a PyTorch script, every rank that
// `ffn-train --nproc N` starts) through the driver's injection hook:
//   CUDA_INJECTION64_PATH=build/bench/libffn-kernel-trace.so FFN_KERNEL_TRACE=/tmp/t <program>
// It records CUPTI's concurrent-kernel activity (the kernels of CUDA graphs included) into
// FFN_KERNEL_TRACE.<pid>.csv: one line per kernel, start and end in ns, device, stream, graph
// id (0: not in a graph), grid and block size, registers per thread and the demangled name,
// last (it may hold commas). bench/kernel_trace.py sums the kernels per training step and
// compares two traces kernel by kernel.
//
// The lines are written as CUPTI hands over full buffers (small ones, 1 MiB, a few thousand
// kernels each), never from an exit handler: the first version flushed CUPTI in an atexit
// handler, and on an H200 (session 54) the traced process never exited. So the last buffer
// of a run is lost; trace more steps than you analyse. Tracing adds about a microsecond to each
// launch on the host; the kernels' own times are the GPU's. Run a traced program in the
// background and poll it (tools/ddp-check's `trace` part does): under coreutils' `timeout` the
// first traced runs outlived even its SIGKILL. Under `ffn-train --nproc 2` (session 54, 2
// H200s) both ranks started tracing but only one rank's file received kernels; the other held
// its header alone, for a reason not yet found.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_file = nullptr;
size_t g_dropped = 0;

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{1} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

// CUPTI's worker thread hands over a full buffer: its kernels go to the file at once.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::fprintf(g_file, "%llu,%llu,%u,%u,%u,%u,%u,%u,%s\n",
                 static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                 k->deviceId, k->streamId, k->graphId, k->gridX * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, static_cast<unsigned>(k->registersPerThread),
                 demangle(k->name).c_str());
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped > 0) {  // a trace with holes would misstate the steps it sums
    g_dropped += dropped;
    std::fprintf(stderr, "ffn-kernel-trace: CUPTI dropped %zu records (%zu so far)\n", dropped,
                 g_dropped);
  }
  std::fflush(g_file);
  std::free(buffer);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  const char* prefix = std::getenv("FFN_KERNEL_TRACE");
  const std::string path = std::string(prefix && *prefix ? prefix : "ffn-kernel-trace") + "." +
                           std::to_string(getpid()) + ".csv";
  g_file = std::fopen(path.c_str(), "w");
  if (!g_file) {
    std::fprintf(stderr, "ffn-kernel-trace: cannot write %s; nothing is traced\n", path.c_str());
    return 0;
  }
  std::fprintf(g_file, "start_ns,end_ns,device,stream,graph,grid,block,regs,name\n");
  std::fflush(g_file);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "ffn-kernel-trace: CUPTI refused the kernel activity; nothing is traced\n");
    return 0;
  }
  cuptiActivityFlushPeriod(100);  // hand over full buffers within 0.1 s
  std::fprintf(stderr, "ffn-kernel-trace: tracing kernels into %s\n", path.c_str());
  return 1;
}
