// tests/test_dist.cpp — data parallelism on the CPU: the bucketed gradient synchronizer and
// its overlap with backward (through an in-process group of rank threads standing in for
// NCCL), a 2-rank training run against a 1-process run, ZeRO-1 against plain data
// parallelism, and the TCP rendezvous (stale nonce rejected, missing peer times out). Part
// of test_train.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "layers/transformer.h"
#include "optim/adamw.h"
#include "tests/test_util.h"
#include "train/dist/comm.h"
#include "train/dist/comm_profile.h"
#include "train/config.h"
#include "train/dist/ddp.h"
#include "train/dist/dist.h"
#include "train/dist/watchdog.h"
#include "train/dist/zero.h"
#include "train/trainer.h"

using namespace ffn;
using namespace ffn::train;
namespace fs = std::filesystem;
using ffn::test::max_abs_diff;
using ffn::test::slurp;

namespace {

GptConfig small_gpt() {
  GptConfig c;
  c.vocab_size = 13;
  c.context = 8;
  c.layers = 3;
  c.heads = 2;
  c.d_model = 8;
  c.init_std = 0.3;
  c.place = ParamInit{DType::f64, Device::cpu()};
  return c;
}

// `cfg` trained by `world` in-process ranks (quiet), stopping after `stop_after` iterations
// (0: the end), resuming `resume` when it is not empty. Each rank's error message, or "".
std::vector<std::string> run_ranks(int world, const Config& cfg, int64_t stop_after,
                                   const std::string& resume) {
  auto group = make_thread_group(world);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      TrainOptions o;
      o.quiet = true;
      o.comm = group[r].get();
      o.stop_after = stop_after;
      o.resume = resume;
      try {
        run_training(cfg, o);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

void run_two_ranks(const Config& cfg, int64_t stop_after, const std::string& resume) {
  for (const std::string& e : run_ranks(2, cfg, stop_after, resume)) REQUIRE_MESSAGE(e.empty(), e);
}

// The numbers of a run's train_loss/val_loss lines, in order.
std::vector<double> loss_values(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<double> out;
  for (std::string l; std::getline(in, l);)
    for (const char* key : {"\"train_loss\": ", "\"val_loss\": "})
      if (auto at = l.find(key); at != std::string::npos)
        out.push_back(std::stod(l.substr(at + std::string(key).size())));
  return out;
}

// A run's metrics.jsonl lines without their timings (equal for bit-equal runs).
std::vector<std::string> metric_lines(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l.substr(0, l.find("\"ms_per_iter\"")));
  return out;
}

Tensor ids(int64_t b, int64_t t, int shift) {
  std::vector<double> v;
  for (int64_t i = 0; i < b * t; ++i) v.push_back(static_cast<double>((i * 5 + shift + i / 7) % 13));
  return Tensor::from_vector(v, {b, t}, DType::i32);
}

}  // namespace

TEST_CASE(
    "broadcast_text: rank root's text, every byte value and the empty text, on 2 and 3 ranks") {
  std::string text = "# GEMM choices\n";
  for (int c = 0; c < 256; ++c) text += static_cast<char>(c);
  for (int world : {2, 3})
    for (const std::string& sent : {text, std::string()}) {
      const int root = world - 1;
      auto group = make_thread_group(world);
      std::vector<std::string> got(static_cast<size_t>(world));
      std::vector<std::thread> ts;
      for (int r = 0; r < world; ++r)
        ts.emplace_back([&, r] {
          got[r] =
              broadcast_text(*group[r], r == root ? sent : "not this", root, Device::cpu(), "test");
        });
      for (auto& t : ts) t.join();
      for (int r = 0; r < world; ++r) CHECK(got[r] == sent);
    }
}

TEST_CASE("GradSync: 2 ranks with half batches each give the full batch's gradient") {
  const Tensor x = ids(4, 8, 0), y = ids(4, 8, 1);
  // Reference: one process, the whole batch.
  Generator i0(5);
  GPT ref(small_gpt(), std::make_shared<Generator>(1), i0);
  ref.loss(x, y).backward();
  auto group = make_thread_group(2);
  std::vector<std::vector<Tensor>> grads(2);
  std::vector<SyncStats> stats(2);
  std::vector<std::vector<std::vector<std::string>>> layouts(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Generator init(5);
      GPT m(small_gpt(), std::make_shared<Generator>(1), init);
      // ~3 parameters' worth per bucket, so there are several buckets.
      GradSync sync(m.named_parameters(), *group[r], 8 * 8 * 8 * 3);
      layouts[r] = sync.layout();
      const Tensor xr = x.narrow(0, 2 * r, 2).contiguous(), yr = y.narrow(0, 2 * r, 2).contiguous();
      Var loss = m.loss(xr, yr);
      loss.backward(Tensor::full({}, 1.0, DType::f64), sync.hook());
      sync.finish();
      stats[r] = sync.last();
      for (const Var& p : m.parameters()) grads[r].push_back(p.grad().clone());
    });
  for (auto& t : threads) t.join();
  const auto rp = ref.parameters();
  REQUIRE(grads[0].size() == rp.size());
  for (size_t i = 0; i < rp.size(); ++i) {
    ffn::test::check_close(grads[0][i], rp[i].grad(), 1e-12, 1e-9, "rank 0 grad " + std::to_string(i));
    ffn::test::check_close(grads[1][i], grads[0][i], 0, 0, "ranks agree");
  }
  // Buckets hold parameters in reverse registration order (backward's order) and most of
  // them start reducing before backward ends.
  CHECK(layouts[0] == layouts[1]);
  CHECK(layouts[0].front().front() == "ln_f.bias");
  CHECK(layouts[0].back().back() == "wte.weight");
  CHECK(stats[0].buckets >= 4);
  CHECK(stats[0].launched_in_backward >= stats[0].buckets - 1);
  // The all-reduce sizes, in order, are the buckets' sizes on both ranks.
  CHECK(recorded_sizes(*group[0]) == recorded_sizes(*group[1]));
}

