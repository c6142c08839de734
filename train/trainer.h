// train/trainer.h — the config-driven training loop behind `ffn-train`.
//
// A Trainer trains a GPT from a Config: loads the data, builds the model and AdamW on the
// chosen device, trains with the LR schedule, evaluates every run.eval_every iterations
// on fixed val (and train) batches, logs progress with ETA, appends metrics.jsonl,
// redraws loss.svg and checkpoints (Note [Checkpoint layout]). Resuming restores the
// weights, optimizer state, RNG offset and data cursor, so N steps + resume + N steps
// equals 2N steps bit for bit. A SIGTERM or SIGINT (with train/stop.h's handlers installed)
// stops the run after the step in flight, with a checkpoint (Note [Graceful stop]).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "layers/transformer.h"
#include "train/config.h"

namespace ffn::train {

class Comm;

struct TrainOptions {
  std::string resume;      // run or checkpoint directory to continue from ("" = fresh)
  // A fresh run's initial weights: a run/ckpt directory or .safetensors file in any layout
  // of train/weights.h (Note [Weight layouts]); shapes must match the config's model.
  std::string init_from;
  bool overwrite = false;  // allow starting fresh in a run dir that holds checkpoints
  int64_t stop_after = 0;  // > 0: run at most this many iterations, checkpoint and return
  bool quiet = false;      // no progress display (metrics are still written)
  // Data parallelism. Without `comm`, RANK/WORLD_SIZE/... from the environment decide
  // (train/dist/dist.h): world > 1 joins an NCCL group, one GPU per process (LOCAL_RANK).
  // Tests pass an in-process communicator instead (then any device, CPU included).
  Comm* comm = nullptr;
  int64_t bucket_mb = 25;       // gradient bucket size for the overlapped all-reduce
  // How the buckets are reduced during backward (Note [Copy-engine gradient reduction],
  // train/dist/comm.h): "nccl" (NCCL's all-reduce / reduce-scatter) or "copy-engine" (NCCL
  // >= 2.28's all-gather on the copy engines, the means after backward).
  std::string grad_reduce = "nccl";
  double comm_timeout_s = 300;  // a collective not done after this long aborts the run
  // --profile-comm: time every step's collectives and print where a data-parallel step's
  // time goes (Note [Communication profile]); also a "comm_profile" line in metrics.jsonl.
  bool profile_comm = false;
  double rendezvous_timeout_s = 120;
  // Called after each step is queued with the number of iterations done (tests send
  // signals at a known iteration with it).
  std::function<void(int64_t)> after_step;
};

struct TrainResult {
  std::string run_dir;
  int64_t iters_done = 0;     // iterations completed in total (resumed ones included)
  double last_train_loss = 0;
  double last_val_loss = 0;   // NaN if never evaluated
  double best_val_loss = 0;   // +inf if never evaluated
  double first_val_loss = 0;  // at the first eval of this process
  double ms_per_iter = 0;     // median over this process's iterations
  double tokens_per_s = 0;
  size_t peak_bytes = 0;  // the most memory live tensors held on the run's device at once
  int64_t skipped_steps = 0;
  int world = 1;
  double overlap_share = 0;  // buckets launched during backward / all buckets (world > 1)
  int stop_signal = 0;       // the signal that stopped the run early (0: it ran to the end)
  std::string last_checkpoint;  // written by this process (rank 0), "" if none
  int64_t graph_steps = 0;      // steps run as a replay of the captured step (Note [CUDA graph step])
};

// A training run, from its config to its last checkpoint. The constructor does everything
// before the first step, in order: place (world, rank, device, dtype), validate_run (run dir,
// checkpoint, data; every config error before device memory is touched), prepare_run_dir
// (the lock, --overwrite), connect (NCCL), build (model, optimizer), restore (resume) and
// announce. run() then steps to the end (or --stop-after) and returns the summary.
class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  TrainResult run();

 private:
  struct State;
  void place();
  void validate_run();
  void prepare_run_dir();
  void connect();
  void build();
  void restore();
  void restore_gemm_choices_from(const std::string& ckpt_dir);
  void announce() const;
  void step(int64_t it);
  Tensor forward_backward(const std::function<std::pair<Tensor, Tensor>(int64_t)>& batch);
  void sync_gradients();
  void eager_step(double lr);
  void replay_step(double lr);
  void finish_step(int64_t done, double lr);
  void evaluate(int64_t done);
  std::string checkpoint(int64_t done);
  std::map<std::string, std::string> resolved_values() const;
  void init_weights();
  int stop_requested(int64_t done);
  void report_comm_profile(int64_t done);
  bool eval_after(int64_t done) const;
  bool checkpoint_after(int64_t done) const;
  void summarize(const TrainResult& res) const;
  std::unique_ptr<State> s_;
};

// Trainer(cfg, opt).run().
TrainResult run_training(const Config& cfg, const TrainOptions& opt);

// The model a config describes (ffn-sample rebuilds a run's model with it).
GptConfig gpt_config(const Config& c, int64_t vocab, Device dev, DType dt);

}  // namespace ffn::train
