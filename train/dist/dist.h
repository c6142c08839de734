// train/dist/dist.h — process-level data parallelism: who am I (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, as torchrun/srun/mpirun wrappers set them), the rendezvous that
// hands rank 0's NCCL unique id to the others, and the local launcher behind
// `ffn-train --nproc N`.
//
// Rendezvous: rank 0 listens on MASTER_PORT; every other rank connects to
// MASTER_ADDR:MASTER_PORT (retrying until the timeout) and sends "FFNRDV1 <nonce> <rank>
// <world>". Rank 0 answers a matching hello with the id and anything else (another run's
// nonce, a rank out of range or seen twice, another world size) with a rejection that the
// peer reports as an error. A peer that never arrives is a timeout error naming the ranks
// still missing, not a hang. The nonce comes from FFN_RUN_NONCE (the launcher sets a fresh
// one per run; launchers of our own should too), default "-".
//
// Note [Rendezvous under torchrun]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torchrun's agent already listens on MASTER_PORT (its TCP store, handed to the workers with
// TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 could not bind it. When TORCHELASTIC_RUN_ID
// is set, our rendezvous uses MASTER_PORT + 1 on MASTER_ADDR instead (FFN_RDZV_PORT, if set,
// names another port anywhere), and the nonce is "<run id>/<TORCHELASTIC_RESTART_COUNT>", so
// the group that a --max-restarts relaunch starts never accepts a peer of the previous one.
// With `ffn-train --resume auto` such a relaunch continues from the last checkpoint.
#pragma once

#include <string>
#include <vector>

namespace ffn::train {

struct DistEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string nonce = "-";
  bool from_env = false;  // RANK/WORLD_SIZE were set
};

// Reads the variables; malformed values are config errors naming the variable.
DistEnv dist_env_from_environment();

// Returns rank 0's `payload` on every rank (rank 0 passes it in). Throws on timeout,
// rejection or socket errors.
std::string rendezvous(const DistEnv& env, const std::string& payload, double timeout_s);

// Runs `argv` (this program and its arguments) `nproc` times with RANK/LOCAL_RANK/
// WORLD_SIZE/MASTER_ADDR/MASTER_PORT/FFN_RUN_NONCE set, forwards SIGINT/SIGTERM, and when a
// worker fails stops the others (SIGTERM, then SIGKILL after `grace_s`). Returns 0 when all
// succeed, else the first failing worker's exit code (128+signal for a signal).
int launch_local(int nproc, const std::vector<std::string>& argv, double grace_s = 10.0);

}  // namespace ffn::train