// Note [In-place gradient buckets]: reducing the gradients where backward left them gives
// the same bits as copying them into flat buffers first, one collective per parameter
// instead of one per bucket (on NCCL: one grouped launch per bucket).
TEST_CASE("GradSync: in-place buckets give the flat buckets' gradients") {
  const Tensor x = ids(4, 8, 0), y = ids(4, 8, 1);
  std::vector<std::vector<Tensor>> grads[2];  // [flat][rank]
  std::vector<int64_t> sizes[2];
  for (int flat = 0; flat < 2; ++flat) {
    auto group = make_thread_group(2);
    grads[flat].resize(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        Generator init(5);
        GPT m(small_gpt(), std::make_shared<Generator>(1), init);
        GradSync sync(m.named_parameters(), *group[r], 8 * 8 * 8 * 3, /*shard=*/false, flat);
        const Tensor xr = x.narrow(0, 2 * r, 2).contiguous();
        const Tensor yr = y.narrow(0, 2 * r, 2).contiguous();
        m.loss(xr, yr).backward(Tensor::full({}, 1.0, DType::f64), sync.hook());
        sync.finish();
        for (const Var& p : m.parameters()) grads[flat][r].push_back(p.grad().clone());
      });
    for (auto& t : threads) t.join();
    sizes[flat] = recorded_sizes(*group[0]);
  }
  for (int r = 0; r < 2; ++r) {
    REQUIRE(grads[0][r].size() == grads[1][r].size());
    for (size_t i = 0; i < grads[0][r].size(); ++i)
      ffn::test::check_close(grads[0][r][i], grads[1][r][i], 0, 0,
                             "rank " + std::to_string(r) + " grad " + std::to_string(i));
  }
  CHECK(sizes[0].size() == grads[0][0].size());  // in place: one all-reduce per parameter
  CHECK(sizes[1].size() < sizes[0].size());      // flat: one per bucket
  int64_t a = 0, b = 0;
  for (int64_t n : sizes[0]) a += n;
  for (int64_t n : sizes[1]) b += n;
  CHECK(a == b);
}

