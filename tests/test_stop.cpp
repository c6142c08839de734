// tests/test_stop.cpp — runs that survive preemption, damage and full disks, and how runs
// are started and shown: SIGTERM mid-run checkpoints the iteration reached and resumes
// bit-exactly (one process, two in-process ranks, the real ffn-train binary; Note [Graceful
// stop]); --resume passes over a damaged newest checkpoint; a failed save leaves no temp
// directory; ffn-sample's greedy decoding and range errors; --resume auto; gradient
// accumulation against one big batch (Note [Gradient accumulation]); loss.svg as XML; an
// out-of-memory error naming the stage and the keys to lower.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/test_util.h"
#include "tests/train_test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/dist/comm.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "train/trainer.h"

using namespace ffn;
using namespace ffn::train;
namespace fs = std::filesystem;
using ffn::test::slurp;
using ffn::test::temp_dir;

namespace {

Config tiny(const fs::path& dir, int64_t iters) {
  return ffn::test::tiny_run(dir, iters, {"model.dropout=0.1"});
}

// metrics.jsonl lines holding `key`, without the timing fields.
std::vector<std::string> lines_with(const fs::path& dir, const char* key) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (l.find(key) != std::string::npos) out.push_back(l.substr(0, l.find("\"ms_per_iter\"")));
  return out;
}

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  return o;
}

// The stop handlers for one test case; the defaults again afterwards (so Ctrl-C still stops
// the test binary at once).
struct StopHandlers {
  StopHandlers() {
    install_stop_handlers();
    reset_stop_request();
  }
  ~StopHandlers() {
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    reset_stop_request();
  }
};

}  // namespace

TEST_CASE("stop 1: SIGTERM mid-run checkpoints the iteration reached; resume equals the straight run") {
  const StopHandlers handlers;
  const fs::path root = temp_dir("stop-one");
  run_training(tiny(root / "a", 12), quiet());

  TrainOptions o = quiet();
  o.after_step = [](int64_t done) {
    if (done == 7) {
      std::raise(SIGTERM);
      std::raise(SIGTERM);  // the same request twice at once (launcher + scheduler): no abort
    }
  };
  const TrainResult r = run_training(tiny(root / "b", 12), o);
  reset_stop_request();
  CHECK(r.stop_signal == SIGTERM);
  CHECK(r.iters_done == 7);
  CHECK(r.last_checkpoint == (root / "b" / "ckpt-7").string());
  CHECK(resolve_checkpoint((root / "b").string()) == (root / "b" / "ckpt-7").string());
  const auto stopped = lines_with(root / "b", "\"event\"");
  REQUIRE(stopped.size() == 1);
  CHECK(stopped[0] == "{\"iter\": 7, \"event\": \"stopped\", \"signal\": \"SIGTERM\"}");
  CHECK(lines_with(root / "a", "\"event\"").empty());  // a finished run has no such line
  // The run's config.toml says what "auto" became and prints floats as written.
  const std::string toml = slurp(root / "b" / "config.toml");
  CHECK_MESSAGE(toml.find("precision = \"auto\"  # resolved: f32") != std::string::npos, toml);
  CHECK_MESSAGE(toml.find("lr = 0.003\n") != std::string::npos, toml);

  TrainOptions again = quiet();
  again.resume = (root / "b").string();
  const TrainResult r2 = run_training(tiny(root / "b", 12), again);
  CHECK(r2.stop_signal == 0);
  CHECK(r2.iters_done == 12);
  CHECK(lines_with(root / "a", "train_loss") == lines_with(root / "b", "train_loss"));
  CHECK(lines_with(root / "a", "val_loss") == lines_with(root / "b", "val_loss"));
  for (const char* f : {"model.safetensors", "optim.safetensors"})
    CHECK_MESSAGE(slurp(root / "a" / "ckpt-12" / f) == slurp(root / "b" / "ckpt-12" / f), f);
  fs::remove_all(root);
}

TEST_CASE("stop 2: two in-process ranks stop at the same agreed iteration and resume bit-exactly") {
  const StopHandlers handlers;
  const fs::path root = temp_dir("stop-two");
  auto run2 = [&](const std::string& dir, const std::string& resume, bool signal_at_3) {
    auto group = make_thread_group(2);
    std::vector<TrainResult> res(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        TrainOptions o = quiet();
        o.comm = group[r].get();
        o.resume = resume;
        // Only rank 0 sees the request, at iteration 3; both stop at the next agreement.
        if (signal_at_3 && r == 0)
          o.after_step = [](int64_t done) {
            if (done == 3) std::raise(SIGTERM);
          };
        res[r] = run_training(tiny(root / dir, 2 * kStopAgreeEvery), o);
      });
    for (auto& t : ts) t.join();
    return res;
  };
  run2("a", "", false);
  const auto stopped = run2("b", "", true);
  reset_stop_request();
  for (const TrainResult& r : stopped) {
    CHECK(r.stop_signal == SIGTERM);
    CHECK(r.iters_done == kStopAgreeEvery);
  }
  CHECK(fs::exists(root / "b" / ("ckpt-" + std::to_string(kStopAgreeEvery)) / "state.toml"));
  const auto resumed = run2("b", (root / "b").string(), false);
  CHECK(resumed[0].iters_done == 2 * kStopAgreeEvery);
  CHECK(lines_with(root / "a", "train_loss") == lines_with(root / "b", "train_loss"));
  const std::string last = "ckpt-" + std::to_string(2 * kStopAgreeEvery);
  for (const char* f : {"model.safetensors", "optim.safetensors"})
    CHECK_MESSAGE(slurp(root / "a" / last / f) == slurp(root / "b" / last / f), f);
  fs::remove_all(root);
}

