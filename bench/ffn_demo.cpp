// bench/ffn_demo.cpp — `ffn-demo`: one FFN layer learning a teacher, no config needed; a
// quick end-to-end check of the fused FeedForward forward/backward and SGD on any device.
//
// Trains a student FFN (plain GELU, GEGLU or SwiGLU) to imitate a fixed random teacher
// FFN of the same shape on fresh N(0, 1) inputs every step (SGD with momentum, MSE),
// and reports training and held-out loss with progress and ETA. Real training: the
// held-out loss must fall, and the run fails (exit 1) if it turns non-finite.
// Runs on the GPU when there is one (--device auto), else on the CPU.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>
#include <memory>

#include "layers/layers.h"
#include "optim/sgd.h"

using namespace ffn;

namespace {

struct Options {
  std::string device = "auto";
  FfnKind ffn = FfnKind::gelu;
  std::string dtype = "f32";
  int64_t d_model = 64, hidden = 256, batch = 512;
  int steps = 2000, log_every = 100;
  double lr = 0.05, momentum = 0.9;
  float dropout = 0.0f;
  uint64_t seed = 1;
};


double eval_loss(FeedForward& student, FeedForward& teacher, const Tensor& x) {
  NoGradGuard ng;
  student.eval();
  const Tensor target = teacher.forward(Var(x)).value();
  const double l = fn::mse_loss(student.forward(Var(x)), target).value().item();
  student.train();
  return l;
}

int run(const Options& o) {
  const Device dev = resolve_device_spec(o.device, "--device");
  const DType dt = parse_dtype(o.dtype);
  if (is_half(dt) && dev.is_cpu())
    throw Error("[ffn-demo] --dtype " + o.dtype + " needs a GPU (the CPU path computes in f32/f64)",
                ErrorKind::config);
  FeedForwardOptions fo{.d_model = o.d_model,
                        .hidden = o.hidden,
                        .act = ffn_activation(o.ffn).act,
                        .gated = ffn_activation(o.ffn).gated,
                        .dropout = o.dropout,
                        .place = {dt, dev}};
  auto rng = std::make_shared<Generator>(o.seed);
  FeedForward teacher(fo, rng), student(fo, rng);
  teacher.eval();
  Generator data(o.seed + 1);
  const Tensor x_val = Tensor::randn({4096, o.d_model}, data, dt, dev);
  SGD sgd(student.parameters(), {.lr = o.lr, .momentum = o.momentum});

  std::printf(
      "ffn-demo: %s FFN d_model=%lld hidden=%lld (%lld parameters, %s), batch %lld, %d steps on "
      "%s\n",
      name_of(kFfnKindNames, o.ffn), static_cast<long long>(o.d_model), static_cast<long long>(o.hidden),
      static_cast<long long>(student.num_parameters()), dtype_name(dt),
      static_cast<long long>(o.batch), o.steps, dev.str().c_str());
  const double val0 = eval_loss(student, teacher, x_val);
  std::printf("step %5d  val_loss %.6f\n", 0, val0);
  const auto t0 = std::chrono::steady_clock::now();
  double val = val0;
  for (int step = 1; step <= o.steps; ++step) {
    const Tensor x = Tensor::randn({o.batch, o.d_model}, data, dt, dev);
    Tensor target;
    {
      NoGradGuard ng;
      target = teacher.forward(Var(x)).value();
    }
    sgd.zero_grad();
    Var loss = fn::mse_loss(student.forward(Var(x)), target);
    loss.backward();
    sgd.step();
    if (step % o.log_every == 0 || step == o.steps) {
      const double l = loss.value().item();
      val = eval_loss(student, teacher, x_val);
      FFN_CHECK(std::isfinite(l) && std::isfinite(val),
                "[ffn-demo] loss became non-finite at step ", step, " (train ", l, ", val ", val,
                "); try a smaller --lr");
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %5d  train_loss %.6f  val_loss %.6f  %6.1f steps/s  ETA %5.1f s\n", step, l,
                  val, step / secs, (o.steps - step) * secs / step);
      std::fflush(stdout);
    }
  }
  std::printf("held-out loss fell from %.6f to %.6f (%.1fx lower)\n", val0, val, val0 / val);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "ffn-demo: train a fused FFN to imitate a random teacher FFN. Uses the GPU when there "
      "is one."};
  app.add_option("--device", o.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  std::vector<std::string> ffn_names;
  for (const auto& e : kFfnKindNames) ffn_names.push_back(e.name);
  std::string ffn_name = "gelu";
  app.add_option("--ffn", ffn_name, "FFN type, as model.ffn in configs")
      ->check(CLI::IsMember(ffn_names))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "f32, or bf16/f16 on a GPU (fp32 master weights)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--d-model", o.d_model, "Model width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width h")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", o.batch, "Rows per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Training steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "Steps between progress lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")
      ->check(CLI::Range(1e-9, 10.0))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  app.add_option("--dropout", o.dropout, "Dropout on the hidden activation")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of weights and data")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.ffn = *value_of(kFfnKindNames, ffn_name);
  try {
    return run(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "ffn-demo: error: %s\n", e.what());
    return e.kind() == ErrorKind::config ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ffn-demo: unexpected error: %s\n", e.what());
    return 1;
  }
}