namespace {
// The copy-engine path on the CPU (Note [Copy-engine gradient reduction]): a thread-group
// rank whose _beside collectives go through gather_slots, with the group's all-gather standing
// in for NCCL's, and take their means in finish_beside (with `slots` false it reserves
// nothing, so GradSync uses the plain collectives); counts the buckets that took the slots.
class SlotComm final : public Comm {
 public:
  SlotComm(std::unique_ptr<Comm> inner, bool slots) : in_(std::move(inner)), slots_(slots) {}
  int rank() const override { return in_->rank(); }
  int world() const override { return in_->world(); }
  void all_reduce(Tensor& b, bool avg, const std::string& w) override {
    in_->all_reduce(b, avg, w);
  }
  void reduce_scatter(Tensor& b, bool avg, const std::string& w) override {
    in_->reduce_scatter(b, avg, w);
  }
  void all_gather(Tensor& b, const std::string& w) override { in_->all_gather(b, w); }
  void broadcast(Tensor& b, int root, const std::string& w) override { in_->broadcast(b, root, w); }
  void wait() override {}
  bool reserve_beside(const std::vector<std::pair<int64_t, int64_t>>& buckets) override {
    for (const auto& [bytes, parts] : buckets) reserved_.push_back(bytes + parts * 256);
    return slots_;
  }
  void all_reduce_beside(std::vector<Tensor>& bufs, bool avg, const std::string& w) override {
    gather(bufs, avg, w, false);
  }
  void reduce_scatter_beside(Tensor& buf, bool avg, const std::string& w) override {
    gather({buf}, avg, w, true);
  }
  void finish_beside() override {
    for (SlotBucket& b : means_) mean_slots(b, rank(), world());
    means_.clear();
  }
  int beside = 0;

 private:
  void gather(const std::vector<Tensor>& bufs, bool avg, const std::string& w, bool chunk) {
    REQUIRE(static_cast<size_t>(beside) < reserved_.size());
    const DType dt = bufs.at(0).dtype();
    const int64_t slot = reserved_[beside] / static_cast<int64_t>(dtype_size(dt)) + 1;
    // NaN-filled: a slot element the means should not read would show in the gradients.
    Tensor slots = Tensor::full({slot * world()}, std::nan(""), dt);
    SlotBucket b;
    CHECK(gather_slots(
        bufs, avg, chunk, slots, rank(), world(), [&](Tensor&) { in_->all_gather(slots, w); },
        nullptr, b));
    means_.push_back(std::move(b));
    ++beside;
  }
  std::unique_ptr<Comm> in_;
  bool slots_;
  std::vector<int64_t> reserved_;
  std::vector<SlotBucket> means_;
};
}  // namespace

namespace {
// One backward of small_gpt on `world` in-process ranks (rank r on rows 2r, 2r + 1 of x, y)
// through SlotComm (the copy-engine path when `slots`), GradSync sharded when `shard`;
// collect(r, sync, model) after finish(). Returns how many buckets rank 0 sent through the
// slots.
int slot_step(int world, bool slots, bool shard, const Tensor& x, const Tensor& y,
              const std::function<void(int, const GradSync&, GPT&)>& collect) {
  auto group = make_thread_group(world);
  std::vector<std::unique_ptr<SlotComm>> comms;
  for (int r = 0; r < world; ++r)
    comms.push_back(std::make_unique<SlotComm>(std::move(group[r]), slots));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Generator init(5);
      GPT m(small_gpt(), std::make_shared<Generator>(1), init);
      GradSync sync(m.named_parameters(), *comms[r], 8 * 8 * 8 * 3, shard);
      CHECK(sync.copy_engine() == slots);
      const Tensor xr = x.narrow(0, 2 * r, 2).contiguous();
      const Tensor yr = y.narrow(0, 2 * r, 2).contiguous();
      m.loss(xr, yr).backward(Tensor::full({}, 1.0, DType::f64), sync.hook());
      sync.finish();
      collect(r, sync, m);
    });
  for (auto& t : threads) t.join();
  return comms[0]->beside;
}
}  // namespace

