// core/readback.h — reading a small tensor on the host without draining the device queue.
//
// Tensor::item() and to_vector() wait for everything queued before them. A training loop
// that reads one value per step (the loss, the gradient norm) would idle the GPU at every
// read. A Readback queues the copy behind the work already on the device's compute stream
// (into pinned host memory, Note [One compute stream]) and returns at once; wait() blocks
// only when the values are asked for, typically after the next step has been queued.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ffn {

class Readback {
 public:
  Readback() = default;
  ~Readback();
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;

  // Queues a copy of `src` (contiguous, any dtype, at most kMaxBytes). A CPU tensor is
  // read at once. Throws if the previous copy was not waited for.
  void start(const Tensor& src);
  bool pending() const { return pending_; }
  // Waits for the copy started last and returns its values as doubles.
  std::vector<double> wait();

  static constexpr size_t kMaxBytes = 4096;

 private:
  bool pending_ = false;
  bool from_device_ = false;
  Tensor host_;           // CPU tensor the values land in (pinned memory for a GPU source)
  void* pinned_ = nullptr;
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = -1;
};

}  // namespace ffn
