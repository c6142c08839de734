// train/dist/comm.cpp — the in-process thread group and the NCCL communicator with its timeouts.
#include "train/dist/comm.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#if FFN_WITH_NCCL
#define FFN_NCCL_CHECKS 1
#include <cuda_runtime.h>

#include <atomic>
#include <deque>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "train/dist/watchdog.h"
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
      const Tensor acc = reduced(all, average);
      for (Tensor* t : all) t->copy_(acc);
    });
  }
  void reduce_scatter(Tensor& buf, bool average, const std::string& what) override {
    const int64_t n = chunk(buf, what);
    sizes_.push_back(buf.numel());
    g_->collective(rank_, &buf, [&](std::vector<Tensor*>& all) {
      const Tensor acc = reduced(all, average);
      for (size_t r = 0; r < all.size(); ++r) {
        const int64_t at = static_cast<int64_t>(r) * n;
        all[r]->narrow(0, at, n).copy_(acc.narrow(0, at, n));
      }
    });
  }
  void all_gather(Tensor& buf, const std::string& what) override {
    const int64_t n = chunk(buf, what);
    g_->collective(rank_, &buf, [&](std::vector<Tensor*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        const Tensor src = all[r]->narrow(0, static_cast<int64_t>(r) * n, n).clone();
        for (size_t d = 0; d < all.size(); ++d)
          if (d != r) all[d]->narrow(0, static_cast<int64_t>(r) * n, n).copy_(src);
      }
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
  // Σ over ranks in rank order, in f64 (deterministic), divided by the world for a mean.
  static Tensor reduced(const std::vector<Tensor*>& all, bool average) {
    Tensor acc = all[0]->to(DType::f64).clone();
    for (size_t r = 1; r < all.size(); ++r) acc.add_(*all[r]);
    if (!average) return acc;
    Tensor scaled = Tensor::zeros(acc.shape(), DType::f64);
    scaled.add_(acc, 1.0 / static_cast<double>(all.size()));
    return scaled;
  }
  int64_t chunk(const Tensor& buf, const std::string& what) const {
    FFN_CHECK(buf.dim() == 1 && buf.numel() % world() == 0, "[comm] ", what, ": ", buf.desc(),
              " does not split into ", world(), " equal chunks");
    return buf.numel() / world();
  }
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

std::string broadcast_text(Comm& comm, const std::string& text, int root, Device dev,
                           const std::string& what) {
  const bool src = comm.rank() == root;
  Tensor len = Tensor::full({1}, src ? static_cast<double>(text.size()) : 0.0, DType::i32, dev);
  comm.broadcast(len, root, what + " (length)");
  comm.sync();
  const auto n = static_cast<int64_t>(len.to_vector()[0]);
  if (n == 0) return {};
  std::vector<double> v(src ? static_cast<size_t>(n) : 0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(text[i]);
  Tensor bytes =
      src ? Tensor::from_vector(v, {n}, DType::i32, dev) : Tensor::zeros({n}, DType::i32, dev);
  comm.broadcast(bytes, root, what);
  comm.sync();
  const std::vector<double> got = bytes.to_vector();
  std::string out(static_cast<size_t>(n), '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(static_cast<int>(got[i]));
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

// Note [NCCL timeouts]
// ~~~~~~~~~~~~~~~~~~~~~
// A collective whose peer died never finishes, and a host thread blocked in a CUDA call
// that waits for it (a device-to-host copy of the loss) never returns — nor can another
// thread query CUDA meanwhile (a watchdog thread calling cudaEventQuery blocked as well,
// measured on 2×H200). So the host never blocks on a collective: sync() polls each pending collective's
// completion event and ncclCommGetAsyncError; when one is still running after the timeout
// or NCCL reports an error, it aborts the communicator (which makes the stuck kernels
// return) and throws an Error naming the collective and the step; main() exits 1.
class NcclComm final : public Comm {
 public:
  NcclComm(int rank, int world, int device, const std::string& id, const NcclOptions& opt)
      : rank_(rank), world_(world), device_(device), opt_(opt) {
    cuda::DeviceGuard guard(device);
    ncclUniqueId uid;
    FFN_CHECK(id.size() == sizeof(uid.internal), "[nccl] bad unique id size ", id.size());
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    FFN_CHECK_NCCL(ncclCommInitRank(&comm_, world, uid, rank));
    // The highest priority the device offers: a collective's kernels get SMs as soon as
    // they free up, ahead of the backward kernels queued beside them.
    int least = 0, greatest = 0;
    FFN_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    FFN_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    // Note [Collective watchdog]: the thread cannot be unwound, so the process ends here.
    watchdog_ = std::make_unique<Watchdog>(
        opt.timeout_s + kWatchdogMarginS, [rank](const std::string& what, int64_t step, double idle) {
          std::fprintf(stderr,
                       "ffn-train: error: [nccl] rank %d: collective '%s' of step %lld is still "
                       "pending and the host has been blocked for %.0f s in a CUDA call that waits "
                       "for it (a peer died or hangs); exiting (Note [Collective watchdog])\n",
                       rank, what.c_str(), static_cast<long long>(step), idle);
          std::fflush(stderr);
          std::_Exit(1);
        });
  }
  ~NcclComm() override {
    if (!aborted_) {  // after an abort: no CUDA call that could wait for a stuck kernel
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
      for (const Pending& p : pending_) cudaEventDestroy(p.done);
      for (const Timed& t : timed_) destroy(t);
      if (origin_) cudaEventDestroy(origin_);
    }
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_reduce(Tensor& buf, bool average, const std::string& what) override {
    enqueue(what, static_cast<int64_t>(buf.nbytes()), [&] {
      FFN_CHECK_NCCL(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                   nccl_type(buf.dtype()), average ? ncclAvg : ncclSum, comm_,
                                   stream_));
    });
  }
  void all_reduce_many(std::vector<Tensor>& bufs, bool average, const std::string& what) override {
    int64_t bytes = 0;
    for (const Tensor& b : bufs) {
      FFN_CHECK(b.is_contiguous(), "[nccl] ", what, ": ", b.desc(), " is not contiguous");
      bytes += static_cast<int64_t>(b.nbytes());
    }
    enqueue(what, bytes, [&] {
      FFN_CHECK_NCCL(ncclGroupStart());
      for (Tensor& b : bufs)
        FFN_CHECK_NCCL(ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<size_t>(b.numel()),
                                     nccl_type(b.dtype()), average ? ncclAvg : ncclSum, comm_,
                                     stream_));
      FFN_CHECK_NCCL(ncclGroupEnd());
    });
  }
  void reduce_scatter(Tensor& buf, bool average, const std::string& what) override {
    const size_t n = chunk(buf, what);
    enqueue(what, static_cast<int64_t>(buf.nbytes()), [&] {
      char* base = static_cast<char*>(buf.data_ptr());
      FFN_CHECK_NCCL(ncclReduceScatter(base, base + rank_ * n * dtype_size(buf.dtype()), n,
                                       nccl_type(buf.dtype()), average ? ncclAvg : ncclSum,
                                       comm_, stream_));
    });
  }
  void all_gather(Tensor& buf, const std::string& what) override {
    const size_t n = chunk(buf, what);
    enqueue(what, static_cast<int64_t>(buf.nbytes()), [&] {
      char* base = static_cast<char*>(buf.data_ptr());
      FFN_CHECK_NCCL(ncclAllGather(base + rank_ * n * dtype_size(buf.dtype()), base, n,
                                   nccl_type(buf.dtype()), comm_, stream_));
    });
  }
  void broadcast(Tensor& buf, int root, const std::string& what) override {
    enqueue(what, static_cast<int64_t>(buf.nbytes()), [&] {
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
  int64_t enqueued() const override { return enqueued_; }
  void sync_through(int64_t n) override {
    cuda::DeviceGuard guard(device_);
    while (!pending_.empty() && enqueued_ - static_cast<int64_t>(pending_.size()) < n) {
      report_progress();
      const Pending& p = pending_.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        cudaEventDestroy(p.done);
        pending_.pop_front();
        continue;
      }
      FFN_CHECK(q == cudaErrorNotReady, "[nccl] rank ", rank_, ": waiting for '", p.what,
                "' of step ", p.step, ": ", cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      std::string failure;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        failure = std::string("NCCL reported an error (") + ncclGetErrorString(async) + ")";
      const double age =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
      if (failure.empty() && age > opt_.timeout_s)
        failure = "it did not finish within " + std::to_string(static_cast<int>(opt_.timeout_s)) +
                  " s (a peer died or hangs)";
      if (!failure.empty() && p.replay) {
        // Note [Captured collectives]: a graph's collectives do not return when the
        // communicator is aborted, and everything after (the abort itself, the frees of
        // unwinding) would wait for them; so, as the watchdog does, say why and end here.
        std::fprintf(stderr,
                     "ffn-train: error: [nccl] rank %d: collective '%s' of step %lld: %s; "
                     "exiting without unwinding (a CUDA graph's collectives cannot be "
                     "aborted; Note [Captured collectives])\n",
                     rank_, p.what.c_str(), static_cast<long long>(p.step), failure.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
      if (!failure.empty()) {
        aborted_ = true;
        ncclCommAbort(comm_);
        FFN_THROW("[nccl] rank ", rank_, ": collective '", p.what, "' of step ", p.step, ": ",
                  failure, "; the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    report_progress();
  }

  // Note [Captured collectives].
  void begin_capture() override {
    FFN_CHECK(!profiling_, "[nccl] a step with --profile-comm's timed collectives cannot be "
              "captured into a CUDA graph");
    capturing_ = true;
    captured_ = 0;
  }
  void end_capture() override {
    if (!capturing_) return;
    capturing_ = false;
    if (captured_ > 0) wait();  // else the communicator's stream never joined the capture
  }
  void replayed(const std::string& what) override {
    if (captured_ == 0) return;
    FFN_CHECK(!aborted_, "[nccl] the communicator was aborted after an earlier collective failed");
    cuda::DeviceGuard guard(device_);
    cudaEvent_t done;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    FFN_CHECK_CUDA(cudaEventRecord(done, cuda::stream(device_)));
    pending_.push_back({done, std::chrono::steady_clock::now(), what, step_, true});
    ++enqueued_;
    report_progress();
  }
  int64_t captured() const override { return captured_; }

  void profile_start() override {
    cuda::DeviceGuard guard(device_);
    if (!origin_) FFN_CHECK_CUDA(cudaEventCreate(&origin_));
    FFN_CHECK_CUDA(cudaEventRecord(origin_, cuda::stream(device_)));
    profiling_ = true;
  }
  void profile_stop() override { profiling_ = false; }
  void profile_point(const std::string& what) override {
    if (!profiling_) return;
    cuda::DeviceGuard guard(device_);
    Timed t{step_, what, 0, timing_event(), nullptr, nullptr};
    FFN_CHECK_CUDA(cudaEventRecord(t.ready, cuda::stream(device_)));
    timed_.push_back(t);
  }
  std::vector<CommEvent> profile_collect() override {
    std::vector<CommEvent> out;
    if (!origin_) return out;
    cuda::DeviceGuard guard(device_);
    auto since_origin = [&](cudaEvent_t e) {
      float ms = 0;
      FFN_CHECK_CUDA(cudaEventElapsedTime(&ms, origin_, e));
      return static_cast<double>(ms);
    };
    while (!timed_.empty()) {
      const Timed& t = timed_.front();
      const cudaEvent_t last = t.end ? t.end : t.ready;
      if (cudaEventQuery(last) != cudaSuccess) break;  // not yet run: collect it next time
      CommEvent e{t.step, t.what, t.bytes, since_origin(t.ready), 0, 0};
      e.start_ms = t.start ? since_origin(t.start) : e.ready_ms;
      e.end_ms = t.end ? since_origin(t.end) : e.ready_ms;
      out.push_back(e);
      destroy(t);
      timed_.pop_front();
    }
    return out;
  }

 private:
  struct Pending {
    cudaEvent_t done;
    std::chrono::steady_clock::time_point start;
    std::string what;
    int64_t step;
    bool replay = false;  // a replayed CUDA graph's collectives (Note [Captured collectives])
  };
  struct Timed {  // --profile-comm (Note [Communication profile])
    int64_t step;
    std::string what;
    int64_t bytes;
    cudaEvent_t ready, start, end;  // start/end: null for a compute-stream point
  };
  size_t chunk(const Tensor& buf, const std::string& what) const {
    FFN_CHECK(buf.dim() == 1 && buf.numel() % world_ == 0, "[nccl] ", what, ": ", buf.desc(),
              " does not split into ", world_, " equal chunks");
    return static_cast<size_t>(buf.numel() / world_);
  }
  static cudaEvent_t timing_event() {
    cudaEvent_t e;
    FFN_CHECK_CUDA(cudaEventCreate(&e));
    return e;
  }
  static void destroy(const Timed& t) {
    for (cudaEvent_t e : {t.ready, t.start, t.end})
      if (e) cudaEventDestroy(e);
  }

  template <class F>
  void enqueue(const std::string& what, int64_t bytes, const F& call) {
    FFN_CHECK(!aborted_, "[nccl] the communicator was aborted after an earlier collective failed");
    cuda::DeviceGuard guard(device_);
    cudaEvent_t ready;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&ready, profiling_ ? 0 : cudaEventDisableTiming));
    FFN_CHECK_CUDA(cudaEventRecord(ready, cuda::stream(device_)));
    FFN_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready, 0));
    if (capturing_) {  // Note [Captured collectives]: recorded into the graph, nothing to poll
      cudaEventDestroy(ready);
      call();
      ++captured_;
      return;
    }
    cudaEvent_t done;
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    Timed t{step_, what, bytes, ready, nullptr, nullptr};
    if (profiling_) {
      t.start = timing_event();
      t.end = timing_event();
      FFN_CHECK_CUDA(cudaEventRecord(t.start, stream_));
    } else {
      cudaEventDestroy(ready);
    }
    call();
    FFN_CHECK_CUDA(cudaEventRecord(done, stream_));
    if (profiling_) {
      FFN_CHECK_CUDA(cudaEventRecord(t.end, stream_));
      timed_.push_back(t);
    }
    pending_.push_back({done, std::chrono::steady_clock::now(), what, step_});
    ++enqueued_;
    report_progress();
  }
  void report_progress() {
    if (pending_.empty())
      watchdog_->progress(0, std::string(), 0);
    else
      watchdog_->progress(static_cast<int64_t>(pending_.size()), pending_.front().what,
                          pending_.front().step);
  }
  static constexpr double kWatchdogMarginS = 30;

  int rank_, world_, device_;
  NcclOptions opt_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::deque<Pending> pending_;  // enqueued, not yet seen finished (oldest first)
  int64_t enqueued_ = 0;         // collectives enqueued since the start
  bool aborted_ = false;
  bool profiling_ = false;
  bool capturing_ = false;   // Note [Captured collectives]
  int64_t captured_ = 0;     // collectives the last capture recorded
  cudaEvent_t origin_ = nullptr;
  std::deque<Timed> timed_;  // profiled records not yet collected (oldest first)
  std::unique_ptr<Watchdog> watchdog_;  // Note [Collective watchdog]
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