// All buckets but the last take the copy-engine path, and its gradients are the all-reduce's:
// bit for bit on 2 ranks (f64: both sum the ranks in order; halving is exact), within one
// rounding on 3 (the thread group multiplies by 1/3, bucket_mean divides by 3).
TEST_CASE(
    "GradSync: buckets through slots (the copy-engine path) give the all-reduce's gradients") {
  for (int world : {2, 3}) {
    const Tensor x = ids(2 * world, 8, 0), y = ids(2 * world, 8, 1);
    std::vector<std::vector<Tensor>> grads[2];  // [slots][rank]
    int beside[2] = {0, 0}, buckets = 0;
    for (int slots = 0; slots < 2; ++slots) {
      grads[slots].resize(world);
      beside[slots] =
          slot_step(world, slots == 1, false, x, y, [&](int r, const GradSync& sync, GPT& m) {
            if (r == 0) buckets = static_cast<int>(sync.buckets());
            for (const Var& p : m.parameters()) grads[slots][r].push_back(p.grad().clone());
          });
    }
    CHECK(beside[0] == 0);
    CHECK(buckets >= 3);
    CHECK(beside[1] == buckets - 1);  // the last bucket: the all-reduce
    CHECK(grads[0][0].size() == grads[1][0].size());
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < grads[0][r].size(); ++i)
        ffn::test::check_close(grads[1][r][i], grads[0][r][i], 0, world == 2 ? 0.0 : 1e-15,
                               "world " + std::to_string(world) + " rank " + std::to_string(r) +
                                   " grad " + std::to_string(i));
  }
}

// ZeRO-1's reduce-scatter through the slots: each rank's chunk of every bucket but the last
// as the reduce-scatter leaves it (2 ranks: bit for bit; 3: within one rounding).
TEST_CASE("GradSync (ZeRO-1): chunks through slots equal the reduce-scatter's") {
  for (int world : {2, 3}) {
    const Tensor x = ids(2 * world, 8, 0), y = ids(2 * world, 8, 1);
    std::vector<std::vector<Tensor>> chunks[2];  // [slots][rank], one per bucket
    int beside = 0;
    for (int slots = 0; slots < 2; ++slots) {
      chunks[slots].resize(world);
      const int n_beside =
          slot_step(world, slots == 1, true, x, y, [&](int r, const GradSync& sync, GPT&) {
            for (size_t b = 0; b < sync.buckets(); ++b) {
              const int64_t n = sync.flat(b).numel() / world;
              chunks[slots][r].push_back(sync.flat(b).narrow(0, r * n, n).clone());
            }
          });
      if (slots) beside = n_beside;
    }
    CHECK(beside == static_cast<int>(chunks[1][0].size()) - 1);
    for (int r = 0; r < world; ++r)
      for (size_t b = 0; b < chunks[0][r].size(); ++b)
        ffn::test::check_close(chunks[1][r][b], chunks[0][r][b], 0, world == 2 ? 0.0 : 1e-15,
                               "world " + std::to_string(world) + " rank " + std::to_string(r) +
                                   " bucket " + std::to_string(b));
  }
}

