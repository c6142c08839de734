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

#include "kernels/bucket.h"

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

namespace {
constexpr int64_t kPartAlign = 256;  // the mean kernel's 16-byte groups line up in every part
int64_t round_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}
}  // namespace

int64_t slot_bytes(const std::vector<int64_t>& nbytes) {
  int64_t at = 0;
  for (int64_t n : nbytes) at = round_up(at + n, kPartAlign);
  return at;
}

bool gather_slots(const std::vector<Tensor>& bufs, bool average, bool chunk, const Tensor& slots,
                  int rank, int world, const std::function<void(Tensor& mine)>& gather,
                  void* stream, SlotBucket& out) {
  FFN_CHECK(!bufs.empty(), "[comm] gather_slots: no tensors");
  FFN_CHECK(!chunk || (bufs.size() == 1 && bufs[0].numel() % world == 0),
            "[comm] gather_slots: a chunked bucket is one buffer of ", world, " equal chunks");
  const int64_t es = static_cast<int64_t>(dtype_size(slots.dtype()));
  const int64_t slot = slots.numel() / world;
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const Tensor& b : bufs) {
    offsets.push_back(at / es);
    at = round_up(at + static_cast<int64_t>(b.nbytes()), kPartAlign);
  }
  if (at > slot * es) return false;
  Tensor mine = slots.narrow(0, rank * slot, slot);
  bucket_pack(bufs, offsets, mine, stream);
  gather(mine);
  out = SlotBucket{bufs, offsets, slots, average, chunk};
  return true;
}

void mean_slots(SlotBucket& b, int rank, int world) {
  if (!b.chunk) return bucket_mean(b.slots, world, b.offsets, b.bufs, b.average);
  const int64_t n = b.bufs[0].numel() / world;
  std::vector<Tensor> mine = {b.bufs[0].narrow(0, rank * n, n)};
  bucket_mean(b.slots, world, {b.offsets[0] + rank * n}, mine, b.average);
}

std::vector<int64_t> recorded_sizes(const Comm& c) {
  const auto* t = dynamic_cast<const ThreadComm*>(&c);
  return t ? t->sizes() : std::vector<int64_t>{};
}

#if FFN_WITH_NCCL

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define FFN_NCCL_CE 1  // ncclMemAlloc, symmetric windows, NCCL_CTA_POLICY_ZERO
#else
#define FFN_NCCL_CE 0
#endif

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
#if FFN_NCCL_CE
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (opt.copy_engine) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;  // Note [Copy-engine ...]
    FFN_CHECK_NCCL(ncclCommInitRankConfig(&comm_, world, uid, rank, &config));
#else
    FFN_CHECK(!opt.copy_engine,
              "[nccl] the copy-engine gradient reduction needs NCCL >= 2.28; "
              "this build has ",
              NCCL_MAJOR, ".", NCCL_MINOR);
    FFN_CHECK_NCCL(ncclCommInitRank(&comm_, world, uid, rank));
#endif
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
#if FFN_NCCL_CE
      if (window_) {
        means_.clear();
        ncclCommWindowDeregister(comm_, window_);
        ncclMemFree(window_base_);
        cudaEventDestroy(gathered_);
      }
