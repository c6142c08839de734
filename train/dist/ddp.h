// train/dist/ddp.h — data-parallel gradient averaging: buckets of parameters reduced while
// backward is still running.
//
// Parameters are grouped into buckets of about `bucket_bytes`, in reverse registration
// order (the order backward finishes them: last layer first). The autograd leaf hook
// (Var::backward's on_leaf_ready) copies each finished gradient into its bucket's
// persistent flat buffer; when a bucket is complete and every bucket before it has been
// launched, its all-reduce (average) is enqueued on the communicator's stream (Note
// [Collective ordering]) while backward goes on. finish() launches what is left (a
// parameter that got no gradient contributes zeros) and makes the compute stream wait.
// Without `shard`, each bucket's all-reduce averages the parameters' own gradient tensors in
// place, as one collective (Note [In-place gradient buckets]); with `flat` (the layout
// before that, which tests/test_dist.cpp compares it with) the gradients are copied into a
// persistent flat buffer per bucket, which finish() hands back as views.
// With `shard` (ZeRO-1, Note [ZeRO-1]) each bucket is padded to a multiple of the world
// size and reduce-scattered instead: rank r gets the mean of chunk r of every bucket, and
// finish() hands out no gradients (train/dist/zero.h reads the chunks).
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "train/dist/comm.h"

namespace ffn::train {

// Note [In-place gradient buckets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Plain data parallelism reduces every gradient where backward left it: a bucket's
// all-reduce is one collective over its parameters' gradient tensors (NCCL groups them into
// one launch: ncclGroupStart/End), so backward's compute stream carries no copy kernels (one
// per parameter, 248 MB read and written per gpt2_small step) and no flat buffers are held
// (248 MB). Every gradient is final when the leaf hook reports it (the engine never writes a
// leaf's gradient again in that backward) and stays untouched until wait() puts the compute
// stream behind the collective, so nothing reads or writes it while NCCL does. A gradient
// that is not contiguous is replaced by a contiguous copy first. ZeRO-1 (shard) keeps the
// flat buffers: its reduce-scatter and the shards (train/dist/zero.h) need one flat layout.
// Measured (2 H100s, gpt2_small, session 26, one run each, bench/RESULTS-2026-11-27-s26-29.md):
// the step on the GPU's clock 34.13 -> 33.88 ms, forward+backward 32.40 -> 32.08.
// With a communicator that offers the copy-engine path (--grad-reduce copy-engine, Note
// [Copy-engine gradient reduction] in train/dist/comm.h), every bucket but the last goes
// through Comm::all_reduce_beside (ZeRO-1: reduce_scatter_beside) and finish() queues their
// means; the last bucket is reduced after backward, with nothing beside it, by NCCL's own
// collective, which needs no window of its size.

struct SyncStats {
  int buckets = 0;
  int launched_in_backward = 0;  // buckets whose all-reduce started before backward ended
};

class GradSync {
 public:
  GradSync(std::vector<std::pair<std::string, Var>> params, Comm& comm, int64_t bucket_bytes,
           bool shard = false, bool flat = false);
  // Pass to Var::backward. Valid until finish().
  Var::LeafHook hook();
  void finish();
  const SyncStats& last() const { return stats_; }
  // Whether the buckets before the last are reduced on the copy engines (Note [Copy-engine
  // gradient reduction]).
  bool copy_engine() const { return beside_; }
  // Bucket b's parameter names (tests and logs).
  std::vector<std::vector<std::string>> layout() const;
  // The flat layout: buckets, their parameters (indices into params, in flat order), the
  // flat buffers (shard or flat only; padded with zeros to a multiple of the world when
  // sharding) and where parameter k lies in its bucket.
  size_t buckets() const { return buckets_.size(); }
  const std::vector<size_t>& bucket_params(size_t b) const { return buckets_[b].params; }
  const Tensor& flat(size_t b) const { return buckets_[b].flat; }
  std::pair<size_t, int64_t> where(size_t k) const { return where_[k]; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    Tensor flat;
    int ready = 0;
    bool launched = false;
  };
  void on_ready(const Var& v);
  void launch_ready_prefix(bool in_backward);

  std::vector<std::pair<std::string, Var>> params_;
  Comm& comm_;
  bool shard_;
  bool flat_;  // gradients copied into the buckets' flat buffers (shard, or asked for)
  bool beside_ = false;  // the comm's copy-engine path for all buckets but the last
                         // (Note [Copy-engine gradient reduction])
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, int64_t>> where_;  // param → (bucket, offset)
  std::vector<bool> filled_;
  std::unordered_map<const VarImpl*, size_t> index_;
  size_t next_ = 0;
  SyncStats stats_;
};

}  // namespace ffn::train
