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
#include <functional>
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
  // Note [Copy-engine gradient reduction]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A gradient bucket reduced while backward runs shares the GPU with backward's kernels.
  // NCCL's all-reduce is a kernel (24 SMs on 2 H200s for a 27 MiB bf16 bucket), and a kernel
  // beside our persistent ones (which take every SM) costs them the SMs it holds for as long
  // as it holds them. NCCL 2.28's communicators with the zero-CTA policy run an in-place
  // all-gather whose buffer lies in a symmetric window on the copy engines, without SMs
  // (probe, 2 H200s: 12 of them beside a chain of cuBLAS GEMMs cost the GEMMs 0.01 ms, 12
  // ring all-reduces 0.37 ms; bench/RESULTS-2026-11-28-s39-43.md, session 39). With
  // --grad-reduce copy-engine a bucket beside backward (all_reduce_beside;
  // reduce_scatter_beside for ZeRO-1) is reduced in two halves:
  //   - on the communicator's stream, beside backward: kernels/bucket.h's bucket_pack copies
  //     the gradients into this rank's slot of the bucket's region of the window (one
  //     device-to-device copy per tensor: the copy engines), and the all-gather brings every
  //     rank's slot to every rank;
  //   - finish_beside(), once backward has been queued: the compute stream waits for those
  //     all-gathers and bucket_mean writes the mean over the slots, in rank order, back into
  //     the gradients (every rank computes the same bits) at the width of the whole GPU,
  //     while the last bucket's all-reduce runs on the communicator's stream.
  // Each bucket has its own region (world slots of its size), so no mean waits for the next
  // bucket; the copy-engine all-gather starts only when every rank has reached it and returns
  // only when every copy is done (NCCL's ready and complete flags), and a region is written
  // again only by the next step's all-gather, after this step's means (stream order on every
  // rank). reserve_beside() allocates the window (ncclMemAlloc, registered on every rank: a
  // collective). Without it, with --grad-reduce nccl (the default), past the buckets
  // reserved for, or on a communicator that is not NCCL's, the _beside calls are the plain
  // collectives.
  // Measured (2 H200s, gpt2_small, session 39): the losses and weights are NCCL's bit for
  // bit. Taking each mean on the communicator's stream right after its all-gather, with 8 to
  // 32 thread blocks, made the step slower than NCCL's all-reduce (x1.86-1.89 against x1.92):
  // a kernel beside ours costs the SMs it sits on, whatever it does there. As built,
  // alternated twice: the profiled forward+backward 28.79 -> 28.57 ms, but the communication
  // left after backward 0.46 -> 0.76 ms (the means, beside the last all-reduce, took ~0.6 ms
  // for ~490 MB; not traced), so tokens/s is the same within the noise (x1.886, x1.876
  // against x1.884, x1.882; ZeRO-1 x1.861, x1.863 against x1.869, x1.863), for 325 MiB more
  // per GPU (gpt2_small's window). Hence not the default.
  //
  // Reserves a region for each bucket that will go through all_reduce_beside or
  // reduce_scatter_beside in a step, in that order: (bytes, tensors) of each. Every rank
  // calls it at the same point. Returns whether the _beside calls take the copy-engine path.
  virtual bool reserve_beside(const std::vector<std::pair<int64_t, int64_t>>& buckets) {
    (void)buckets;
    return false;
  }
  // all_reduce_many of a bucket whose collective runs beside compute kernels; the gradients
  // hold the mean after finish_beside() (and wait()).
  virtual void all_reduce_beside(std::vector<Tensor>& bufs, bool average, const std::string& what) {
    all_reduce_many(bufs, average, what);
  }
  // reduce_scatter of such a bucket (ZeRO-1): the mean of chunk `rank` only.
  virtual void reduce_scatter_beside(Tensor& buf, bool average, const std::string& what) {
    reduce_scatter(buf, average, what);
  }
  // The means of every _beside collective since the last call, queued on the compute stream.
  virtual void finish_beside() {}
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

// The copy-engine path's two halves (Note [Copy-engine gradient reduction]) over `slots`, a
// contiguous 1-D tensor of world equal slots in bufs' dtype. gather_slots packs bufs into
// slot `rank`, each at a 256-byte boundary (bucket_pack, on `stream`), and calls
// gather(slot `rank`) to bring every rank's slot to every rank; it returns false, doing
// nothing, when bufs do not fit in a slot. mean_slots then writes the mean (or sum) over the
// slots into bufs (with `chunk`: bufs is one flat buffer of world equal chunks, and only
// chunk `rank` is written), on the compute stream.
struct SlotBucket {
  std::vector<Tensor> bufs;
  std::vector<int64_t> offsets;
  Tensor slots;
  bool average = true;
  bool chunk = false;
};
bool gather_slots(const std::vector<Tensor>& bufs, bool average, bool chunk, const Tensor& slots,
                  int rank, int world, const std::function<void(Tensor& mine)>& gather,
                  void* stream, SlotBucket& out);
void mean_slots(SlotBucket& b, int rank, int world);
// Bytes a slot needs for tensors of these sizes (256-byte boundaries).
int64_t slot_bytes(const std::vector<int64_t>& nbytes);

// An in-process group of `world` ranks for tests: each rank is a thread holding its own
// Comm from make_thread_group(); collectives are synchronous and reduce on the CPU in rank
// order (deterministic). Records the sizes of all_reduce calls per rank.
std::vector<std::unique_ptr<Comm>> make_thread_group(int world);
std::vector<int64_t> recorded_sizes(const Comm& c);

#if FFN_WITH_NCCL
struct NcclOptions {
  double timeout_s = 300;  // sync() gives up on a collective after this long
  // Note [Copy-engine gradient reduction]: the communicator with NCCL's zero-CTA policy, so
  // that reserve_beside() can set up the copy-engine path (needs NCCL >= 2.28).
  bool copy_engine = false;
};
// Whether this build's and this process's NCCL have the copy-engine all-gather (>= 2.28).
bool nccl_has_copy_engine();
// Joins the NCCL communicator of `world` ranks on `device`; rank 0 made `unique_id` (128
// bytes) and handed it to the others (train/dist/dist.h).
std::unique_ptr<Comm> make_nccl_comm(int rank, int world, int device, const std::string& unique_id,
                                     const NcclOptions& opt);
std::string nccl_unique_id();
#endif

}  // namespace ffn::train
