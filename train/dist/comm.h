// train/dist/comm.h — collectives for data parallelism: the interface the trainer and the
// gradient synchronizer (train/dist/ddp.h) use, NCCL behind it on GPUs, and an in-process
// group of threads behind it for CPU tests.
//
// Note [Collective ordering]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank issues the same collectives in the same order (NCCL requires it). A
// collective is enqueued after the work already queued on the device's compute stream
// (Note [One compute stream]) and runs on the communicator's own stream, so backward
// continues while it runs; wait() makes the compute stream wait for everything enqueued.
// Buffers handed to a collective must stay alive until wait(): the synchronizer uses
// persistent flat buffers for that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ffn::train {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place: buf = mean over ranks (avg) or sum over ranks. `what` names the collective
  // in timeout/error messages.
  virtual void all_reduce(Tensor& buf, bool average, const std::string& what) = 0;
  virtual void broadcast(Tensor& buf, int root, const std::string& what) = 0;
  // The compute stream waits for every collective enqueued so far (CPU: no-op).
  virtual void wait() = 0;
  // The host waits until every collective enqueued so far has finished, polling, so a lost
  // peer becomes an error instead of a hang (Note [NCCL timeouts]). Call it before reading
  // any device value that depends on a collective.
  virtual void sync() { wait(); }
  // The step the trainer is in, for messages.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

 protected:
  int64_t step_ = 0;
};

// An in-process group of `world` ranks for tests: each rank is a thread holding its own
// Comm from make_thread_group(); collectives are synchronous and reduce on the CPU in rank
// order (deterministic). Records the sizes of all_reduce calls per rank.
std::vector<std::unique_ptr<Comm>> make_thread_group(int world);
std::vector<int64_t> recorded_sizes(const Comm& c);

#if FFN_WITH_NCCL
struct NcclOptions {
  double timeout_s = 300;  // sync() gives up on a collective after this long
};
// Joins the NCCL communicator of `world` ranks on `device`; rank 0 made `unique_id` (128
// bytes) and handed it to the others (train/dist/dist.h).
std::unique_ptr<Comm> make_nccl_comm(int rank, int world, int device, const std::string& unique_id,
                                     const NcclOptions& opt);
std::string nccl_unique_id();
#endif

}  // namespace ffn::train