#endif
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
    enqueue(what, bytes, [&] { all_reduce_group(bufs, average); });
  }
  // Note [Copy-engine gradient reduction].
  bool reserve_beside(const std::vector<std::pair<int64_t, int64_t>>& buckets) override {
#if FFN_NCCL_CE
    if (!opt_.copy_engine || window_ || buckets.empty()) return window_ != nullptr;
    cuda::DeviceGuard guard(device_);
    size_t total = 0;
    for (const auto& [bytes, parts] : buckets) {
      const int64_t slot = slot_bytes({bytes}) + parts * kPartAlign;  // each part's padding
      regions_.push_back({total, slot});
      total += static_cast<size_t>(slot) * static_cast<size_t>(world_);
    }
    FFN_CHECK_NCCL(ncclMemAlloc(&window_base_, total));
    FFN_CHECK_NCCL(
        ncclCommWindowRegister(comm_, window_base_, total, &window_, NCCL_WIN_COLL_SYMMETRIC));
    FFN_CHECK_CUDA(cudaEventCreateWithFlags(&gathered_, cudaEventDisableTiming));
    return true;
#else
    (void)buckets;
    return false;
#endif
  }
  void all_reduce_beside(std::vector<Tensor>& bufs, bool average,
                         const std::string& what) override {
    if (!gather_beside(bufs, average, what, false)) all_reduce_many(bufs, average, what);
  }
  void reduce_scatter_beside(Tensor& buf, bool average, const std::string& what) override {
    chunk(buf, what);
    if (!gather_beside({buf}, average, what, true)) reduce_scatter(buf, average, what);
  }
  void finish_beside() override {
#if FFN_NCCL_CE
    used_ = 0;
    if (means_.empty()) return;
    cuda::DeviceGuard guard(device_);
    FFN_CHECK_CUDA(cudaStreamWaitEvent(cuda::stream(device_), gathered_, 0));
    for (SlotBucket& b : means_) mean_slots(b, rank_, world_);
    means_.clear();
#endif
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
  // Note [Copy-engine gradient reduction]: bufs packed and all-gathered through the next
  // region of the window (chunk: only this rank's chunk of the one buffer will get its mean),
  // their mean left for finish_beside(); false where there is no window, no region left or
  // bufs do not fit in the region (then nothing was enqueued).
  bool gather_beside(const std::vector<Tensor>& bufs, bool average, const std::string& what,
                     bool chunk) {
#if FFN_NCCL_CE
    if (!window_ || used_ >= regions_.size()) return false;
    const DType dt = bufs.at(0).dtype();
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    int64_t bytes = 0;
    std::vector<int64_t> sizes;
    for (const Tensor& b : bufs) {
      FFN_CHECK(b.is_contiguous(), "[nccl] ", what, ": ", b.desc(), " is not contiguous");
      bytes += static_cast<int64_t>(b.nbytes());
      sizes.push_back(static_cast<int64_t>(b.nbytes()));
    }
    const Region& reg = regions_[used_];
    if (slot_bytes(sizes) > reg.slot_bytes || reg.slot_bytes % es != 0) return false;
    ++used_;
    char* base = static_cast<char*>(window_base_) + reg.offset;
    const int64_t slot = reg.slot_bytes / es;
    const Tensor slots = Tensor::borrow(base, {slot * world_}, dt, Device::cuda(device_));
    SlotBucket bucket;
    enqueue(what, bytes, [&] {
      gather_slots(
          bufs, average, chunk, slots, rank_, world_,
          [&](Tensor& mine) {  // in place: NCCL's copy-engine all-gather
            FFN_CHECK_NCCL(ncclAllGather(mine.data_ptr(), base, static_cast<size_t>(slot),
                                         nccl_type(dt), comm_, stream_));
          },
          stream_, bucket);
      FFN_CHECK_CUDA(cudaEventRecord(gathered_, stream_));
    });
    means_.push_back(std::move(bucket));
    return true;
#else
    (void)bufs, (void)average, (void)what, (void)chunk;
    return false;
#endif
  }
  // One grouped launch of in-place all-reduces (Note [In-place gradient buckets]).
  void all_reduce_group(std::vector<Tensor>& bufs, bool average) {
    FFN_CHECK_NCCL(ncclGroupStart());
    for (Tensor& b : bufs)
      FFN_CHECK_NCCL(ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<size_t>(b.numel()),
                                   nccl_type(b.dtype()), average ? ncclAvg : ncclSum, comm_,
                                   stream_));
    FFN_CHECK_NCCL(ncclGroupEnd());
  }
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
#if FFN_NCCL_CE
  // Note [Copy-engine gradient reduction]: the window holds one region per reserved bucket,
  // world slots each; used_ regions have been gathered into this step, their means queued by
  // finish_beside(), which waits for gathered_ (recorded after each all-gather).
  struct Region {
    size_t offset;       // bytes from window_base_
    int64_t slot_bytes;  // one slot
  };
  void* window_base_ = nullptr;
  ncclWindow_t window_ = nullptr;
  std::vector<Region> regions_;
  size_t used_ = 0;
  std::vector<SlotBucket> means_;
  cudaEvent_t gathered_ = nullptr;
#endif
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(int rank, int world, int device, const std::string& id,
                                     const NcclOptions& opt) {
  return std::make_unique<NcclComm>(rank, world, device, id, opt);
}

bool nccl_has_copy_engine() {
#if FFN_NCCL_CE
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 28, 0);
#else
  return false;
#endif
}

std::string nccl_unique_id() {
  ncclUniqueId uid;
  FFN_CHECK_NCCL(ncclGetUniqueId(&uid));
  return std::string(uid.internal, sizeof(uid.internal));
}

#endif

}  // namespace ffn::train