TEST_CASE("2-rank data-parallel training (CPU, in-process group) tracks the 1-process run") {
  const fs::path root = fs::temp_directory_path() / ("ffn-dist-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto cfg = [&](const std::string& dir) {
    return Config::load(std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml",
                        {"run.dir=" + (root / dir).string(), "runtime.device=cpu", "train.iters=12",
                         "run.eval_every=6", "run.eval_iters=2", "train.batch_size=8",
                         "model.dropout=0.0"});
  };
  TrainOptions quiet;
  quiet.quiet = true;
  const TrainResult one = run_training(cfg("one"), quiet);
  auto group = make_thread_group(2);
  std::vector<TrainResult> res(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      TrainOptions o = quiet;
      o.comm = group[r].get();
      o.bucket_mb = 1;
      res[r] = run_training(cfg("two"), o);  // replicas are compared at every eval
    });
  for (auto& t : threads) t.join();
  CHECK(res[0].world == 2);
  CHECK(res[0].last_train_loss == res[1].last_train_loss);
  CHECK(res[0].last_train_loss == doctest::Approx(one.last_train_loss).epsilon(1e-4));
  CHECK(res[0].last_val_loss == doctest::Approx(one.last_val_loss).epsilon(1e-4));
  // Only rank 0 writes the run directory; its checkpoint records the world size.
  std::ifstream st(root / "two" / "ckpt-12" / "state.toml");
  std::stringstream ss;
  ss << st.rdbuf();
  CHECK(ss.str().find("world = 2") != std::string::npos);
  // Resuming with another world size is refused.
  TrainOptions resume = quiet;
  resume.resume = (root / "two").string();
  CHECK_THROWS_WITH_AS(run_training(cfg("two"), resume), doctest::Contains("same world size"),
                       Error);
  fs::remove_all(root);
}

TEST_CASE("2-rank resume is bit-exact: 6 + 6 iterations == 12 straight, dropout on") {
  const fs::path root = fs::temp_directory_path() / ("ffn-dres-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto cfg = [&](const std::string& dir) {
    return Config::load(std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml",
                        {"run.dir=" + (root / dir).string(), "runtime.device=cpu", "train.iters=12",
                         "run.eval_every=6", "run.eval_iters=2", "train.batch_size=8",
                         "model.dropout=0.1", "run.log_every=1"});
  };
  auto run2 = [&](const std::string& dir, int64_t stop_after, bool resume) {
    run_two_ranks(cfg(dir), stop_after, resume ? (root / dir).string() : "");
  };
  run2("a", 0, false);
  run2("b", 6, false);
  run2("b", 0, true);
  auto losses = [&](const std::string& dir) { return metric_lines(root / dir); };
  CHECK(losses("a").size() == 15);  // 12 train lines + 3 evals
  CHECK(losses("a") == losses("b"));
  for (const char* f : {"model.safetensors", "optim.safetensors"})
    CHECK_MESSAGE(slurp(root / "a" / "ckpt-12" / f) == slurp(root / "b" / "ckpt-12" / f), f);
  fs::remove_all(root);
}

TEST_CASE("ZeRO-1 slices: odd-size parameters split across ranks, every element once") {
  Generator init(1);
  GPT model(small_gpt(), std::make_shared<Generator>(1), init);
  const auto params = model.named_parameters();
  int64_t total = 0;
  for (const auto& [n, v] : params) total += v.value().numel();
  for (int world : {2, 3}) {
    CAPTURE(world);
    auto group = make_thread_group(world);
    std::map<std::string, std::vector<int>> hits;  // parameter → how often each element is owned
    for (const auto& [n, v] : params) hits[n].assign(static_cast<size_t>(v.value().numel()), 0);
    int64_t state = 0, split = 0, most = 0, least = total;
    for (int r = 0; r < world; ++r) {
      // 200-byte buckets: several per layer, most not a multiple of the world.
      GradSync sync(params, *group[r], 200, /*shard=*/true);
      ZeroShards z(sync, params, *group[r]);
      for (size_t b = 0; b < sync.buckets(); ++b) CHECK(sync.flat(b).numel() % world == 0);
      for (const auto& [name, var] : z.slices()) {
        const std::string param = name.substr(0, name.find('['));
        const int64_t from = std::stoll(name.substr(name.find('[') + 1));
        const int64_t n = var.value().numel();
        REQUIRE(hits.count(param));
        for (int64_t i = from; i < from + n; ++i) ++hits[param][static_cast<size_t>(i)];
        if (n < static_cast<int64_t>(hits[param].size())) ++split;
        // The slice is the parameter's own values, flat.
        const Tensor& p = std::find_if(params.begin(), params.end(),
                                       [&](const auto& q) { return q.first == param; })
                              ->second.value();
        CHECK(max_abs_diff(var.value(), p.reshape({p.numel()}).narrow(0, from, n)) == 0);
      }
      AdamW opt(z.slices(), AdamWOptions{});
      for (const auto& [n, t] : opt.state()) state += t.numel();
      most = std::max(most, z.owned_numel());
      least = std::min(least, z.owned_numel());
    }
    for (const auto& [n, h] : hits)
      CHECK_MESSAGE(std::all_of(h.begin(), h.end(), [](int c) { return c == 1; }), n);
    CHECK(split > 0);                // some parameters are cut between ranks
    CHECK(state == 2 * total);       // f64 parameters: exp_avg and exp_avg_sq, once over all ranks
    CHECK(most - least <= 64);       // chunks differ by at most one element per bucket
  }
  AdamWOptions bad;
  bad.decay = {true};
  CHECK_THROWS_WITH_AS(AdamW(params, bad), doctest::Contains("[adamw] decay has 1 entries"), Error);
}

