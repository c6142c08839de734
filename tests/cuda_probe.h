// tests/cuda_probe.h — device-side probes for the GPU tests (tests/cuda_probe.cu):
// Philox words generated on the GPU by our implementation and by cuRAND's.
#pragma once

#include <cstdint>
#include <vector>

namespace ffn::test {

// Words [4·block, 4·block+4) for blocks [0, nblocks) of stream (seed, offset).
std::vector<uint32_t> philox_words_gpu_ours(uint64_t seed, uint64_t offset, int64_t nblocks);
std::vector<uint32_t> philox_words_gpu_curand(uint64_t seed, uint64_t offset, int64_t nblocks);

}  // namespace ffn::test
