// core/graph.h — StepGraph: the device work a piece of host code queues, captured once into
// a CUDA graph and replayed as one launch (Note [CUDA graph step]).
//
// Note [CUDA graph step]
// ~~~~~~~~~~~~~~~~~~~~~~
// A GPU training step is a few hundred kernels; launched one by one, each waits a few
// microseconds behind the previous one's launch on the device. Captured into a CUDA graph
// and replayed, the step is one launch and the device starts each kernel as soon as the
// previous one ends. What a capture records is exactly the work queued on the compute
// stream (Note [One compute stream]) with the arguments it had then; nothing runs during the
// capture. So a captured step must satisfy, and the code that captures it enforces:
//  * the same kernels with the same arguments every step: everything that changes from step
//    to step is read by the kernels from device memory that the host rewrites before each
//    replay: the batch, copied into fixed input tensors; the learning rate, in AdamW's
//    decision tensor (Note [Device-side step decision]); the dropout calls' Philox offsets,
//    as the captured offset plus a device-side shift (DropoutSpec::offset_shift, added by
//    DeviceMask::off() in the kernels), so replay n draws the masks the uncaptured step n
//    would (Trainer::replay_step);
//  * no host copy or readback inside (cuda::check_not_capturing throws, naming it), and no
//    synchronization (the capture's thread-local mode refuses it; the GEMM choices are
//    timed in an uncaptured step first);
//  * memory: every allocation made during the capture comes from a private pool
//    (core/cuda/allocator.h) whose blocks only a capture is ever given, so the addresses
//    baked into the graph stay the graph's until it is destroyed; tensors the host keeps
//    across replays (parameters, gradients, optimizer state, the inputs) exist before the
//    capture or are created inside it and kept.
// The trainer (train/trainer.cpp, Trainer::replay_step) captures its second step and replays
// it, all its micro-batches under gradient accumulation; a graphed run computes what an uncaptured one does, bit for bit (tests/test_train.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/device.h"

namespace ffn {

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();  // destroys the graph and hands its private pool back to the cache
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Records the device work `body` queues on `dev`'s compute stream (nothing runs yet).
  // Throws, naming the call, if body does what a graph cannot hold; the graph is then empty
  // and whatever body queued is lost.
  void capture(Device dev, const std::function<void()>& body);
  // Queues one replay on the compute stream.
  void launch() const;
  bool captured() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }
  // The captured nodes by kind, e.g. "349 kernels, 40 copies, 12 memsets".
  std::string describe() const { return kinds_; }

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int device_ = -1;
  size_t nodes_ = 0;
  std::string kinds_;
};

}  // namespace ffn
