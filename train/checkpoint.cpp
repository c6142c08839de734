// train/checkpoint.cpp — atomic checkpoint directories (Note [Checkpoint layout]).
#include "train/checkpoint.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "train/io/files.h"
#include "train/metrics.h"  // format_bytes

namespace fs = std::filesystem;

namespace ffn::train {

namespace {

size_t tensor_bytes(const NamedTensors& ts) {
  size_t n = 0;
  for (const auto& [name, t] : ts) n += t.nbytes();
  return n;
}

// The save itself (Note [Checkpoint layout]), without the clean-up on failure.
std::string write_checkpoint(const std::string& run_dir, const TrainState& s,
                             const NamedTensors& model, const NamedTensors& optim,
                             const std::string& config_toml, int64_t keep,
                             const std::string& gemm_choices);

}  // namespace

// A failed save (a full disk, a quota, an I/O error) removes its temp directory, so it
// leaves nothing that holds space, and says how much the checkpoint needs against what is
// free; `latest` and the earlier checkpoints are only touched after the new one is complete.
std::string save_checkpoint(const std::string& run_dir, const TrainState& s,
                            const NamedTensors& model, const NamedTensors& optim,
                            const std::string& config_toml, int64_t keep,
                            const std::string& gemm_choices) {
  const std::string name = "ckpt-" + std::to_string(s.iter);
  const fs::path tmp = fs::path(run_dir) / (name + ".tmp");
  try {
    return write_checkpoint(run_dir, s, model, optim, config_toml, keep, gemm_choices);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    const fs::space_info sp = fs::space(run_dir, ec);
    const double need = static_cast<double>(tensor_bytes(model) + tensor_bytes(optim));
    FFN_THROW("[checkpoint] saving '", (fs::path(run_dir) / name).string(), "' failed: ",
              e.what(), "\n  the checkpoint needs about ", format_bytes(need), "; ",
              ec ? std::string("free space unknown") : format_bytes(static_cast<double>(sp.available)) + " free",
              " on that file system. The temporary directory was removed; `latest` and the earlier "
              "checkpoints are untouched.");
  }
}

namespace {
std::string write_checkpoint(const std::string& run_dir, const TrainState& s,
                             const NamedTensors& model, const NamedTensors& optim,
                             const std::string& config_toml, int64_t keep,
                             const std::string& gemm_choices) {
  const std::string name = "ckpt-" + std::to_string(s.iter);
  const fs::path final_dir = fs::path(run_dir) / name;
  const fs::path tmp = fs::path(run_dir) / (name + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_safetensors((tmp / "model.safetensors").string(), model, {{"format", "pt"}});
  save_safetensors((tmp / "optim.safetensors").string(), optim, {{"format", "pt"}});
  write_file_synced((tmp / "config.toml").string(), config_toml);
  if (!gemm_choices.empty()) write_file_synced((tmp / "gemm_choices.txt").string(), gemm_choices);
  auto file_crc = [&](const char* f) {
    const std::string b = read_bytes((tmp / f).string());
    return std::make_pair(hex32(crc32(b.data(), b.size())), b.size());
  };
  const auto [mcrc, msize] = file_crc("model.safetensors");
  const auto [ocrc, osize] = file_crc("optim.safetensors");
  std::ostringstream st;
  st.precision(17);
  st << "# fused-ffn checkpoint state (Note [Checkpoint layout])\n"
     << "version = " << kCheckpointVersion << "\niter = " << s.iter
     << "\nrng_seed = " << static_cast<int64_t>(s.rng_seed)
     << "\nrng_offset = " << static_cast<int64_t>(s.rng_offset)
     << "\ndata_cursor = " << static_cast<int64_t>(s.data_cursor) << "\nworld = " << s.world
     << "\nbest_val = " << (std::isfinite(s.best_val) ? s.best_val : 1e308) << "\noptim_counters = [";
  for (size_t i = 0; i < s.optim_counters.size(); ++i) st << (i ? ", " : "") << s.optim_counters[i];
  st << "]\nloss_scaler = [";
  for (size_t i = 0; i < s.loss_scaler.size(); ++i) st << (i ? ", " : "") << s.loss_scaler[i];
  st << "]\nvocab = [";
  for (size_t i = 0; i < s.vocab.size(); ++i) st << (i ? ", " : "") << int{s.vocab[i]};
  st << "]\nmodel_crc32 = \"" << mcrc << "\"\nmodel_bytes = " << msize << "\noptim_crc32 = \""
     << ocrc << "\"\noptim_bytes = " << osize << "\n";
  write_file_synced((tmp / "state.toml").string(), st.str());
  fsync_dir(tmp.string());
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(run_dir);
  write_latest(run_dir, name);
  // Prune: keep the newest `keep` complete checkpoints. A resumed branch has moved the
  // checkpoints newer than its start aside (Note [Run directory ownership]), so the newest
  // by iteration are the newest written.
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}
}  // namespace

std::string read_gemm_choices(const std::string& ckpt_dir) {
  const fs::path f = fs::path(ckpt_dir) / "gemm_choices.txt";
  return fs::exists(f) ? read_bytes(f.string()) : std::string();
}

int64_t checkpoint_iter(const std::string& dir) {
  const std::string n = fs::path(dir).filename().string();
  if (n.rfind("ckpt-", 0) != 0 || n.size() == 5 ||
      n.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;  // ckpt-<iter> only: not *.tmp, not a stray name
  return std::stoll(n.substr(5));
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const int64_t iter = e.is_directory() ? checkpoint_iter(e.path().string()) : -1;
    if (iter >= 0) all.emplace_back(iter, e.path().string());
  }
  std::sort(all.begin(), all.end());
  return all;
}

void write_latest(const std::string& run_dir, const std::string& ckpt_name) {
  const fs::path latest_tmp = fs::path(run_dir) / "latest.tmp";
  write_file_synced(latest_tmp.string(), ckpt_name + "\n");
  fs::rename(latest_tmp, fs::path(run_dir) / "latest");
  fsync_dir(run_dir);
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  FFN_CHECK(fs::exists(p), "[checkpoint] '", path, "' does not exist");
  if (fs::exists(p / "state.toml")) return p.string();
  const fs::path latest = p / "latest";
  FFN_CHECK(fs::exists(latest), "[checkpoint] '", path,
            "' is neither a checkpoint directory (no state.toml) nor a run directory (no latest)");
  std::string name = read_bytes(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path dir = p / name;
  FFN_CHECK(!name.empty() && fs::exists(dir / "state.toml"), "[checkpoint] '", latest.string(),
            "' names '", name, "', which is not a complete checkpoint");
  return dir.string();
}

TrainState read_train_state(const std::string& dir) {
  const std::string path = (fs::path(dir) / "state.toml").string();
  toml::table t;
  try {
    t = toml::parse(read_bytes(path), path);
  } catch (const toml::parse_error& e) {
    FFN_THROW("[checkpoint] '", path, "' is corrupted: ", e.description());
  }
  auto get_i = [&](const char* k) -> int64_t {
    auto v = t[k].value<int64_t>();
    FFN_CHECK(v.has_value(), "[checkpoint] '", path, "' lacks integer '", k, "'");
    return *v;
  };
  const int64_t version = get_i("version");
  FFN_CHECK(version <= kCheckpointVersion, "[checkpoint] '", path, "' has format version ",
            version, ", newer than this build understands (", kCheckpointVersion,
            "); use a newer fused-ffn");
  TrainState s;
  s.iter = get_i("iter");
  s.rng_seed = static_cast<uint64_t>(get_i("rng_seed"));
  s.rng_offset = static_cast<uint64_t>(get_i("rng_offset"));
  s.data_cursor = static_cast<uint64_t>(get_i("data_cursor"));
  s.world = get_i("world");
  s.best_val = t["best_val"].value<double>().value_or(INFINITY);
  if (s.best_val >= 1e308) s.best_val = INFINITY;
  if (auto* a = t["optim_counters"].as_array())
    for (auto& e : *a) s.optim_counters.push_back(e.value<int64_t>().value_or(-1));
  if (auto* a = t["loss_scaler"].as_array())
    for (auto& e : *a) s.loss_scaler.push_back(e.value<double>().value_or(-1));
  if (auto* a = t["vocab"].as_array())
    for (auto& e : *a) s.vocab.push_back(static_cast<uint8_t>(e.value<int64_t>().value_or(0)));
  for (const char* f : {"model", "optim"}) {
    const std::string file = (fs::path(dir) / (std::string(f) + ".safetensors")).string();
    FFN_CHECK(fs::exists(file), "[checkpoint] '", file, "' is missing");
    const std::string b = read_bytes(file);
    const int64_t want = get_i((std::string(f) + "_bytes").c_str());
    const std::string crc = t[std::string(f) + "_crc32"].value<std::string>().value_or("");
    const std::string got = hex32(crc32(b.data(), b.size()));
    if (static_cast<int64_t>(b.size()) == want && got == crc) continue;
    // Not the file this checkpoint wrote. Say whether it is damaged (what the safetensors
    // checks find) or a valid file put in its place.
    bool valid = false;
    try {
      (void)load_safetensors(file);
      valid = true;
    } catch (const Error&) {
    }
    if (valid)
      FFN_THROW("[checkpoint] '", file, "' is a valid safetensors file but not the one this ",
                "checkpoint wrote (", b.size(), " bytes, CRC-32 ", got, "; recorded ", want,
                " bytes, ", crc, "): rewritten by another tool? Start a new run from it instead ",
                "of resuming");
    FFN_CHECK(static_cast<int64_t>(b.size()) == want, "[checkpoint] '", file, "' has ", b.size(),
              " bytes, expected ", want, (static_cast<int64_t>(b.size()) < want ? " (truncated)" : ""));
    FFN_THROW("[checkpoint] '", file, "' is corrupted (file CRC-32 ", got, ", recorded ", crc, ")");
  }
  return s;
}

void load_tensors_into(const std::string& file, const NamedTensors& into, bool allow_cast,
                       bool allow_extra) {
  NamedTensors stored = load_safetensors(file);
  std::map<std::string, Tensor> by_name;
  for (auto& [n, t] : stored) by_name[n] = t;
  for (const auto& [name, dst] : into) {
    auto it = by_name.find(name);
    FFN_CHECK(it != by_name.end(), "[checkpoint] '", file, "' has no tensor '", name,
              "' (a different model config?)");
    const Tensor& src = it->second;
    FFN_CHECK(src.shape() == dst.shape(), "[checkpoint] '", file, "': tensor '", name, "' is ",
              shape_str(src.shape()), " but the model expects ", shape_str(dst.shape()));
    FFN_CHECK(allow_cast || src.dtype() == dst.dtype(), "[checkpoint] '", file, "': tensor '", name,
              "' is ", dtype_name(src.dtype()), " but the run uses ", dtype_name(dst.dtype()),
              " (resume with the same runtime.precision)");
    Tensor d = dst;
    d.copy_(src);
    by_name.erase(it);
  }
  if (!by_name.empty() && !allow_extra)
    FFN_THROW("[checkpoint] '", file, "' has ", by_name.size(), " tensors the model does not (e.g. '",
              by_name.begin()->first, "'): a different model config?");
}

}  // namespace ffn::train
