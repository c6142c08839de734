// train/trainer.cpp — the training loop (train/trainer.h): steps, evaluations, checkpoints and
// the summary; what comes before the first step is train/trainer_setup.cpp.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "core/generator.h"
#include "kernels/gemm.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/dist/comm.h"
#include "train/dist/comm_profile.h"
#include "train/dist/ddp.h"
#include "train/dist/dist.h"
#include "train/dist/zero.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/stop.h"

#include "train/trainer_state.h"

namespace ffn::train {

using detail::with_oom_context;

namespace {

constexpr int64_t kProfiledSteps = 200;  // --profile-comm times this many steps, then stops

// Mean loss over `iters` fixed batches of a split (eval mode, no graph). With several ranks
// each evaluates its rows of every batch and the means are averaged.
double estimate_loss(GPT& model, const std::vector<int32_t>& tokens, const Config& c,
                     uint64_t seed, Device dev, Comm* comm) {
  NoGradGuard ng;
  model.eval();
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  double sum = 0;
  for (int64_t i = 0; i < c.run.eval_iters; ++i) {
    const Batch b = sample_batch(tokens, c.train.batch_size, c.model.context, seed,
                                 static_cast<uint64_t>(i), rank, world);
    sum += model.loss(b.x.to(dev), b.y.to(dev), /*ids_in_range=*/true).value().item();
  }
  model.train();
  double mean = sum / static_cast<double>(c.run.eval_iters);
  if (world > 1) {
    Tensor t = Tensor::full({1}, mean, DType::f64, Device::cpu()).to(DType::f32).to(dev);
    comm->all_reduce(t, true, "eval loss");
    comm->sync();
    mean = t.item();
  }
  return mean;
}

// Debug check that data parallelism keeps every rank's parameters bitwise identical:
// rank 0's CRC-32 of all parameter bytes is broadcast and compared everywhere.
void check_replicas(const std::vector<std::pair<std::string, Var>>& params, Comm& comm,
                    Device dev, int64_t step) {
  uint32_t crc = 0;
  for (const auto& [n, v] : params) {
    const Tensor h = v.value().to(Device::cpu()).contiguous();
    crc = crc32(h.data_ptr(), h.nbytes(), crc);
  }
  Tensor c0 = Tensor::full({1}, static_cast<double>(crc), DType::f64, dev);
  comm.broadcast(c0, 0, "replica checksum");
  comm.sync();
  Tensor bad = Tensor::full({1}, c0.item() == static_cast<double>(crc) ? 0.0 : 1.0, DType::f32, dev);
  comm.all_reduce(bad, false, "replica check");
  comm.sync();
  FFN_CHECK(bad.item() == 0.0, "[ddp] parameters differ across ranks at step ", step, " (",
            bad.item(), " rank(s) differ from rank 0)");
}

}  // namespace

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  Trainer t(cfg, opt);
  return t.run();
}

// Every rank calls it at the same iterations: under ZeRO-1 the optimizer state is first
// gathered from the ranks' slices (a collective); rank 0 writes.
std::string Trainer::checkpoint(int64_t done) {
  State& s = *s_;
  const NamedTensors optim = s.zero ? s.zero->gather_state(s.optim->state()) : s.optim->state();
  s.last_checkpoint_iter = done;
  if (!s.lead) return {};
  TrainState t;
  t.iter = done;
  t.rng_seed = s.rng->seed();
  t.rng_offset = s.rng->offset();
  t.data_cursor = s.cursor;
  t.optim_counters = s.optim->counters();
  t.loss_scaler = s.scaler->state();
  t.best_val = s.best_val;
  t.world = s.world;
  t.vocab = s.data.chars;
  s.last_checkpoint =
      save_checkpoint(s.run_dir, t, s.model->stored_view(values_of(s.params)),
                      s.model->stored_view(optim), s.cfg.to_toml(resolved_values()),
                      s.cfg.run.keep_checkpoints, s.dev.is_cuda() ? gemm_choices() : std::string());
  return s.last_checkpoint;
}

