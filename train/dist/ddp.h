// train/dist/ddp.h — data-parallel gradient averaging: buckets of parameters reduced while
// backward is still running.
//
// Parameters are grouped into buckets of about `bucket_bytes`, in reverse registration
// order (the order backward finishes them: last layer first). The autograd leaf hook
// (Var::backward's on_leaf_ready) copies each finished gradient into its bucket's
// persistent flat buffer; when a bucket is complete and every bucket before it has been
// launched, its all-reduce (average) is enqueued on the communicator's stream (Note
// [Collective ordering]) while backward goes on. finish() launches what is left (a
// parameter that got no gradient contributes zeros), makes the compute stream wait, and
// hands every parameter a gradient that is a view of the averaged flat buffer.
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

struct SyncStats {
  int buckets = 0;
  int launched_in_backward = 0;  // buckets whose all-reduce started before backward ended
};

class GradSync {
 public:
  GradSync(std::vector<std::pair<std::string, Var>> params, Comm& comm, int64_t bucket_bytes,
           bool shard = false);
  // Pass to Var::backward. Valid until finish().
  Var::LeafHook hook();
  void finish();
  const SyncStats& last() const { return stats_; }
  // Bucket b's parameter names (tests and logs).
  std::vector<std::vector<std::string>> layout() const;
  // The flat layout: buckets, their parameters (indices into params, in flat order), the
  // flat buffers (padded with zeros to a multiple of the world when sharding) and where
  // parameter k lies in its bucket.
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
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, int64_t>> where_;  // param → (bucket, offset)
  std::vector<bool> filled_;
  std::unordered_map<const VarImpl*, size_t> index_;
  size_t next_ = 0;
  SyncStats stats_;
};

}  // namespace ffn::train
