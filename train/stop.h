// train/stop.h — stopping a run on request: SIGTERM (what SLURM and Kubernetes send before a
// preemption) or SIGINT (Ctrl-C) ends the run after the step in flight, with a checkpoint.
//
// Note [Graceful stop]
// ~~~~~~~~~~~~~~~~~~~~
// install_stop_handlers() makes the first SIGTERM or SIGINT only set a flag. The trainer
// looks at it after every step: it finishes the step, writes a checkpoint at the iteration
// reached, appends {"iter": N, "event": "stopped", "signal": "SIGTERM"} to metrics.jsonl,
// prints how to continue (ffn-train --resume RUN_DIR) and returns; ffn-train exits 0 and
// says the run was stopped, not finished. `--resume` then continues bit-exactly, as from any
// checkpoint. Under data parallelism the ranks agree on the iteration: every
// kStopAgreeEvery steps (and at the last one) they sum their flags in one all-reduce, and
// all stop there, so a flag seen by one rank stops all at the same iteration.
// A signal arriving while a stop is pending aborts at once (the default action: exit
// 128 + signal), unless it comes within kDuplicateWindowS of the first: the launcher
// (`--nproc`) forwards what it receives and a terminal or a scheduler may signal every
// process as well, so one request can reach a worker twice.
#pragma once

namespace ffn::train {

constexpr int kStopAgreeEvery = 10;
constexpr double kDuplicateWindowS = 2.0;

// SIGTERM and SIGINT request a stop (Note [Graceful stop]). Idempotent.
void install_stop_handlers();
// The first signal received since the last reset (SIGTERM, SIGINT), or 0.
int stop_signal();
// Forgets a request (tests run several trainings in one process).
void reset_stop_request();
// "SIGTERM", "SIGINT", or the number.
const char* signal_name(int sig);

}  // namespace ffn::train