void Trainer::evaluate(int64_t done) {
  State& s = *s_;
  const auto t0 = std::chrono::steady_clock::now();
  const double val = estimate_loss(*s.model, s.data.val, s.cfg, s.eval_seed, s.dev, s.comm);
  const double tr = estimate_loss(*s.model, s.data.train, s.cfg, s.eval_seed + 1, s.dev, s.comm);
  if (s.world > 1) check_replicas(s.params, *s.comm, s.dev, done);
  s.progress->add_eval_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.best_val = std::min(s.best_val, val);
  if (std::isnan(s.first_val)) s.first_val = val;
  s.last_val = val;
  s.record->eval(done, val, tr, s.best_val);
  s.progress->eval_line(done, val, tr, s.best_val);
}

bool Trainer::eval_after(int64_t done) const {
  return done % s_->cfg.run.eval_every == 0 || done == s_->cfg.train.iters;
}

bool Trainer::checkpoint_after(int64_t done) const {
  const RunSection& r = s_->cfg.run;
  return done == s_->end_iter ||
         (r.checkpoint_every > 0 ? done % r.checkpoint_every == 0 : eval_after(done));
}

// What is known of a step once its optimizer outcome is back (Note [Device-side step
// decision]): its time, logs, and the eval and checkpoint that follow it.
void Trainer::finish_step(int64_t done, double lr) {
  State& s = *s_;
  StepReport rep;
  if (s.profiling) {  // Note [Communication profile]: the first kProfiledSteps steps
    for (CommEvent& e : s.comm->profile_collect()) s.comm_events.push_back(std::move(e));
    if (done - s.start_iter >= kProfiledSteps) s.comm->profile_stop();
  }
  try {
    rep = s.optim->finish();
  } catch (const Error& e) {
    throw Error("[train] iter " + std::to_string(done) + ": " + e.what(), e.kind());
  }
  s.scaler->update(rep.skipped);
  s.last_loss = rep.loss;
  s.progress->step_finished();
  if (done % s.cfg.run.log_every == 0 || done == s.end_iter || rep.skipped) {
    const WindowStats w = s.progress->window();
    s.record->step(done, rep.loss, lr, rep.grad_norm, w, s.optim->skipped());
    s.progress->step_line(done, s.end_iter, rep.loss, lr, w, rep.skipped);
  }
  const bool eval_now = eval_after(done), ckpt_now = checkpoint_after(done);
  if (eval_now) evaluate(done);
  if (ckpt_now) {
    const std::string dir = checkpoint(done);
    if (done == s.end_iter) s.progress->line("checkpoint: " + dir);
  }
  if (eval_now || ckpt_now) s.progress->restart_clock();  // steps exclude evals and saves
}

