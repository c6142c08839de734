// train/trainer_state.h — what the Trainer's two source files share (private to them):
// the State a run holds between its steps (train/trainer_setup.cpp builds it,
// train/trainer.cpp steps it) and the out-of-memory context both wrap their work in.
#pragma once

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/graph.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/dist/comm.h"
#include "train/dist/ddp.h"
#include "train/dist/dist.h"
#include "train/dist/zero.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/trainer.h"

namespace ffn::train {

// Everything a run holds between its steps.
struct Trainer::State {
  Config cfg;
  TrainOptions opt;
  std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
  DistEnv denv;
  int world = 1, rank = 0;
  bool lead = true;  // rank 0 logs, writes metrics and pictures, and checkpoints
  Device dev;
  DType dt = DType::f32;
  std::string run_dir, resume_dir;
  Dataset data;
  int64_t vocab = 0;
  TrainState resumed;
  std::optional<RunLock> lock;
  std::unique_ptr<Comm> owned_comm;
  Comm* comm = nullptr;
  std::shared_ptr<Generator> rng;
  std::unique_ptr<GPT> model;
  std::vector<std::pair<std::string, Var>> params;
  std::unique_ptr<AdamW> optim;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<ZeroShards> zero;  // train.zero = 1 under data parallelism (Note [ZeRO-1])
  // Note [Gradient accumulation]: fp32 sums of the earlier micro-batches' gradients.
  std::vector<Tensor> grad_acc;
  std::unordered_map<const VarImpl*, size_t> param_index;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<RunRecord> record;
  std::string branch;
  std::optional<std::pair<int64_t, double>> pending;  // (done, lr) of a deferred step
  std::string last_checkpoint;                        // written by this process
  int64_t last_checkpoint_iter = -1;
  uint64_t cursor = 0, data_seed = 0, eval_seed = 0;
  int64_t start_iter = 0, end_iter = 0, decay_iters = 0;
  int64_t buckets_total = 0, buckets_overlapped = 0;
  // Note [Deferred collective check]: the collectives of the last queued step end here.
  int64_t comm_mark = 0;
  bool profiling = false;               // --profile-comm under data parallelism
  std::vector<CommEvent> comm_events;   // Note [Communication profile]
  double best_val = INFINITY, last_loss = NAN, first_val = NAN, last_val = NAN;
  // Note [CUDA graph step]: why the step is not captured ("": it is, from the process's
  // second step on), the captured step and its fixed inputs, the dropout offsets: the
  // generator's at the capture, how many a step draws, and the device-side shift a replay
  // adds to the captured ones (one uint64 in an i32 [2]); and how many steps replayed it.
  // Last, so the graph is destroyed (its private pool released) before the tensors above.
  std::string graph_off;
  std::vector<Tensor> graph_x, graph_y;  // one per micro-batch
  Tensor graph_shift;
  uint64_t graph_offset = 0, graph_draws = 0;
  SyncStats graph_sync;  // the captured step's buckets (Note [Captured collectives])
  std::unique_ptr<StepGraph> graph;
  int64_t graph_steps = 0;
};

namespace detail {

// An allocation failure (ours, or std::bad_alloc from the C++ library) as an error that says
// where in the run it happened and what to lower; every other error passes unchanged.
// `stage` is text, or a callable giving it (built only on a failure: the per-step call
// stays free of string work).
template <class Stage, class F>
void with_oom_context(const Stage& stage, const Device& dev, F&& body) {
  auto advice = [&](const std::string& what) {
    std::string where;
    if constexpr (std::is_invocable_v<Stage>)
      where = stage();
    else
      where = stage;
    return "[train] out of memory " + where + " on " + dev.str() + ":\n  " + what +
           "\n  To fit, lower train.batch_size (train.grad_accum_steps keeps the global batch), "
           "model.context, model.d_model or model.layers.";
  };
  try {
    body();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::out_of_memory) throw;
    throw Error(advice(e.what()), ErrorKind::out_of_memory);
  } catch (const std::bad_alloc&) {
    throw Error(advice("std::bad_alloc"), ErrorKind::out_of_memory);
  }
}

}  // namespace detail

}  // namespace ffn::train
