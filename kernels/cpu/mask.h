// kernels/cpu/mask.h — sequential reader of a dropout mask for the CPU references.
// Caches the Philox block so a row-major sweep costs one Philox call per 8 elements.
#pragma once

#include "core/philox.h"

namespace ffn::cpu {

class MaskCursor {
 public:
  explicit MaskCursor(const DropoutSpec& d) : d_(d), thr_(d.threshold()) {}
  // Multiplier for element i: scale if kept, 0 if dropped (1 when dropout is off).
  float factor(uint64_t i) {
    if (!d_.active()) return 1.0f;
    const uint64_t blk = i >> 3;
    if (blk != cached_) {
      r_ = philox_block(d_.seed, d_.offset, blk);
      cached_ = blk;
    }
    return mask_draw(r_, i) >= thr_ ? d_.scale() : 0.0f;
  }

 private:
  DropoutSpec d_;
  uint32_t thr_;
  uint64_t cached_ = ~uint64_t{0};
  U32x4 r_{};
};

}  // namespace ffn::cpu
