// train/dist/zero.h — ZeRO-1 for data parallelism: the optimizer state sharded over the ranks,
// gradients reduce-scattered and parameters all-gathered.
//
// Note [ZeRO-1]
// ~~~~~~~~~~~~~
// train.zero = 1 shards AdamW's state over the data-parallel ranks along GradSync's flat
// buckets (train/dist/ddp.h):
//   - every bucket is padded to a multiple of the world size W and cut into W equal chunks;
//     rank r owns chunk r of every bucket, so a parameter can be split across ranks and the
//     shards differ by at most one element per bucket;
//   - gradients are reduce-scattered bucket by bucket while backward runs (half the bytes of
//     an all-reduce): each rank receives the mean of its chunks only;
//   - each rank's AdamW updates the slices of parameters in its chunks ("<name>[a:b]",
//     1-D views of a flat bf16 copy of the parameters) and holds only their fp32 masters and
//     moments: optimizer memory per rank drops by W (12 of the 14 bytes per bf16 parameter
//     are state). A slice keeps its parameter's weight-decay decision;
//   - the squared gradient norm of each rank's chunks is summed over the ranks before the
//     step is decided, so the clip, the grad norm and the finite check are global and every
//     rank takes the same decision (Note [Device-side step decision]);
//   - then every bucket's parameters are all-gathered (each while the next bucket's slices
//     are updated) and copied into the model.
// The update of each element is the arithmetic of a run without ZeRO; the gradient norm is
// summed in another order, so the clip factor (and the logged norm) can differ in the last
// bits. Checkpoints gather the slices (gather_state) into exactly the files a run without
// ZeRO writes, and a resume scatters them back (scatter_state), so a run moves between
// zero = 0 and 1; the evaluation's replica check still compares every rank's weights.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "train/dist/comm.h"
#include "train/dist/ddp.h"
#include "train/io/safetensors.h"

namespace ffn::train {

class ZeroShards {
 public:
  // `sync` reduce-scatters (GradSync with shard = true) over `params`; its buckets define
  // the chunks. Packs the current parameter values.
  ZeroShards(const GradSync& sync, std::vector<std::pair<std::string, Var>> params, Comm& comm);
  // The optimizer's parameters: this rank's slices, and each slice's weight-decay flag (its
  // parameter's: matrices only, or all).
  const std::vector<std::pair<std::string, Var>>& slices() const { return slice_vars_; }
  std::vector<bool> decay(bool decay_matrices_only) const;
  // The parameters changed outside the optimizer (init, resume): pack them again.
  void load_params();
  // After GradSync::finish(): each slice's gradient is its part of this rank's chunk.
  void bind_grads();
  // The slices come bucket by bucket, the largest bucket first: groups() are the slice
  // counts per bucket in that order (for AdamWOptions::groups; a bucket may have none here).
  // gather_bucket(g), called once group g's update is queued, all-gathers that bucket's
  // parameters; gather_params() then copies every bucket into the model's parameters after
  // the compute stream waited for the all-gathers. So the all-gather of one bucket overlaps
  // the update of the next.
  std::vector<size_t> groups() const;
  void gather_bucket(size_t group);
  void gather_params();
  // The state of every parameter in a plain AdamW's names, order and shapes, gathered from
  // `local` (this rank's AdamW::state(), of the slices). A collective.
  NamedTensors gather_state(const NamedTensors& local);
  // The reverse: this rank's slices of `full` (gather_state's names) into `local`.
  void scatter_state(const NamedTensors& full, const NamedTensors& local) const;
  // Zero full-shaped state in gather_state's names (what a checkpoint is read into).
  NamedTensors state_templates() const;
  int64_t owned_numel() const;  // elements of the parameters this rank updates

 private:
  struct Slice {
    size_t param;    // index into params_
    size_t bucket;   // its bucket
    int64_t at;      // position in the bucket's flat buffer
    int64_t from;    // first element within the parameter
    int64_t n;       // elements
    std::string name;
  };
  // The state kinds of a parameter: suffix and dtype (".exp_avg", ".exp_avg_sq", ".master").
  std::vector<std::pair<std::string, DType>> kinds(size_t param) const;
  const GradSync& sync_;
  std::vector<std::pair<std::string, Var>> params_;
  Comm& comm_;
  std::vector<Tensor> flat_params_;  // per bucket, the parameters' current values, flat
  std::vector<size_t> order_;        // buckets, largest first (ties: in bucket order)
  std::vector<Slice> slices_;
  std::vector<std::pair<std::string, Var>> slice_vars_;
};

}  // namespace ffn::train
