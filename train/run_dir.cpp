// train/run_dir.cpp — run-directory lock, resume placement and branches
// (Note [Run directory ownership]).
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace ffn::train {

namespace {

// Absolute and normalised, following symlinks that exist, for comparing run directories.
fs::path canonical_dir(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) c = fs::absolute(p).lexically_normal();
  std::string s = c.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// What a resume may not change: the keys that decide the model, the data and its order,
// the dropout streams and the parameters' dtype.
// The padding of the vocabulary is not in the files (Note [Padded vocabulary]): a run may
// resume with another.
bool fixed_on_resume(const std::string& key) {
  return (key.rfind("model.", 0) == 0 && key != "model.vocab_pad_to") ||
         key.rfind("data.", 0) == 0 || key == "run.seed" || key == "train.batch_size" ||
         key == "runtime.precision";
}

}  // namespace

RunLock::RunLock(const std::string& run_dir) {
  fs::create_directories(run_dir);
  const std::string path = (fs::path(run_dir) / "lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  FFN_CHECK(fd_ >= 0, "[run] cannot open the lock file '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err == EWOULDBLOCK)
      FFN_THROW("[run] '", run_dir, "' is in use by another process (pid ", holder,
                ", holding '", path, "'); wait for it to finish, stop it, or use another run.dir");
    FFN_THROW("[run] cannot lock '", path, "': ", std::strerror(err));
  }
  // Best effort: the lock is held either way; the pid is only what a second process shows.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

ResumePoint resolve_resume(const std::string& path) {
  ResumePoint at;
  const fs::path p(path);
  if (fs::exists(p / "state.toml") || !fs::exists(p / "latest")) {
    // A checkpoint named explicitly (or not a run at all: resolve_checkpoint says why).
    at.ckpt_dir = resolve_checkpoint(path);
  } else {
    // A run: the checkpoint `latest` names, or the newest intact one before it.
    std::vector<std::string> candidates;
    try {
      candidates.push_back(resolve_checkpoint(path));
    } catch (const Error& e) {
      at.skipped.push_back(e.what());
    }
    // Then the older checkpoints, newest first (`latest` is what the run wrote last).
    const int64_t latest_iter =
        candidates.empty() ? std::numeric_limits<int64_t>::max() : checkpoint_iter(candidates[0]);
    const auto all = list_checkpoints(path);
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (it->first < latest_iter) candidates.push_back(it->second);
    for (const std::string& c : candidates) {
      try {
        (void)read_train_state(c);  // sizes and CRC-32s of both tensor files
        at.ckpt_dir = c;
        break;
      } catch (const Error& e) {
        at.skipped.push_back(std::string(e.what()));
      }
    }
    if (at.ckpt_dir.empty()) {
      std::string why;
      for (const std::string& w : at.skipped) why += "\n  " + w;
      FFN_THROW("[resume] '", path, "' has no intact checkpoint:", why);
    }
  }
  const fs::path given = canonical_dir(path), ckpt = canonical_dir(at.ckpt_dir);
  at.run_dir = (given == ckpt ? ckpt.parent_path() : given).string();
  return at;
}

Config resume_config(const std::string& path, const std::vector<std::string>& overrides) {
  const ResumePoint at = resolve_resume(path);
  const std::string saved = (fs::path(at.ckpt_dir) / "config.toml").string();
  Config c = Config::load(saved, overrides);
  bool dir_set = false;
  for (const std::string& o : overrides) dir_set = dir_set || o.rfind("run.dir=", 0) == 0;
  if (!dir_set) c.run.dir = at.run_dir;  // the run may have been moved since it was written
  return c;
}

void check_resume_config(const Config& cfg, const ResumePoint& at) {
  if (canonical_dir(cfg.run.dir) != canonical_dir(at.run_dir))
    config_error("run.dir: '" + cfg.run.dir + "' is not the run being resumed ('" + at.run_dir +
                 "'); --resume continues in the checkpoint's own run directory. Leave out the "
                 "config file (ffn-train --resume " + at.run_dir +
                 " [--set ...]) or set run.dir to it; to start a new run from these weights, "
                 "copy the checkpoint into a new run directory first");
  const Config saved = Config::load((fs::path(at.ckpt_dir) / "config.toml").string());
  const auto now = cfg.entries();
  for (const auto& [key, was] : saved.entries()) {
    if (!fixed_on_resume(key)) continue;
    std::string is;
    for (const auto& [k, v] : now)
      if (k == key) is = v;
    if (is != was)
      config_error(key + ": the checkpoint in '" + at.ckpt_dir + "' was trained with " + key +
                   " = " + was + ", this run asks for " + is + ". A resume keeps the run's " +
                   (key.rfind("model.", 0) == 0 ? "model (a different model shape needs a new run)"
                                                : "data, seed, batch size and precision") +
                   "; resume with the run's own config (" + at.ckpt_dir + "/config.toml)");
  }
}

std::string set_aside_newer_checkpoints(const std::string& run_dir, int64_t iter,
                                        const std::string& ckpt_name) {
  std::vector<std::string> newer;
  for (const auto& [i, dir] : list_checkpoints(run_dir))
    if (i > iter) newer.push_back(dir);
  if (newer.empty()) return {};
  fs::path branch;
  for (int k = 1;; ++k) {
    branch = fs::path(run_dir) / ("branch-" + std::to_string(k));
    if (!fs::exists(branch)) break;
  }
  fs::create_directories(branch);
  for (const char* f : {"metrics.jsonl", "loss.svg", "latest"})
    if (fs::exists(fs::path(run_dir) / f))
      fs::copy_file(fs::path(run_dir) / f, branch / f, fs::copy_options::overwrite_existing);
  // `latest` first: from here on it names the resumed checkpoint, which stays in place.
  write_latest(run_dir, ckpt_name);
  for (const std::string& d : newer) fs::rename(d, branch / fs::path(d).filename());
  std::ofstream(branch / "README") << "Checkpoints set aside when the run was resumed from "
                                   << ckpt_name << " (an older checkpoint): this is the branch "
                                   << "that had gone further. `ffn-train --resume "
                                   << branch.string()
                                   << "` continues it here, as a run of its own.\n";
  return branch.string();
}

}  // namespace ffn::train