// The step's forward and backward passes, micro-batch by micro-batch, on the inputs
// `batch(j)` gives for micro-batch j; returns the step's loss (a one-element tensor).
Tensor Trainer::forward_backward(const std::function<std::pair<Tensor, Tensor>(int64_t)>& batch) {
  State& s = *s_;
  const Config& c = s.cfg;
  // Note [Gradient accumulation]: micro-batch j of the step is shard j·world + rank of one
  // global batch of batch_size · A sequences drawn at the step's cursor, so A micro-batches
  // of B are the rows of one batch of A·B (A = 1: exactly the batches without accumulation).
  // Each backward is seeded with scale / A; the earlier micro-batches' gradients are summed
  // into fp32 buffers as each leaf finishes (and zeroed), the last one's leaf hook adds that
  // sum back (one rounding to the parameter dtype) before its data-parallel all-reduce.
  const int64_t A = c.train.grad_accum_steps;
  Tensor lt;
  for (int64_t j = 0; j < A; ++j) {
    const bool last = j == A - 1;
    const auto [x, y] = batch(j);
    // Every token is < vocab_size (Note [Token ids in range]), so the per-step GPU range
    // checks and their syncs are skipped.
    Var loss = s.model->loss(x, y, /*ids_in_range=*/true);
    const Tensor seed = Tensor::full({}, s.scaler->scale() / static_cast<double>(A),
                                     loss.value().dtype(), s.dev);
    if (A == 1) {
      lt = loss.value().reshape({1});
    } else {
      if (j == 0) lt = Tensor::zeros({1}, DType::f32, s.dev);
      lt.add_(loss.value().reshape({1}), 1.0 / static_cast<double>(A));
    }
    // Data parallel: the step's loss is averaged over the ranks (a non-finite loss on any
    // rank reaches all) ahead of the last backward's gradient buckets, so the collective
    // runs beside backward instead of after it (it was 0.04 ms exposed a gpt2_small step).
    if (last && s.sync) {
      lt = lt.clone();
      s.comm->all_reduce(lt, true, "loss");
    }
    Var::LeafHook hook;
    if (A > 1 && !last) {
      hook = [&s](const Var& v) {
        auto k = s.param_index.find(v.impl());
        if (k == s.param_index.end()) return;
        s.grad_acc[k->second].add_(v.grad());
        Tensor g = v.grad();
        g.zero_();
      };
    } else if (A > 1) {
      Var::LeafHook sync = s.sync ? s.sync->hook() : Var::LeafHook();
      hook = [&s, sync](const Var& v) {
        auto k = s.param_index.find(v.impl());
        if (k != s.param_index.end()) {
          Tensor g = v.grad();
          g.add_(s.grad_acc[k->second]);
          s.grad_acc[k->second].zero_();
        }
        if (sync) sync(v);
      };
    } else if (s.sync) {
      hook = s.sync->hook();
    }
    if (hook)
      loss.backward(seed, hook);
    else
      loss.backward(seed);
  }
  return lt;
}

// Data parallel, after the backward is queued: averaged gradients on every rank. finish()
// also puts the compute stream behind the communicator's, so the update reads the averaged
// loss too (queued there before them).
void Trainer::sync_gradients() {
  State& s = *s_;
  s.sync->finish();
  if (s.zero) {  // Note [ZeRO-1]: the slices' gradients are this rank's chunks
    for (auto& [n, p] : s.params) p.zero_grad();
    s.zero->bind_grads();
  }
}

// One step's forward, backward (micro-batch by micro-batch), gradient sync and update, each
// kernel launched as it comes; the previous step is finished before the update is queued.
void Trainer::eager_step(double lr) {
  State& s = *s_;
  const Config& c = s.cfg;
  const int64_t A = c.train.grad_accum_steps;
  Tensor lt = forward_backward([&](int64_t j) {
    const Batch b = sample_batch(s.data.train, c.train.batch_size * A, c.model.context,
                                 s.data_seed, s.cursor, static_cast<int>(j) * s.world + s.rank,
                                 static_cast<int>(A) * s.world);
    return std::make_pair(b.x.to(s.dev), b.y.to(s.dev));
  });
  ++s.cursor;
  if (s.sync) {
    if (s.profiling) s.comm->profile_point("backward");
    sync_gradients();
    s.buckets_total += s.sync->last().buckets;
    s.buckets_overlapped += s.sync->last().launched_in_backward;
    if (s.profiling) s.comm->profile_point("synced");
  }
  if (s.pending) finish_step(s.pending->first, s.pending->second), s.pending.reset();
  s.optim->launch(lr, lt, s.scaler->scale());
  if (s.zero) s.zero->gather_params();  // Note [ZeRO-1]: all-gathered during the update
  if (s.profiling) s.comm->profile_point("optimizer");
  // Every collective of this step (ZeRO's norm and all-gathers included) is polled at the
  // start of the next one (Note [Deferred collective check]).
  if (s.comm) s.comm_mark = s.comm->enqueued();
  s.optim->zero_grad();
}

