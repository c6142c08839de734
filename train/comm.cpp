// train/comm.cpp — the in-process thread group and the NCCL communicator with its watchdog.
#include "train/comm.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#if FFN_WITH_NCCL
#define FFN_NCCL_CHECKS 1
#include <cuda_runtime.h>

#include <atomic>
#include <deque>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#endif

namespace ffn::train {

namespace {

// ---- in-process group ----
struct Group {
  explicit Group(int n) : world(n), slots(n) {}
  int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<Tensor*> slots;

  // Runs `combine` once all ranks have deposited their buffer, then releases everyone.
  template <class F>
  void collective(int rank, Tensor* buf, const F& combine) {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t gen = generation;
    slots[rank] = buf;
    if (++arrived == world) {
      combine(slots);
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_->world; }
  void all_reduce(Tensor& buf, bool average, const std::string&) override {
    sizes_.push_back(buf.numel());
    g_->collective(rank_, &buf, [&](std::vector<Tensor*>& all) {
      Tensor acc = all[0]->to(DType::f64).clone();
      for (size_t r = 1; r < all.size(); ++r) acc.add_(*all[r]);
      if (average) {
        Tensor scaled = Tensor::zeros(acc.shape(), DType::f64);
        scaled.add_(acc, 1.0 / static_cast<double>(all.size()));
        acc = scaled;
      }
      for (Tensor* t : all) t->copy_(acc);
    });
  }
  void broadcast(Tensor& buf, int root, const std::string&) override {
    g_->collective(rank_, &buf, [&](std::vector<Tensor*>& all) {
      const Tensor src = all[root]->clone();
      for (Tensor* t : all) t->copy_(src);
    });
  }
  void wait() override {}
  const std::vector<int64_t>& sizes() const { return sizes_; }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<int64_t> sizes_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_thread_group(int world) {
  auto g = std::make_shared<Group>(world);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<ThreadComm>(g, r));
  return out;
}

std::vector<int64_t> recorded_sizes(const Comm& c) {
  const auto* t = dynamic_cast<const ThreadComm*>(&c);
  return t ? t->sizes() : std::vector<int64_t>{};
}

#if FFN_WITH_NCCL

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f64: return ncclFloat64;
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

// Note [NCCL watchdog]
// ~~~~~~~~~~~~~~~~~~~~
// A thread polls every pending collective's completion event and ncclCommGetAsyncError.
// On an error, or a collective still running after the timeout (a peer died or hangs), it
// aborts the communicator — which makes the stuck NCCL kernels return — prints which
// collective of which step failed, and, because the main thread may be blocked inside the
// CUDA runtime with no way to see an exception, ends the process with exit code 1 after a
// short grace period. This is the one place outside main() that ends the process.
class NcclComm final : public Comm {
 public:
  NcclComm(int rank, int world, int device, const std::string& id, const NcclOptions& opt)
      : rank_(rank), world_(world), device_(device), opt_(opt) {
    cuda::DeviceGuard guard(device);
    ncclUniqueId uid;
    FFN_CHECK(id.size() == sizeof(uid.internal), "[nccl] bad unique id size ", id.size());
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    FFN_CHECK_NCCL(ncclCommInitRank(&comm_, world, uid, rank));
    FFN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclComm() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (!aborted_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_reduce(Tensor& buf, bool average, const std::string& what) override {
    enqueue(what, [&] {
      FFN_CHECK_NCCL(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                   nccl_type(buf.dtype()), average ? ncclAvg : ncclSum, comm_,
                                   stream_));
    });
  }
  void broadcast(Tensor& buf, int root, const std::string& what) override {
    enqueue(what, [&] {
      FFN_CHECK_NCCL(ncclBroadcast(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                   nccl_type(buf.dtype()), root, comm_, stream_));
    });
  }
  void wait() override {
    cuda::DeviceGuard guard(device_);
    cudaEvent_t e;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    FFN_CHECK_CUDA(cudaEventRecord(e, stream_));
    FFN_CHECK_CUDA(cudaStreamWaitEvent(cuda::stream(device_), e, 0));
    cudaEventDestroy(e);
  }

 private:
  struct Pending {
    cudaEvent_t done;
    std::chrono::steady_clock::time_point start;
    std::string what;
    int64_t step;
  };

  template <class F>
  void enqueue(const std::string& what, const F& call) {
    FFN_CHECK(!aborted_, "[nccl] the communicator was aborted (see the watchdog's message)");
    cuda::DeviceGuard guard(device_);
    cudaEvent_t ready, done;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    FFN_CHECK_CUDA(cudaEventRecord(ready, cuda::stream(device_)));
    FFN_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    call();
    FFN_CHECK_CUDA(cudaEventRecord(done, stream_));
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({done, std::chrono::steady_clock::now(), what, step_});
  }

  void watch() {
    cudaSetDevice(device_);
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::string failure;
      {
        std::lock_guard<std::mutex> lock(mu_);
        while (!pending_.empty()) {
          const cudaError_t q = cudaEventQuery(pending_.front().done);
          if (q == cudaErrorNotReady) break;
          cudaEventDestroy(pending_.front().done);
          pending_.pop_front();
        }
        if (!pending_.empty()) {
          const Pending& p = pending_.front();
          const double age =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
          // Only a collective that has actually had time to run counts: queued work ahead of
          // it on the compute stream delays its start, so allow the timeout from enqueue.
          if (age > opt_.timeout_s)
            failure = "collective '" + p.what + "' of step " + std::to_string(p.step) +
                      " did not finish within " + std::to_string(static_cast<int>(opt_.timeout_s)) +
                      " s (a peer died or hangs)";
        }
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        failure = std::string("NCCL reported an asynchronous error (") + ncclGetErrorString(async) +
                  ") at step " + std::to_string(step_);
      if (!failure.empty()) {
        std::fprintf(stderr, "\n[nccl] rank %d: %s; aborting the communicator\n", rank_,
                     failure.c_str());
        std::fflush(stderr);
        aborted_ = true;
        ncclCommAbort(comm_);
        std::this_thread::sleep_for(std::chrono::seconds(2));
        std::fprintf(stderr, "[nccl] rank %d: exiting with code 1\n", rank_);
        std::fflush(stderr);
        std::_Exit(1);  // Note [NCCL watchdog]
      }
    }
  }

  int rank_, world_, device_;
  NcclOptions opt_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::deque<Pending> pending_;
  std::thread watchdog_;
  std::atomic<bool> stop_{false}, aborted_{false};
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(int rank, int world, int device, const std::string& id,
                                     const NcclOptions& opt) {
  return std::make_unique<NcclComm>(rank, world, device, id, opt);
}

std::string nccl_unique_id() {
  ncclUniqueId uid;
  FFN_CHECK_NCCL(ncclGetUniqueId(&uid));
  return std::string(uid.internal, sizeof(uid.internal));
}

#endif

}  // namespace ffn::train
