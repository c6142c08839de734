// tests/main.cpp — doctest runner; says up front whether the GPU tests will run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "core/device.h"

int main(int argc, char** argv) {
  const int gpus = ffn::cuda_device_count();
  if (gpus > 0)
    std::printf("[fused-ffn tests] %d GPU(s) found: GPU tests will run\n", gpus);
  else
    std::printf("[fused-ffn tests] GPU tests SKIPPED: %s\n",
                ffn::cuda_unavailable_reason().c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
