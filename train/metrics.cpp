// train/metrics.cpp — metrics.jsonl, the run record and display helpers.
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "train/io/json.h"

namespace ffn::train {

MetricsLog::MetricsLog(const std::string& path) : out_(path, std::ios::app) {
  FFN_CHECK(out_.good(), "[metrics] cannot open '", path, "' for appending");
}

void MetricsLog::write(const std::vector<std::pair<std::string, std::string>>& fields) {
  out_ << "{";
  for (size_t i = 0; i < fields.size(); ++i)
    out_ << (i ? ", " : "") << "\"" << fields[i].first << "\": " << fields[i].second;
  out_ << "}\n";
  out_.flush();
}

RunRecord::RunRecord(const std::string& run_dir, bool writer, int64_t resumed_iter)
    : dir_(run_dir) {
  if (!writer) return;
  const std::string path = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  if (resumed_iter >= 0 && std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      json::Value v;
      try {
        v = json::parse(line, path);
      } catch (const Error&) {
        continue;  // a line cut short by a crash
      }
      const json::Value* iter = v.find("iter");
      if (!iter || iter->integer > resumed_iter) continue;
      kept += line + "\n";
      const double x = static_cast<double>(iter->integer);
      if (const json::Value* t = v.find("train_loss")) train_.points.emplace_back(x, t->num);
      if (const json::Value* t = v.find("val_loss")) val_.points.emplace_back(x, t->num);
    }
    in.close();
    std::ofstream(path, std::ios::trunc) << kept;
  }
  log_ = std::make_unique<MetricsLog>(path);
}

void RunRecord::step(int64_t iter, double loss, double lr, double grad_norm, const WindowStats& w,
                     int64_t skipped_total) {
  if (!log_) return;
  train_.points.emplace_back(static_cast<double>(iter), loss);
  log_->write({{"iter", std::to_string(iter)},
               {"train_loss", json_number(loss)},
               {"lr", json_number(lr)},
               {"grad_norm", json_number(grad_norm)},
               {"ms_per_iter", json_number(w.avg_ms)},
               {"tokens_per_s", json_number(w.tokens_per_s)},
               {"mfu", json_number(w.mfu)},
               {"skipped_steps", std::to_string(skipped_total)}});
  const auto now = std::chrono::steady_clock::now();
  if (train_.points.size() == 1 || now - drawn_ > std::chrono::seconds(2)) draw();
}

void RunRecord::draw() {
  write_loss_svg((std::filesystem::path(dir_) / "loss.svg").string(), {train_, val_},
                 "fused-ffn: " + dir_);
  drawn_ = std::chrono::steady_clock::now();
}

void RunRecord::eval(int64_t iter, double val, double train, double best) {
  if (!log_) return;
  log_->write({{"iter", std::to_string(iter)},
               {"val_loss", json_number(val)},
               {"train_eval_loss", json_number(train)},
               {"best_val_loss", json_number(best)}});
  val_.points.emplace_back(static_cast<double>(iter), val);
  draw();
}

void RunRecord::stopped(int64_t iter, const std::string& signal) {
  if (!log_) return;
  log_->write({{"iter", std::to_string(iter)},
               {"event", "\"stopped\""},
               {"signal", "\"" + signal + "\""}});
}

void RunRecord::note(int64_t iter, const std::vector<std::pair<std::string, std::string>>& fields) {
  if (!log_) return;
  std::vector<std::pair<std::string, std::string>> all{{"iter", std::to_string(iter)}};
  all.insert(all.end(), fields.begin(), fields.end());
  log_->write(all);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(t));
  return buf;
}

std::string format_count(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

double peak_flops(const std::string& name, bool half) {
  // Dense tensor-core peaks (bf16/fp16) and non-tensor fp32 peaks of common parts.
  struct Part {
    const char* key;
    double half, single;
  };
  static const Part parts[] = {{"H200", 989e12, 67e12}, {"H100 PCIe", 756e12, 51e12},
                               {"H100", 989e12, 67e12}, {"A100", 312e12, 19.5e12},
                               {"L40S", 362e12, 91.6e12}, {"A10", 125e12, 31.2e12}};
  for (const Part& p : parts)
    if (name.find(p.key) != std::string::npos) return half ? p.half : p.single;
  return 0.0;
}


}  // namespace ffn::train