namespace {
// Writes `v` into the one-uint64 device tensor `t` (queued on the compute stream).
void write_u64(Tensor& t, uint64_t v) {
  Tensor h = Tensor::empty({2}, DType::i32);
  std::memcpy(h.data_ptr(), &v, sizeof v);
  t.copy_(h);
}
}  // namespace

// Note [CUDA graph step]: the batch goes into the captured step's fixed inputs, the rate into
// AdamW's decision and the dropout calls' offset shift into graph_shift; the step (forward,
// backward, update and the gradients' release) is captured the first time and replayed from
// then on. The capture draws the step's dropout offsets from the generator as an uncaptured
// step would, with the shift's address in every spec; replay n of a step that draws D
// offsets runs with shift n·D, so its masks are the ones the uncaptured step n would draw,
// and the generator is advanced by D as that step would have advanced it. Under data
// parallelism the collectives are part of the graph (Note [Captured collectives]): each
// replay counts as one enqueued collective, which step() polls once the next replay is
// queued (Note [Deferred collective check]).
void Trainer::replay_step(double lr) {
  State& s = *s_;
  const Config& c = s.cfg;
  const int64_t A = c.train.grad_accum_steps;
  for (int64_t j = 0; j < A; ++j) {  // the micro-batches eager_step would draw
    const Batch b = sample_batch(s.data.train, c.train.batch_size * A, c.model.context,
                                 s.data_seed, s.cursor, static_cast<int>(j) * s.world + s.rank,
                                 static_cast<int>(A) * s.world);
    if (static_cast<int64_t>(s.graph_x.size()) <= j) {
      s.graph_x.push_back(b.x.to(s.dev));
      s.graph_y.push_back(b.y.to(s.dev));
    } else {
      s.graph_x[j].copy_(b.x);
      s.graph_y[j].copy_(b.y);
    }
  }
  s.optim->set_lr(lr);
  ++s.cursor;
  if (!s.graph) {
    auto g = std::make_unique<StepGraph>();
    s.graph_shift = Tensor::zeros({2}, DType::i32, s.dev);
    s.graph_offset = s.rng->offset();
    s.rng->set_offset_shift(static_cast<const uint64_t*>(s.graph_shift.data_ptr()));
    try {
      g->capture(s.dev, [this, &s] {
        if (s.comm) s.comm->begin_capture();
        const Tensor lt = forward_backward(
            [&s](int64_t j) { return std::make_pair(s.graph_x[j], s.graph_y[j]); });
        if (s.sync) {
          sync_gradients();
          s.graph_sync = s.sync->last();
        }
        s.optim->queue(lt, s.scaler->scale());
        if (s.zero) s.zero->gather_params();  // Note [ZeRO-1]: all-gathered during the update
        s.optim->zero_grad();
        if (s.comm) s.comm->end_capture();  // joins the communicator's stream
      });
    } catch (...) {
      s.rng->set_offset_shift(nullptr);
      throw;
    }
    s.rng->set_offset_shift(nullptr);
    s.graph_draws = s.rng->offset() - s.graph_offset;
    s.graph = std::move(g);
    s.progress->line("CUDA graph: captured the step: " + s.graph->describe());
  } else if (s.graph_draws > 0) {
    write_u64(s.graph_shift, s.rng->offset() - s.graph_offset);
    s.rng->set_offset(s.rng->offset() + s.graph_draws);
  }
  s.graph->launch();
  ++s.graph_steps;
  if (s.comm) {
    s.comm->replayed("the captured step's " + std::to_string(s.comm->captured()) +
                     " collectives");
    s.comm_mark = s.comm->enqueued();
    s.buckets_total += s.graph_sync.buckets;
    s.buckets_overlapped += s.graph_sync.launched_in_backward;
  }
}

