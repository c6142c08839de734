// optim/adamw.h — AdamW over a model's parameters with everything a training step needs
// around it: decoupled weight decay on matrices only (configurable), global grad-norm
// clipping, skipping steps whose loss or gradient norm is not finite (and aborting after
// too many in a row), dynamic loss scaling for fp16, and LR schedules.
//
// The update itself is one fused multi-tensor kernel (kernels/adamw.h) with fp32 master
// weights and state for 16-bit parameters (Note [Master weights]).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/readback.h"
#include "core/names.h"
#include "kernels/adamw.h"

namespace ffn {

struct AdamWOptions {
  AdamWHyper hyper;              // hyper.lr is replaced by the lr passed to step()
  bool decay_matrices_only = true;  // weight decay on ≥2-D params only (not biases, LN)
  double grad_clip = 0.0;        // max global grad norm; 0 = off
  int max_nonfinite_in_row = 20; // abort after this many consecutive skipped steps
  // Weight decay per parameter (empty: decay_matrices_only decides). ZeRO-1's optimizer
  // updates flat slices of parameters, which keep their parameter's decision.
  std::vector<bool> decay;
  // Called with Σ g² over this optimizer's gradients (a one-element device tensor) before
  // the step is decided; ZeRO-1 sums it over the ranks here, so the norm, the clip and the
  // finite check are global.
  std::function<void(Tensor&)> reduce_sumsq;
  // Update the parameters in groups of consecutive ones (sizes, summing to the parameter
  // count; empty: all at once) and call after_group(g) once group g's update is queued:
  // ZeRO-1 all-gathers each bucket while the next one is updated.
  std::vector<size_t> groups;
  std::function<void(size_t)> after_group;
};

struct StepReport {
  double loss = 0.0;       // the loss the step was given
  double grad_norm = 0.0;  // before clipping (of the unscaled gradient)
  bool skipped = false;    // loss or grad norm not finite: parameters untouched
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, Var>> named_params, const AdamWOptions& opt);

  // Clips, checks and updates every parameter. `loss` is the step's loss (a one-element
  // tensor on the parameters' device); `grad_divisor` divides every gradient first (the
  // loss scale; 1 otherwise). A non-finite loss or gradient norm skips the update; after
  // max_nonfinite_in_row skips in a row finish() throws an error naming the step and the
  // values. launch() queues all of it and returns without waiting for the device (Note
  // [Device-side step decision]); finish() waits for that step's outcome and must come
  // before the next launch(). Gradients may be released right after launch().
  void launch(double lr, const Tensor& loss, double grad_divisor = 1.0);
  // launch() in three parts, for a step captured into a CUDA graph (Note [CUDA graph step]):
  // set_lr writes the rate into the device-side decision (outside the capture, every step);
  // queue() queues the norm, the decision and the update, nothing else (so it can be
  // captured); start_report() starts reading the outcome back (after the replay).
  void set_lr(double lr);
  void queue(const Tensor& loss, double grad_divisor = 1.0);
  void start_report();
  StepReport finish();
  bool in_flight() const { return in_flight_; }
  // launch() then finish(); the loss may also be given as a host value.
  StepReport step(double lr, const Tensor& loss, double grad_divisor = 1.0);
  StepReport step(double lr, double loss, double grad_divisor = 1.0);
  void zero_grad();

  int64_t steps() const { return steps_; }            // updates applied
  int64_t skipped() const { return skipped_total_; }  // steps skipped, in total
  const AdamWOptions& options() const { return opt_; }

  // The optimizer's state as named tensors (for checkpoints): "<param>.exp_avg",
  // "<param>.exp_avg_sq" and, for 16-bit params, "<param>.master".
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Counters for checkpoints: steps, skipped in total, skipped in a row (no step in flight).
  std::vector<int64_t> counters() const;
  void set_counters(const std::vector<int64_t>& c);

 private:
  std::vector<std::pair<std::string, Var>> params_;
  std::vector<AdamWSlot> slots_;
  AdamWOptions opt_;
  int64_t steps_ = 0;
  int64_t skipped_total_ = 0;
  int64_t skipped_in_row_ = 0;
  Tensor& decision();  // created on first use, [0] seeded from steps_
  Tensor decision_;  // Note [Device-side step decision]; [0] mirrors steps_ between steps
  Readback report_;  // the launched step's decision, read back one step later
  bool in_flight_ = false;
};

// Dynamic loss scaling (fp16): multiply the loss by scale(); after an overflow (a skipped
// step) halve it, after `growth_interval` good steps in a row double it.
class LossScaler {
 public:
  explicit LossScaler(bool enabled, double init = 65536.0, int growth_interval = 2000)
      : enabled_(enabled), scale_(enabled ? init : 1.0), interval_(growth_interval) {}
  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  void update(bool overflow);
  std::vector<double> state() const { return {scale_, static_cast<double>(good_)}; }
  void set_state(const std::vector<double>& s);

 private:
  bool enabled_;
  double scale_;
  int interval_;
  int64_t good_ = 0;
};

enum class LrSchedule : uint8_t { constant, linear, cosine };
inline constexpr NameOf<LrSchedule> kLrScheduleNames[] = {
    {LrSchedule::constant, "constant"}, {LrSchedule::linear, "linear"}, {LrSchedule::cosine, "cosine"}};

// lr at iteration `iter` (0-based): linear warmup lr·(iter+1)/(warmup+1) for iter < warmup,
// then constant lr, or linear / cosine decay from lr to min_lr at decay_iters (min_lr after).
double lr_at(LrSchedule s, int64_t iter, double lr, double min_lr, int64_t warmup,
             int64_t decay_iters);

}  // namespace ffn