TEST_CASE("ZeRO-1 on 2 and 3 ranks tracks plain data parallelism; resume across modes") {
  const fs::path root = fs::temp_directory_path() / ("ffn-zero-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto cfg = [&](const std::string& dir, int zero) {
    return Config::load(std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml",
                        {"run.dir=" + (root / dir).string(), "runtime.device=cpu", "train.iters=12",
                         "run.eval_every=6", "run.eval_iters=2", "train.batch_size=12",
                         "model.dropout=0.1", "run.log_every=1",
                         "train.zero=" + std::to_string(zero)});
  };
  auto run = [&](int world, const std::string& dir, int zero, int64_t stop_after, bool resume) {
    for (const std::string& e :
         run_ranks(world, cfg(dir, zero), stop_after, resume ? (root / dir).string() : ""))
      REQUIRE_MESSAGE(e.empty(), e);
  };
  // The same arithmetic per element; only the gradient norm is summed in another order.
  auto close = [&](const std::string& a, const std::string& b) {
    const std::vector<double> x = loss_values(root / a), y = loss_values(root / b);
    REQUIRE(x.size() == y.size());
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / std::abs(y[i]));
    CHECK_MESSAGE(worst < 1e-5, a, " vs ", b, ": ", worst);
  };
  for (int world : {2, 3}) {
    CAPTURE(world);
    const std::string w = std::to_string(world);
    run(world, "plain" + w, 0, 0, false);
    run(world, "zero" + w, 1, 0, false);
    REQUIRE(loss_values(root / ("plain" + w)).size() == 15);  // 12 train lines + 3 evals
    close("zero" + w, "plain" + w);
    // ZeRO resumed by ZeRO: bit for bit.
    run(world, "zz" + w, 1, 6, false);
    run(world, "zz" + w, 1, 0, true);
    CHECK(metric_lines(root / ("zz" + w)) == metric_lines(root / ("zero" + w)));
    for (const char* f : {"model.safetensors", "optim.safetensors"})
      CHECK_MESSAGE(slurp(root / ("zz" + w) / "ckpt-12" / f) == slurp(root / ("zero" + w) / "ckpt-12" / f), f);
  }
  // Gradient accumulation (Note [Gradient accumulation]): the summed micro-batches are what
  // gets reduce-scattered.
  auto accum = [&](const std::string& dir, int zero) {
    Config c = cfg(dir, zero);
    c.train.grad_accum_steps = 2;
    c.train.batch_size = 6;
    for (const std::string& e : run_ranks(2, c, 0, "")) REQUIRE_MESSAGE(e.empty(), e);
  };
  accum("plain-acc", 0);
  accum("zero-acc", 1);
  close("zero-acc", "plain-acc");
  // Across modes: the files are the same layout, so each resumes the other.
  run(2, "z2p", 1, 6, false);
  run(2, "z2p", 0, 0, true);
  run(2, "p2z", 0, 6, false);
  run(2, "p2z", 1, 0, true);
  close("z2p", "plain2");
  close("p2z", "plain2");
  fs::remove_all(root);
}

