// tests/train_test_util.h — what the trainer suite's files (test_train, test_stop,
// test_weights) share: a short CPU run of configs/tiny.toml.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "train/config.h"

namespace ffn::test {

// configs/tiny.toml on the CPU in `dir` for `iters` iterations: 4 sequences per step, a log
// line per step, an eval every 4 iterations on 2 batches; `sets` override further.
inline train::Config tiny_run(const std::filesystem::path& dir, int64_t iters,
                              const std::vector<std::string>& sets = {}) {
  std::vector<std::string> all = {"run.dir=" + dir.string(),
                                  "train.iters=" + std::to_string(iters),
                                  "runtime.device=cpu",
                                  "run.eval_every=4",
                                  "run.eval_iters=2",
                                  "run.log_every=1",
                                  "train.batch_size=4"};
  all.insert(all.end(), sets.begin(), sets.end());
  return train::Config::load(std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml", all);
}

}  // namespace ffn::test