// Queues one step's forward, backward and optimizer update; finishes it at once or after
// the next step is queued.
void Trainer::step(int64_t it) {
  State& s = *s_;
  const Config& c = s.cfg;
  const double lr = lr_at(c.train.schedule, it, c.train.lr, c.train.min_lr, c.train.warmup,
                          s.decay_iters);
  // The previous step's collectives (Note [Deferred collective check]): its update is
  // queued behind them, so the GPU stays busy while the host polls, and nothing below
  // (the batch upload waits for the compute stream) can block on a lost peer. A replayed
  // step's mark is the end of its replay (Note [Captured collectives]): polled after the
  // next replay is queued, below, so the GPU is not left idle meanwhile.
  const bool replay = s.graph_off.empty() && it > s.start_iter;
  const int64_t prev_mark = s.comm_mark;
  if (s.comm && !(replay && s.graph)) s.comm->sync_through(prev_mark);
  if (s.comm) s.comm->set_step(it + 1);
  // Note [GEMM choices]: every rank timed its own GEMM candidates in the first step; from
  // the second on all use rank 0's, the choices its checkpoints hold, so a resumed run
  // computes on every rank what this one did.
  if (it == s.start_iter + 1 && s.comm && s.dev.is_cuda() && gemm_autotune()) {
    const std::string text =
        broadcast_text(*s.comm, s.lead ? gemm_choices() : std::string(), 0, s.dev, "GEMM choices");
    if (!s.lead && !text.empty()) restore_gemm_choices(text, "rank 0's GEMM choices", true);
  }
  if (s.profiling) s.comm->profile_point("step");
  // Note [CUDA graph step]: from the process's second step on (the first times the GEMM
  // choices and makes what the layers create once), where the run allows it.
  if (replay) {
    replay_step(lr);  // queues the inputs' uploads and the replay, neither waits on the GPU
    if (s.comm) s.comm->sync_through(prev_mark);
    if (s.pending) finish_step(s.pending->first, s.pending->second), s.pending.reset();
    s.optim->start_report();
  } else {
    eager_step(lr);
  }
  const int64_t done = it + 1;
  // A step whose outcome nothing needs before the next step is queued is finished one
  // iteration later, after the next forward and backward are queued: the host then never
  // waits on an idle GPU. Finished at once: steps followed by an eval or checkpoint,
  // loss-scaled (fp16) steps (the next loss seed depends on the outcome) and CPU steps (the
  // step has already run, so there is nothing to overlap, and deferring would charge each
  // step its successor's forward and backward). A data-parallel step finished at once
  // first waits, polling, for its collectives (Note [NCCL timeouts]).
  const bool now =
      s.dev.is_cpu() || s.scaler->enabled() || eval_after(done) || checkpoint_after(done);
  if (now) {
    if (s.comm) s.comm->sync();
    finish_step(done, lr);
  } else {
    s.pending = std::make_pair(done, lr);
  }
}

// Note [Graceful stop]: the signal to stop on after `done` iterations, or 0; under data
// parallelism only every kStopAgreeEvery iterations, agreed by all ranks.
int Trainer::stop_requested(int64_t done) {
  State& s = *s_;
  const int local = stop_signal();
  if (done >= s.end_iter) return 0;  // finishing anyway
  if (s.world == 1) return local;
  if (done % kStopAgreeEvery != 0) return 0;
  Tensor flag = Tensor::full({1}, local ? 1.0 : 0.0, DType::f32, s.dev);
  s.comm->all_reduce(flag, false, "stop request");
  s.comm->sync();  // the sum, not the flag before it (it is reduced on the comm stream)
  return flag.to_vector()[0] > 0 ? (local ? local : SIGTERM) : 0;
}