TEST_CASE("ZeRO-1: a non-finite step is skipped on every rank alike") {
  const fs::path root = fs::temp_directory_path() / ("ffn-zeronf-" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Config c = Config::load(
        std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml",
        {"run.dir=" + (root / std::to_string(world)).string(), "runtime.device=cpu",
         "train.batch_size=12", "train.zero=1", "train.lr=1e30", "train.min_lr=1",
         "train.warmup=0", "train.max_nonfinite=2", "train.iters=50", "run.log_every=1"});
    const std::vector<std::string> errors = run_ranks(world, c, 0, "");
    for (const std::string& e : errors) {
      CHECK_MESSAGE(e.find("2 steps in a row had a non-finite") != std::string::npos, e);
      CHECK(e.substr(0, e.find(':')) == errors[0].substr(0, errors[0].find(':')));  // same iter
    }
  }
  fs::remove_all(root);
}

TEST_CASE("--profile-comm: a step splits into compute, exposed communication, optimizer, idle") {
  // Three steps 10 ms apart; the backward ends 6 ms in, the last bucket 1.5 ms later.
  std::vector<CommEvent> ev;
  for (int64_t k = 1; k <= 4; ++k) {
    const double t = 10.0 * static_cast<double>(k);
    auto point = [&](const char* w, double at) { ev.push_back({k, w, 0, t + at, t + at, t + at}); };
    point("step", 0);
    ev.push_back({k, "gradient bucket 0", 1 << 20, t + 2, t + 2.5, t + 3.5});  // before backward ends
    ev.push_back({k, "gradient bucket 1", 2 << 20, t + 5, t + 5.5, t + 7.5});   // half after it
    point("backward", 6.5);
    ev.push_back({k, "loss", 4, t + 6.5, t + 7.5, t + 7.6});
    point("synced", 8);
    point("optimizer", 9);
  }
  const CommProfile p = summarize_comm_profile(ev, 1);
  CHECK(p.steps == 2);  // step 1 skipped, step 4 has no successor
  CHECK(p.step_ms == doctest::Approx(10));
  CHECK(p.compute_ms == doctest::Approx(6.5));
  CHECK(p.exposed_ms == doctest::Approx(1.5));
  CHECK(p.optimizer_ms == doctest::Approx(1));
  CHECK(p.idle_ms == doctest::Approx(1));
  REQUIRE(p.collectives.size() == 3);
  CHECK(p.collectives[0].what == "gradient bucket 0");
  CHECK(p.collectives[0].overlap == doctest::Approx(1));
  CHECK(p.collectives[1].bytes == (2 << 20));
  CHECK(p.collectives[1].start_ms == doctest::Approx(5.5));
  CHECK(p.collectives[1].overlap == doctest::Approx(0.5));
  CHECK(p.collectives[2].overlap == doctest::Approx(0));
  const std::string text = format_comm_profile(p);
  CHECK(text.find("step 10.00 ms = forward+backward 6.50 + exposed communication 1.50") !=
        std::string::npos);
  CHECK(text.find("gradient bucket 1") != std::string::npos);
  // A step without all four points is left out; nothing complete says so.
  CHECK(summarize_comm_profile({ev.begin(), ev.begin() + 3}, 0).steps == 0);
  CHECK(format_comm_profile(CommProfile{}).find("no complete step") != std::string::npos);
}