TEST_CASE("stop 3: ffn-train stopped with SIGTERM exits 0 with a checkpoint and says how to continue") {
  const fs::path root = temp_dir("stop-cli");
  const fs::path run = root / "run", out = root / "out.txt";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string cfg = std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml";
    const std::string dir = "run.dir=" + run.string();
    execl(FFN_TRAIN_BIN, FFN_TRAIN_BIN, cfg.c_str(), "--set", dir.c_str(), "--set",
          "runtime.device=cpu", "--set", "train.iters=100000", "--set", "run.log_every=1",
          "--set", "run.eval_every=100000", "--quiet", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  // Wait until it has trained a few steps, then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines_with(run, "train_loss").size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(lines_with(run, "train_loss").size() >= 3);
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  const std::string text = slurp(out);
  REQUIRE_MESSAGE(WIFEXITED(st), text);
  CHECK_MESSAGE(WEXITSTATUS(st) == 0, text);
  CHECK_MESSAGE(text.find("stopped by SIGTERM at iter") != std::string::npos, text);
  CHECK_MESSAGE(text.find("ffn-train --resume " + run.string()) != std::string::npos, text);
  const auto ckpts = list_checkpoints(run.string());
  REQUIRE(ckpts.size() == 1);
  CHECK(ckpts[0].first >= 3);
  CHECK(read_train_state(ckpts[0].second).iter == ckpts[0].first);
  fs::remove_all(root);
}

TEST_CASE("stop 4: --resume of a run passes over a damaged newest checkpoint and leaves it in place") {
  const fs::path root = temp_dir("stop-fallback");
  run_training(tiny(root, 8), quiet());  // ckpt-4 and ckpt-8
  const fs::path model8 = root / "ckpt-8" / "model.safetensors";
  std::string bytes = slurp(model8);
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(model8, std::ios::binary) << bytes;

  const ResumePoint at = resolve_resume(root.string());
  CHECK(at.ckpt_dir == (root / "ckpt-4").string());
  REQUIRE(at.skipped.size() == 1);
  CHECK_MESSAGE(at.skipped[0].find("ckpt-8/model.safetensors' is corrupted") != std::string::npos,
                at.skipped[0]);
  // Named explicitly, the damaged one is refused rather than replaced.
  CHECK_THROWS_AS(read_train_state(resolve_resume((root / "ckpt-8").string()).ckpt_dir), Error);

  TrainOptions o = quiet();
  o.resume = root.string();
  CHECK(run_training(tiny(root, 8), o).iters_done == 8);
  CHECK(fs::exists(root / "branch-1" / "ckpt-8" / "model.safetensors"));  // kept, set aside
  CHECK(read_train_state((root / "ckpt-8").string()).iter == 8);          // the new one

  // Nothing intact: the error lists every checkpoint's problem.
  for (const auto& [iter, dir] : list_checkpoints(root.string()))
    std::ofstream(fs::path(dir) / "optim.safetensors", std::ios::binary) << "x";
  CHECK_THROWS_WITH_AS(resolve_resume(root.string()), doctest::Contains("has no intact checkpoint"),
                       Error);
  fs::remove_all(root);
}

TEST_CASE("stop 5: a save that fails (file size limit) removes its temp directory; latest stays") {
  const fs::path root = temp_dir("stop-fullsave");
  TrainState st;
  st.iter = 1;
  Generator g(3);
  const NamedTensors small{{"w", Tensor::randn({16, 16}, g)}};
  CHECK(save_checkpoint(root.string(), st, small, small, "", 3) == (root / "ckpt-1").string());
  // A file size limit stands in for a full disk (it works without root): writes past it fail
  // with EFBIG instead of killing the process with SIGXFSZ.
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  st.iter = 2;
  const NamedTensors big{{"w", Tensor::randn({512, 512}, g)}};  // 1 MiB of f32
  std::string err;
  try {
    save_checkpoint(root.string(), st, big, big, "", 3);
  } catch (const Error& e) {
    err = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK_MESSAGE(err.find("saving '" + (root / "ckpt-2").string() + "' failed") != std::string::npos,
                err);
  CHECK_MESSAGE(err.find("the checkpoint needs about 2.0 MiB") != std::string::npos, err);
  CHECK_MESSAGE(err.find(" free on that file system") != std::string::npos, err);
  CHECK(!fs::exists(root / "ckpt-2.tmp"));
  CHECK(!fs::exists(root / "ckpt-2"));
  CHECK(resolve_checkpoint(root.string()) == (root / "ckpt-1").string());
  CHECK(read_train_state((root / "ckpt-1").string()).iter == 1);
  fs::remove_all(root);
}

TEST_CASE("sampler: --temperature 0 is greedy; range errors name the flag and the value") {
  const fs::path root = temp_dir("stop-sample");
  run_training(tiny(root, 2), quiet());
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(FFN_SAMPLE_BIN) + " " + root.string() + " " + args +
                            " > " + (root / "out.txt").string() + " 2>&1";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  REQUIRE(run("--temperature 0 --tokens 40 --seed 1") == 0);
  const std::string greedy1 = slurp(root / "out.txt");
  REQUIRE(run("--temperature 0 --tokens 40 --seed 2") == 0);
  CHECK(slurp(root / "out.txt") == greedy1);  // no draws: the seed does not matter
  CHECK(greedy1.size() > 40);
  CHECK(run("--tokens -1") == 2);
  CHECK_MESSAGE(slurp(root / "out.txt").find("--tokens: expected an integer >= 1, got -1") !=
                    std::string::npos,
                slurp(root / "out.txt"));
  CHECK(run("--temperature -0.5") == 2);
  CHECK_MESSAGE(slurp(root / "out.txt").find("--temperature: expected a number >= 0, got -0.5") !=
                    std::string::npos,
                slurp(root / "out.txt"));
  fs::remove_all(root);
}

TEST_CASE("resume auto: starts the run when run.dir has no checkpoint, continues it when it has") {
  const fs::path root = temp_dir("stop-auto");
  const std::string base = std::string(FFN_TRAIN_BIN) + " " + FFN_SOURCE_DIR +
                           "/configs/tiny.toml --resume auto --set runtime.device=cpu --set run.dir=" +
                           (root / "run").string() + " --set run.eval_every=2 --set run.eval_iters=1 ";
  auto run = [&](const std::string& args) {
    const int st = std::system((base + args + " > " + (root / "out.txt").string() + " 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  REQUIRE(run("--set train.iters=2") == 0);
  CHECK(read_train_state(resolve_checkpoint((root / "run").string())).iter == 2);
  REQUIRE(run("--set train.iters=4") == 0);
  CHECK_MESSAGE(slurp(root / "out.txt").find("resumed from " + (root / "run" / "ckpt-2").string()) !=
                    std::string::npos,
                slurp(root / "out.txt"));
  CHECK(read_train_state(resolve_checkpoint((root / "run").string())).iter == 4);
  // Without a config file there is no run.dir to look in.
  CHECK(std::system((std::string(FFN_TRAIN_BIN) + " --resume auto > /dev/null 2>&1").c_str()) != 0);
  fs::remove_all(root);
}

TEST_CASE("gradient accumulation: 2 micro-batches of 4 equal one batch of 8 (fp32), on 1 and 2 ranks") {
  const fs::path root = temp_dir("stop-accum");
  auto cfg = [&](const std::string& dir, int64_t batch, int64_t accum) {
    Config c = tiny(root / dir, 6);
    c.model.dropout = 0.0;  // the masks would be drawn per micro-batch
    c.train.batch_size = batch;
    c.train.grad_accum_steps = accum;
    return c;
  };
  run_training(cfg("one", 8, 1), quiet());
  run_training(cfg("acc", 4, 2), quiet());
  {
    auto group = make_thread_group(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        TrainOptions o = quiet();
        o.comm = group[r].get();
        run_training(cfg("dp", 4, 2), o);
      });
    for (auto& t : ts) t.join();
  }
  // The same rows, summed in another order: equal to fp32 rounding.
  auto losses = [&](const std::string& dir) {
    std::vector<double> out;
    for (const std::string& l : lines_with(root / dir, "train_loss")) {
      const size_t at = l.find("\"train_loss\": ") + 14;
      out.push_back(std::stod(l.substr(at)));
    }
    return out;
  };
  const auto one = losses("one"), acc = losses("acc"), dp = losses("dp");
  REQUIRE(one.size() == 6);
  REQUIRE(acc.size() == 6);
  REQUIRE(dp.size() == 6);
  for (size_t i = 0; i < one.size(); ++i) {
    CHECK(acc[i] == doctest::Approx(one[i]).epsilon(1e-5));
    CHECK(dp[i] == doctest::Approx(one[i]).epsilon(1e-5));
  }
  const auto w_one = load_safetensors((root / "one" / "ckpt-6" / "model.safetensors").string());
  const auto w_acc = load_safetensors((root / "acc" / "ckpt-6" / "model.safetensors").string());
  REQUIRE(w_one.size() == w_acc.size());
  for (size_t k = 0; k < w_one.size(); ++k) {
    const double scale = std::max(1.0, ffn::test::max_abs(w_one[k].second));
    CHECK_MESSAGE(ffn::test::max_abs_diff(w_one[k].second, w_acc[k].second) < 1e-4 * scale,
                  w_one[k].first);
  }
  fs::remove_all(root);
}

namespace {
// Well-formed XML as far as loss.svg goes: balanced tags, quoted attributes, no raw '<' or
// stray '&' in text or attribute values (entities only).
std::string xml_problem(const std::string& x) {
  std::vector<std::string> open;
  auto entity_ok = [&](size_t i) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (x.compare(i, std::strlen(e), e) == 0) return true;
    return false;
  };
  for (size_t i = 0; i < x.size();) {
    if (x[i] == '&' && !entity_ok(i)) return "a raw '&' at byte " + std::to_string(i);
    if (x[i] == '>') return "a stray '>' at byte " + std::to_string(i);
    if (x[i] != '<') {
      ++i;
      continue;
    }
    const bool closing = x[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_end = x.find_first_of(" />", j);
    const std::string name = x.substr(j, name_end - j);
    j = name_end;
    bool self_close = false;
    while (j < x.size() && x[j] != '>') {
      if (x[j] == '"') {
        const size_t q = x.find('"', j + 1);
        if (q == std::string::npos) return "an unterminated attribute in <" + name;
        for (size_t k = j + 1; k < q; ++k)
          if (x[k] == '<' || (x[k] == '&' && !entity_ok(k))) return "a raw '<' or '&' in <" + name;
        j = q + 1;
        continue;
      }
      if (x[j] == '<') return "a '<' inside <" + name;
      if (x[j] == '/') self_close = true;
      ++j;
    }
    if (j >= x.size()) return "an unterminated <" + name;
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing open";
      open.pop_back();
    } else if (!self_close) {
      open.push_back(name);
    }
    i = j + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> is never closed";
}
}  // namespace

TEST_CASE("loss.svg is well-formed XML from the first logged step on, with a hostile run dir name") {
  const fs::path root = temp_dir("stop-svg") / "a&b <c> \"d\"";
  Config c = tiny(root, 12);
  c.run.eval_every = 1000;  // no eval until the end
  TrainOptions o = quiet();
  std::string early;
  o.after_step = [&](int64_t done) {
    if (done == 10) early = slurp(root / "loss.svg");
  };
  run_training(c, o);
  REQUIRE(!early.empty());  // drawn before the first eval
  CHECK_MESSAGE(xml_problem(early) == "", early);
  const std::string end = slurp(root / "loss.svg");
  CHECK_MESSAGE(xml_problem(end) == "", end);
  CHECK(end.find("viewBox=") != std::string::npos);
  CHECK(end.find("a&amp;b &lt;c&gt; &quot;d&quot;") != std::string::npos);
  CHECK(xml_problem("<svg><text>a & b</text></svg>") != "");  // the checker can fail
  fs::remove_all(root.parent_path());
}

TEST_CASE("out of memory: the error says where in the run and which config keys to lower") {
  const fs::path root = temp_dir("stop-oom");
  // A model far too large for any host: c_attn alone would be 3 · 2^40 floats. A limit on
  // the address space makes the failure certain however the kernel overcommits.
  Config c = tiny(root, 2);
  c.model.d_model = int64_t{1} << 20;
  c.model.heads = 2;
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  size_t vm_kib = 0;
  {
    std::ifstream st("/proc/self/status");
    for (std::string l; std::getline(st, l);)
      if (l.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(l.substr(7));
  }
  REQUIRE(vm_kib > 0);
  rlimit lim = old;
  lim.rlim_cur = static_cast<rlim_t>(vm_kib) * 1024 + (rlim_t{2} << 30);
  REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
  std::string what;
  ErrorKind kind = ErrorKind::runtime;
  try {
    run_training(c, quiet());
  } catch (const Error& e) {
    what = e.what();
    kind = e.kind();
  }
  setrlimit(RLIMIT_AS, &old);
  CHECK(kind == ErrorKind::out_of_memory);
  CHECK_MESSAGE(what.find("[train] out of memory building the model and optimizer") == 0, what);
  CHECK_MESSAGE(what.find("[alloc] out of host memory allocating") != std::string::npos, what);
  CHECK_MESSAGE(what.find("lower train.batch_size") != std::string::npos, what);
  fs::remove_all(root);
}
