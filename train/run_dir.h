// train/run_dir.h — what a run directory promises across processes: one writer at a time,
// resume continuing in the run that holds the checkpoint, and branches that never delete
// what they resumed from.
//
// Note [Run directory ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// - One writer. The process that writes a run (rank 0) holds an exclusive flock(2) on
//   <run>/lock for its whole life; the file names its pid. A second ffn-train on the same
//   run is refused at once, naming that pid. The kernel drops the lock when the holder
//   exits or crashes, so a stale lock file never blocks anyone.
// - Resume continues in place. `--resume PATH` continues the run that holds the checkpoint:
//   PATH itself for a run directory, the parent of a ckpt-* directory. The checkpoint's own
//   config.toml is the run's config; what it fixes (model, data, seed, batch size,
//   precision) cannot change on resume, and a config whose run.dir names another directory
//   is refused naming both (resume_config / check_resume_config).
// - Branches. Resuming from a checkpoint older than the run's newest starts a branch: the
//   newer ckpt-* directories, with copies of metrics.jsonl and loss.svg as they were, move to
//   <run>/branch-<k>/ and `latest` names the resumed checkpoint. Pruning (newest
//   run.keep_checkpoints by iteration) then only ever sees this branch's history, so it never
//   deletes what the branch resumed from before newer saves exist, nor what it just wrote,
//   and `latest` always names a complete checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace ffn::train {

// Holds <run_dir>/lock exclusively (creating run_dir) until destroyed. Throws naming the
// holder's pid when another process has it.
class RunLock {
 public:
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Where `--resume PATH` continues: the checkpoint directory and the run that holds it. For a
// run directory that is the checkpoint `latest` names if it is intact (sizes and CRC-32s),
// else the newest intact one before it; `skipped` says what was wrong with the ones passed
// over (they stay on disk; resuming from an older one moves them to a branch). A ckpt-*
// directory named explicitly is taken as it is.
struct ResumePoint {
  std::string ckpt_dir;
  std::string run_dir;
  std::vector<std::string> skipped;
};
ResumePoint resolve_resume(const std::string& path);

// The config a resumed run continues with when no config file is given: the checkpoint's
// config.toml with `overrides` applied and run.dir set to the run being resumed.
Config resume_config(const std::string& path, const std::vector<std::string>& overrides);

// Refuses (config errors) a resume whose config changes what the checkpoint fixes, or
// whose run.dir is not the run being resumed.
void check_resume_config(const Config& cfg, const ResumePoint& at);

// Moves the run's checkpoints newer than `iter` into a new <run>/branch-<k>/ (with copies of
// metrics.jsonl and loss.svg) and points `latest` at `ckpt_name`. Returns the branch
// directory, or "" when nothing was newer.
std::string set_aside_newer_checkpoints(const std::string& run_dir, int64_t iter,
                                        const std::string& ckpt_name);

}  // namespace ffn::train