TEST_CASE("collective watchdog: fires once, only while collectives are pending and the host is silent") {
  using namespace std::chrono_literals;
  std::atomic<int> fires{0};
  std::string what;
  {
    Watchdog w(1.0, [&](const std::string& oldest, int64_t step, double idle) {
      what = oldest + " of step " + std::to_string(step);
      CHECK(idle > 1.0);
      ++fires;
    });
    for (int i = 0; i < 30; ++i) {  // progress every 50 ms keeps it quiet
      w.progress(1, "gradient bucket 0", 7);
      std::this_thread::sleep_for(50ms);
    }
    CHECK(fires == 0);
    w.progress(0, "", 0);  // nothing pending: quiet however long
    std::this_thread::sleep_for(2000ms);
    CHECK(fires == 0);
    w.progress(2, "loss", 9);  // pending and silent
    for (int i = 0; i < 60 && fires == 0; ++i) std::this_thread::sleep_for(50ms);
    CHECK(fires == 1);
    CHECK(w.fired());
    std::this_thread::sleep_for(1500ms);
    CHECK(fires == 1);  // once
  }
  CHECK(what == "loss of step 9");
  CHECK_THROWS_WITH_AS(Watchdog(0, [](const std::string&, int64_t, double) {}),
                       doctest::Contains("[watchdog] the limit must be > 0 s"), Error);
}

TEST_CASE("rendezvous under torchrun: MASTER_PORT is torchrun's store, ours is the next port") {
  // What torchrun's agent does: hold MASTER_PORT with a listening socket.
  const int port = 31000 + static_cast<int>(::getpid() % 2000);
  const int store = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  REQUIRE(::bind(store, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(store, 4) == 0);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TORCHELASTIC_RUN_ID", "job7", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  ::unsetenv("FFN_RUN_NONCE");
  ::unsetenv("FFN_RDZV_PORT");
  const DistEnv base = dist_env_from_environment();
  CHECK(base.master_port == port + 1);
  CHECK(base.nonce == "job7/2");
  std::vector<std::string> got(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      DistEnv e = base;
      e.rank = r, e.world = 2;
      got[r] = rendezvous(e, r == 0 ? "nccl-id" : "", 20);
    });
  for (auto& t : ts) t.join();
  CHECK(got == std::vector<std::string>{"nccl-id", "nccl-id"});
  ::setenv("FFN_RDZV_PORT", "4242", 1);
  CHECK(dist_env_from_environment().master_port == 4242);
  for (const char* v : {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "FFN_RDZV_PORT"})
    ::unsetenv(v);
  ::close(store);
}

TEST_CASE("rendezvous hands rank 0's payload to every rank; stale nonce and missing peers fail") {
  const int port = 29000 + static_cast<int>(::getpid() % 2000);
  auto env = [&](int rank, int world, const std::string& nonce, int p) {
    DistEnv e;
    e.rank = rank, e.world = world, e.nonce = nonce, e.master_port = p;
    return e;
  };
  std::vector<std::string> got(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] { got[r] = rendezvous(env(r, 3, "n1", port), r == 0 ? "the-id" : "", 20); });
  for (auto& t : ts) t.join();
  CHECK(got == std::vector<std::string>{"the-id", "the-id", "the-id"});
  // A peer from another run (other nonce) is rejected; rank 0 then times out naming rank 1.
  std::string r0_error, r1_error;
  std::thread t0([&] {
    try {
      rendezvous(env(0, 2, "new", port + 1), "id", 3);
    } catch (const Error& e) {
      r0_error = e.what();
    }
  });
  std::thread t1([&] {
    try {
      rendezvous(env(1, 2, "old", port + 1), "", 3);
    } catch (const Error& e) {
      r1_error = e.what();
    }
  });
  t0.join();
  t1.join();
  CHECK_MESSAGE(r1_error.find("rejected rank 1: stale or foreign run") != std::string::npos, r1_error);
  CHECK_MESSAGE(r0_error.find("timed out after 3 s") != std::string::npos, r0_error);
  CHECK(r0_error.find("waiting for rank(s) 1 of 2") != std::string::npos);
}
