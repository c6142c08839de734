// core/generator.h — a seeded source of Philox streams.
//
// A Generator is (seed, offset). Each consumer (a dropout call, a random fill)
// takes the next offset and uses the stream (seed, offset); see Note [Dropout RNG].
// Its whole state is two integers, so checkpoints save and restore it exactly.
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace ffn {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Returns the current offset and advances past it: one stream per call.
  uint64_t next_offset() { return offset_++; }
  DropoutSpec dropout(float p) { return DropoutSpec{p, seed_, next_offset(), shift_}; }
  // While set, dropout() specs carry this device pointer (DropoutSpec::offset_shift): a step
  // being captured into a CUDA graph (Note [CUDA graph step]). nullptr clears it.
  void set_offset_shift(const uint64_t* device_shift) { shift_ = device_shift; }

 private:
  uint64_t seed_;
  uint64_t offset_;
  const uint64_t* shift_ = nullptr;
};

}  // namespace ffn
