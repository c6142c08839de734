// train/checkpoint.h — resumable checkpoints: directories of safetensors files
// (train/io/safetensors.h) plus the training state.
//
// Note [Checkpoint layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// <run>/ckpt-<iter>/ holds
//   model.safetensors   the parameters in their training dtype (PyTorch's
//                       safetensors.torch.load_file reads it)
//   optim.safetensors   AdamW's exp_avg / exp_avg_sq (and fp32 masters of 16-bit params)
//   config.toml         the resolved config of the run
//   gemm_choices.txt    the run's tuned GEMM algorithms (Note [GEMM choices]; GPU runs with
//                       autotuning on; absent otherwise and in checkpoints before session 18)
//   state.toml          format version, iteration, RNG (seed, offset), data cursor,
//                       optimizer counters, loss scale, best val loss, vocabulary, and the
//                       CRC-32 and size of both safetensors files
// Each safetensors header also carries a CRC-32 per tensor ("crc32:<name>" metadata).
// A save writes everything into ckpt-<iter>.tmp/, fsyncs each file and the directory,
// renames it to ckpt-<iter>, then atomically replaces <run>/latest (a one-line file
// naming the directory). A kill at any point leaves the previous checkpoint and
// `latest` intact. Loading verifies sizes, CRCs, names, shapes and dtypes and refuses
// anything else with a message naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/tensor.h"
#include "train/io/safetensors.h"

namespace ffn::train {

constexpr int kCheckpointVersion = 1;

struct TrainState {
  int64_t iter = 0;  // iterations completed
  uint64_t rng_seed = 0, rng_offset = 0;
  uint64_t data_cursor = 0;  // train batches drawn
  std::vector<int64_t> optim_counters;
  std::vector<double> loss_scaler;
  double best_val = 0;  // NaN-free: +inf when no eval yet
  int64_t world = 1;
  std::vector<uint8_t> vocab;  // character vocabulary (empty for token data)
};

// Saves a checkpoint for state.iter (Note [Checkpoint layout]) and then prunes all but the
// newest `keep`. Returns the checkpoint directory. A failed save removes its temp directory
// and throws, naming the bytes needed and free; `latest` and earlier checkpoints stay.
// `gemm_choices` (Note [GEMM choices]) is written as gemm_choices.txt when not empty.
std::string save_checkpoint(const std::string& run_dir, const TrainState& state,
                            const NamedTensors& model, const NamedTensors& optim,
                            const std::string& config_toml, int64_t keep,
                            const std::string& gemm_choices = {});
// A checkpoint's gemm_choices.txt, or "" when it has none.
std::string read_gemm_choices(const std::string& ckpt_dir);

// The iteration a ckpt-<iter> directory's name says, or -1 for any other name (*.tmp too).
int64_t checkpoint_iter(const std::string& dir);
// The complete ckpt-<iter> directories of a run (not *.tmp), oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);
// Atomically points <run_dir>/latest at `ckpt_name` (temp file, fsync, rename).
void write_latest(const std::string& run_dir, const std::string& ckpt_name);

// `path` is a run directory (its `latest` is used) or a ckpt-* directory.
std::string resolve_checkpoint(const std::string& path);
TrainState read_train_state(const std::string& ckpt_dir);
// Copies the stored tensors into `into` (same names, shapes; dtypes converted only from
// the stored dtype when allow_cast). Missing, extra or mismatched tensors are errors;
// allow_extra accepts stored tensors `into` does not name (a ZeRO-1 rank's part of the
// optimizer state, Note [ZeRO-1]).
void load_tensors_into(const std::string& file, const NamedTensors& into, bool allow_cast = false,
                       bool allow_extra = false);

}  // namespace ffn::train
