// train/dist/comm_profile.h — `ffn-train --profile-comm`: where a data-parallel step's time
// goes, from the events the communicator records (Comm::profile_*, train/dist/comm.h).
//
// Note [Communication profile]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --profile-comm the trainer stamps four points on the compute stream of every step:
// "step" (before the forward is queued), "backward" (the backward is queued: the compute
// stream reaches it when the last gradient is done), "synced" (after the compute stream's
// wait for the step's collectives) and "optimizer" (after the update, and ZeRO's parameter
// exchange). Every collective is timed on the communicator's stream as well: when its input
// was ready, when it started and when it ended. From these a step splits into
//   forward+backward = backward − step,
//   exposed communication = synced − backward (collectives still running after the backward),
//   optimizer = optimizer − synced,
//   idle = the next step's "step" − optimizer (the GPU waiting for the host),
// and each collective's overlap is the share of its run that lies before "backward".
// Times are rank 0's; medians over the profiled steps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/dist/comm.h"

namespace ffn::train {

struct CommProfile {
  int steps = 0;  // steps with every point and a following step
  double step_ms = 0, compute_ms = 0, exposed_ms = 0, optimizer_ms = 0, idle_ms = 0;
  struct Collective {
    std::string what;
    int64_t bytes = 0;
    double ready_ms = 0, start_ms = 0, end_ms = 0;  // from the step's start
    double overlap = 0;                             // share of [start, end] before "backward"
  };
  std::vector<Collective> collectives;  // in the order of the first profiled step
};

// Medians over the steps after the first `skip` that have all four points and a next step.
CommProfile summarize_comm_profile(const std::vector<CommEvent>& events, int64_t skip);
// The printed table (several lines, each ending in '\n').
std::string format_comm_profile(const CommProfile& p);
// The fields of its metrics.jsonl line (key → formatted JSON value): "event":
// "comm_profile", the five medians in ms and the collectives.
std::vector<std::pair<std::string, std::string>> comm_profile_fields(const CommProfile& p);

}  // namespace ffn::train
