// train/dist/comm_profile.cpp — the --profile-comm summary (train/dist/comm_profile.h).
#include "train/dist/comm_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "train/metrics.h"

namespace ffn::train {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct StepEvents {
  std::map<std::string, double> points;
  std::vector<const CommEvent*> collectives;
};

}  // namespace

CommProfile summarize_comm_profile(const std::vector<CommEvent>& events, int64_t skip) {
  std::map<int64_t, StepEvents> steps;
  for (const CommEvent& e : events) {
    StepEvents& s = steps[e.step];
    if (e.bytes == 0)
      s.points.emplace(e.what, e.ready_ms);
    else
      s.collectives.push_back(&e);
  }
  std::vector<double> step, compute, exposed, optimizer, idle;
  std::vector<std::string> order;
  std::map<std::string, std::vector<CommProfile::Collective>> per_name;
  const char* kPoints[] = {"step", "backward", "synced", "optimizer"};
  for (auto it = steps.begin(); it != steps.end(); ++it) {
    auto next = std::next(it);
    if (it->first <= steps.begin()->first + skip - 1 || next == steps.end()) continue;
    const auto& p = it->second.points;
    if (!std::all_of(std::begin(kPoints), std::end(kPoints), [&](const char* k) { return p.count(k); }) ||
        !next->second.points.count("step"))
      continue;
    const double t0 = p.at("step"), bwd = p.at("backward");
    step.push_back(next->second.points.at("step") - t0);
    compute.push_back(bwd - t0);
    exposed.push_back(p.at("synced") - bwd);
    optimizer.push_back(p.at("optimizer") - p.at("synced"));
    idle.push_back(next->second.points.at("step") - p.at("optimizer"));
    for (const CommEvent* c : it->second.collectives) {
      if (!per_name.count(c->what)) order.push_back(c->what);
      const double len = c->end_ms - c->start_ms;
      const double before = std::clamp(bwd - c->start_ms, 0.0, std::max(len, 0.0));
      per_name[c->what].push_back({c->what, c->bytes, c->ready_ms - t0, c->start_ms - t0,
                                   c->end_ms - t0, len > 0 ? before / len : (c->end_ms <= bwd)});
    }
  }
  CommProfile r;
  r.steps = static_cast<int>(step.size());
  r.step_ms = median(step);
  r.compute_ms = median(compute);
  r.exposed_ms = median(exposed);
  r.optimizer_ms = median(optimizer);
  r.idle_ms = median(idle);
  for (const std::string& name : order) {
    const auto& v = per_name[name];
    auto med = [&](double CommProfile::Collective::*f) {
      std::vector<double> x;
      for (const auto& c : v) x.push_back(c.*f);
      return median(x);
    };
    r.collectives.push_back({name, v.front().bytes, med(&CommProfile::Collective::ready_ms),
                             med(&CommProfile::Collective::start_ms),
                             med(&CommProfile::Collective::end_ms),
                             med(&CommProfile::Collective::overlap)});
  }
  return r;
}

std::string format_comm_profile(const CommProfile& p) {
  if (p.steps == 0) return "comm profile: no complete step was profiled\n";
  char buf[256];
  std::string out;
  std::snprintf(buf, sizeof(buf),
                "comm profile (rank 0, median of %d steps): step %.2f ms = forward+backward %.2f"
                " + exposed communication %.2f + optimizer %.2f + idle %.2f\n",
                p.steps, p.step_ms, p.compute_ms, p.exposed_ms, p.optimizer_ms, p.idle_ms);
  out += buf;
  out += "  collective                 MiB   ready   start     end  overlap (ms from step start)\n";
  for (const auto& c : p.collectives) {
    std::snprintf(buf, sizeof(buf), "  %-22s %7.2f %7.2f %7.2f %7.2f  %5.0f%%\n", c.what.c_str(),
                  static_cast<double>(c.bytes) / (1 << 20), c.ready_ms, c.start_ms, c.end_ms,
                  100 * c.overlap);
    out += buf;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> comm_profile_fields(const CommProfile& p) {
  std::string list = "[";
  for (size_t i = 0; i < p.collectives.size(); ++i) {
    const auto& c = p.collectives[i];
    list += std::string(i ? ", " : "") + "{\"what\": \"" + c.what + "\", \"bytes\": " +
            std::to_string(c.bytes) + ", \"ready_ms\": " + json_number(c.ready_ms) +
            ", \"start_ms\": " + json_number(c.start_ms) + ", \"end_ms\": " +
            json_number(c.end_ms) + ", \"overlap\": " + json_number(c.overlap) + "}";
  }
  return {{"event", "\"comm_profile\""},
          {"steps", std::to_string(p.steps)},
          {"step_ms", json_number(p.step_ms)},
          {"compute_ms", json_number(p.compute_ms)},
          {"exposed_comm_ms", json_number(p.exposed_ms)},
          {"optimizer_ms", json_number(p.optimizer_ms)},
          {"idle_ms", json_number(p.idle_ms)},
          {"collectives", list + "]"}};
}

}  // namespace ffn::train