TrainResult Trainer::run() {
  State& s = *s_;
  if (s.start_iter == 0)
    with_oom_context("evaluating the initial model", s.dev, [this] { evaluate(0); });
  int64_t done = s.end_iter;
  int stop = 0;
  for (int64_t it = s.start_iter; it < s.end_iter; ++it) {
    with_oom_context(
        [it] { return "in iteration " + std::to_string(it + 1) + " (forward, backward, update)"; },
        s.dev, [this, it] { step(it); });
    if (s.opt.after_step) s.opt.after_step(it + 1);
    if ((stop = stop_requested(it + 1)) != 0) {
      done = it + 1;
      break;
    }
  }
  if (s.pending) {
    if (s.comm) s.comm->sync();
    finish_step(s.pending->first, s.pending->second), s.pending.reset();
  }
  if (s.profiling) report_comm_profile(done);
  std::string ckpt = s.last_checkpoint;
  if (stop) {
    if (s.last_checkpoint_iter != done) ckpt = checkpoint(done);
    s.record->stopped(done, signal_name(stop));
  }
  s.progress->end();
  TrainResult res;
  res.run_dir = s.run_dir;
  res.iters_done = done;
  res.stop_signal = stop;
  res.last_checkpoint = ckpt;
  res.last_train_loss = s.last_loss;
  res.last_val_loss = s.last_val;
  res.first_val_loss = s.first_val;
  res.best_val_loss = s.best_val;
  res.skipped_steps = s.optim->skipped();
  res.graph_steps = s.graph_steps;
  res.world = s.world;
  res.overlap_share = s.buckets_total ? static_cast<double>(s.buckets_overlapped) /
                                            static_cast<double>(s.buckets_total)
                                      : 0.0;
  res.ms_per_iter = s.progress->median_ms();
  res.peak_bytes = memory_stats(s.dev).peak;
  if (res.ms_per_iter > 0)
    res.tokens_per_s = static_cast<double>(s.cfg.train.batch_size * s.cfg.train.grad_accum_steps *
                                           s.cfg.model.context) /
                       (res.ms_per_iter / 1e3);
  summarize(res);
  return res;
}

void Trainer::report_comm_profile(int64_t done) {
  State& s = *s_;
  for (CommEvent& e : s.comm->profile_collect()) s.comm_events.push_back(std::move(e));
  // The first steps warm up (allocator, GEMM choices); the median takes care of evals.
  const CommProfile p = summarize_comm_profile(s.comm_events, 5);
  s.record->note(done, comm_profile_fields(p));
  if (s.lead) std::printf("%s", format_comm_profile(p).c_str());
}

void Trainer::summarize(const TrainResult& res) const {
  const State& s = *s_;
  if (!s.progress->shown()) return;
  if (s.world > 1) {
    char buf[240];
    std::snprintf(buf, sizeof(buf),
                  "data parallel: %d processes, %.0f%% of gradient buckets reduced while backward "
                  "was still running%s",
                  s.world, 100 * res.overlap_share,
                  s.sync && s.sync->copy_engine() ? " (all but the last on the copy engines)" : "");
    std::printf("%s\n", buf);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.t_start).count();
  if (res.stop_signal) {
    std::printf("stopped by %s at iter %lld of %lld (not finished): checkpoint %s\n"
                "continue with: ffn-train --resume %s\n",
                signal_name(res.stop_signal), static_cast<long long>(res.iters_done),
                static_cast<long long>(s.cfg.train.iters), res.last_checkpoint.c_str(),
                s.run_dir.c_str());
    return;
  }
  std::printf("done: %lld iters in %s | best val loss %.4f | median %.1f ms/iter (%s tok/s) | "
              "peak memory %s | %lld skipped steps | curve: %s/loss.svg\n",
              static_cast<long long>(s.end_iter), format_duration(secs).c_str(), res.best_val_loss,
              res.ms_per_iter, format_count(res.tokens_per_s).c_str(),
              format_bytes(static_cast<double>(res.peak_bytes)).c_str(),
              static_cast<long long>(res.skipped_steps), s.run_dir.c_str());
}


}  // namespace ffn::train
