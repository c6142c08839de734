// train/programs/ffn_sample.cpp — `ffn-sample RUN_DIR --prompt TEXT --tokens N`: generate text from
// a character-level run's latest checkpoint (or a given ckpt-* directory).
//
// Sampling: softmax(logits / temperature) restricted to the top-k tokens, drawn from a
// seeded Philox stream, one token at a time over the last `context` tokens; temperature 0
// is greedy decoding (the most likely token, the lowest id on a tie).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/philox.h"
#include "layers/transformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/programs/cli_checks.h"
#include "train/trainer.h"

using namespace ffn;
namespace fs = std::filesystem;

namespace {

// Appends `tokens` sampled characters to `ids`, printing each as it comes: softmax over the
// last position's logits at `temperature`, among the top_k most likely (0: all), with
// Philox(seed) draws so a seed gives the same text.
void sample(GPT& model, const GptConfig& g, const std::vector<uint8_t>& vocab,
            std::vector<int32_t>& ids, int64_t tokens, double temperature, int64_t top_k,
            uint64_t seed, Device dev) {
  NoGradGuard ng;
  for (int64_t n = 0; n < tokens; ++n) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(ids.size()), g.context);
    std::vector<double> window(ids.end() - t, ids.end());
    const Tensor x = Tensor::from_vector(window, {1, t}, DType::i32, dev);
    const Var h = model.hidden(x);
    const Tensor last = h.value().reshape({t, g.d_model}).narrow(0, t - 1, 1);
    const Var logits = fn::linear(Var(last), model.head_weight(), Var());
    std::vector<double> l = logits.value().to_vector();
    l.resize(static_cast<size_t>(g.vocab_size));  // never a padding row (Note [Padded vocabulary])
    if (temperature == 0.0) {
      const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      ids.push_back(next);
      std::fputs(train::decode_chars(vocab, {next}).c_str(), stdout);
      std::fflush(stdout);
      continue;
    }
    std::vector<double> sorted = l;
    std::sort(sorted.rbegin(), sorted.rend());
    const double cut = top_k > 0 && top_k < static_cast<int64_t>(l.size()) ? sorted[top_k - 1]
                                                                            : -INFINITY;
    double mx = sorted[0], sum = 0;
    for (double& v : l) sum += (v = v >= cut ? std::exp((v - mx) / temperature) : 0.0);
    const U32x4 r = philox_block(seed, 1, static_cast<uint64_t>(n));
    double u = (static_cast<double>(r.v[0]) + 0.5) / 4294967296.0 * sum;
    int32_t next = 0;
    for (size_t j = 0; j < l.size(); ++j) {
      u -= l[j];
      if (u <= 0 && l[j] > 0) {
        next = static_cast<int32_t>(j);
        break;
      }
      if (l[j] > 0) next = static_cast<int32_t>(j);
    }
    ids.push_back(next);
    std::fputs(train::decode_chars(vocab, {next}).c_str(), stdout);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ffn-sample: generate text from a trained character-level fused-ffn run.",
               "ffn-sample"};
  std::string run, prompt = "\n", device = "auto";
  int64_t tokens = 200, top_k = 0;
  double temperature = 0.8;
  uint64_t seed = 1;
  app.add_option("run", run, "Run directory (uses its latest checkpoint) or a ckpt-* directory")
      ->required();
  app.add_option("--prompt", prompt, "Text to continue (default: a newline)");
  app.add_option("--tokens", tokens, "How many tokens to generate")
      ->check(train::integer_at_least(1));
  app.add_option("--temperature", temperature, "Softmax temperature (0: greedy, the most likely token)")
      ->check(train::number_at_least(0.0));
  app.add_option("--top-k", top_k, "Sample among the k most likely tokens only (0: all)")
      ->check(train::integer_at_least(0));
  app.add_option("--seed", seed, "Sampling seed");
  app.add_option("--device", device, "auto | cpu | cuda[:N]");
  return train::run_program(app, argc, argv, "ffn-sample", /*newline=*/true,
                            [&]() -> int {
    const std::string dir = train::resolve_checkpoint(run);
    const train::TrainState st = train::read_train_state(dir);
    const train::Config cfg = train::Config::load((fs::path(dir) / "config.toml").string());
    if (st.vocab.empty())
      throw Error("[ffn-sample] '" + dir + "' was trained on token files; sampling text needs a "
                  "character-level run (data.kind = \"text\" or \"synthetic\")",
                  ErrorKind::config);
    const Device dev = resolve_device_spec(device, "--device");
    const int64_t vocab =
        cfg.model.vocab_size ? cfg.model.vocab_size : static_cast<int64_t>(st.vocab.size());
    GptConfig g = train::gpt_config(cfg, vocab, dev,
                                    train::compute_dtype(train::Precision::automatic, dev));
    g.dropout = 0.0f;  // eval only
    Generator init(0);
    GPT model(g, std::make_shared<Generator>(0), init);
    model.eval();
    train::load_tensors_into((fs::path(dir) / "model.safetensors").string(),
                             model.stored_view(train::values_of(model.named_parameters())),
                             /*allow_cast=*/true);
    std::vector<int32_t> ids = train::encode_chars(st.vocab, prompt);
    FFN_CHECK(!ids.empty(), "[ffn-sample] the prompt is empty");
    std::fputs(prompt.c_str(), stdout);
    sample(model, g, st.vocab, ids, tokens, temperature, top_k, seed, dev);
    std::fputs("\n", stdout);
    return 0;
  });
}
