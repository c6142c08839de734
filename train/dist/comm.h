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
//
// Note [Deferred collective check]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The host never blocks on a collective (Note [NCCL timeouts]): it polls. Polling for a
// step's collectives right after its backward is queued would leave the GPU idle while the
// host then queues the update, so the trainer queues step N's update behind them (the
// compute stream waits for them with wait()) and polls for them (sync_through(mark)) at the
// start of step N+1: the GPU runs the update meanwhile. Nothing in between blocks on the
// device, so a lost peer is still an error after the timeout; any later and the next batch's
// upload (which waits for the compute stream, which waits for the collectives) could block
// the host on a collective that never ends. A step replayed from a CUDA graph is polled as a
// whole, once the next replay is queued (Note [Captured collectives]): the launch and the
// inputs' uploads do not wait on it (core/cuda/copy.cu's eight staging slots: with up to
// eight uploads a step, 2·accumulation + 1, a slot's last DMA was queued before an earlier
// replay, which the trainer has already seen finish; with more, the watchdog catches it).
// One NCCL communicator only: aborting one of two frees memory, which waits for the other's
// stuck kernels (a hang on 2× H200, session 9).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ffn::train {

// One timed record of --profile-comm: a collective (bytes > 0; ready/start/end) or a point
// on the compute stream (bytes = 0; at = ready = start = end).
struct CommEvent {
  int64_t step = 0;
  std::string what;
  int64_t bytes = 0;
  double ready_ms = 0, start_ms = 0, end_ms = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place: buf = mean over ranks (avg) or sum over ranks. `what` names the collective
  // in timeout/error messages.
  virtual void all_reduce(Tensor& buf, bool average, const std::string& what) = 0;
  // all_reduce of each of `bufs` (contiguous), as one collective where the backend can (NCCL:
  // one grouped launch; Note [In-place gradient buckets]). Default: one after another.
  virtual void all_reduce_many(std::vector<Tensor>& bufs, bool average, const std::string& what) {
    for (Tensor& b : bufs) all_reduce(b, average, what);
  }
  // In place over world equal chunks of buf (numel divisible by world): chunk `rank` becomes
  // the mean (or sum) over ranks of that chunk; the other chunks are left undefined.
  virtual void reduce_scatter(Tensor& buf, bool average, const std::string& what) = 0;
  // In place: every rank's chunk `rank` of buf to every rank.
  virtual void all_gather(Tensor& buf, const std::string& what) = 0;
  virtual void broadcast(Tensor& buf, int root, const std::string& what) = 0;
  // The compute stream waits for every collective enqueued so far (CPU: no-op).
  virtual void wait() = 0;
  // The host waits until every collective enqueued so far has finished, polling, so a lost
  // peer becomes an error instead of a hang (Note [NCCL timeouts]). Call it before reading
  // any device value that depends on a collective.
  void sync() { sync_through(enqueued()); }
  // The same for the first `n` collectives this communicator ever enqueued (Note [Deferred
  // collective check]); enqueued() is how many there have been.
  virtual void sync_through(int64_t n) {
    (void)n;
    wait();
  }
  virtual int64_t enqueued() const { return 0; }

  // Note [Captured collectives]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A data-parallel step captured into a CUDA graph (Note [CUDA graph step]) holds its
  // collectives: between begin_capture() and end_capture() (both inside the capture's body,
  // on the capturing thread) each collective is recorded into the graph, not run, so it
  // leaves nothing to poll; end_capture() joins the communicator's stream back into the
  // capture (the compute stream waits for it, which a capture needs and the step needs
  // anyway: its update reads the reduced gradients). After each replay is queued,
  // replayed(what) counts the replay as one more enqueued collective whose completion is an
  // event recorded behind it on the compute stream, so sync_through() polls a graphed step
  // as it polls an uncaptured one's collectives. That event is the end of the whole replay,
  // update included, so the trainer polls step N's after queuing replay N + 1 (Note
  // [Deferred collective check]): the GPU has the next step while the host waits, and
  // nothing the host does before that launch waits on the device.
  // A lost peer is an error naming the collective and the step (Note [NCCL timeouts]), but
  // where an uncaptured collective's failure aborts the communicator and throws, a replay's
  // ends the process at once with that message and exit code 1, as the watchdog does (Note
  // [Collective watchdog]): with the peer killed, the survivor's poll timed out and then the
  // process hung in the abort or in the frees of unwinding (the graph's collectives did not
  // return) until the watchdog ended it 40 s later (2× H100, session 28).
  // Every rank captures and replays the same step, so the collectives stay in the same order
  // on every rank (Note [Collective ordering]), also against the uncaptured ones (evals,
  // stop requests) between replays. --profile-comm's events are not replayed: a profiled
  // run is not captured.
  virtual void begin_capture() {}
  virtual void end_capture() {}
  virtual void replayed(const std::string& what) { (void)what; }
  // Collectives recorded by the last capture (0 where nothing was captured).
  virtual int64_t captured() const { return 0; }

  // --profile-comm (Note [Communication profile], train/dist/comm_profile.h): from
  // profile_start() on, every collective is timed (when its input was ready on the compute
  // stream, when it started and ended on the communicator's stream) and profile_point()
  // stamps the compute stream; profile_collect() returns the records whose events have
  // completed, oldest first, in ms since profile_start(), each tagged with the step that
  // set_step() named. Communicators without device streams record nothing.
  virtual void profile_start() {}
  virtual void profile_stop() {}  // no more records; those taken stay collectable
  virtual void profile_point(const std::string& what) { (void)what; }
  virtual std::vector<CommEvent> profile_collect() { return {}; }
  // The step the trainer is in, for messages.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

 protected:
  int64_t step_ = 0;
};

// Rank `root`'s `text` on every rank (the others' `text` is ignored): its length, then its
// bytes, broadcast as i32 tensors on `dev`; blocks (polling) until both have arrived.
std::string broadcast_text(Comm& comm, const std::string& text, int root, Device dev,
                           const std::string& what);

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
